"""How fast is the simulator? Simulated requests per wall second and simulated time per wall second.

Runs both halves of the published study (../shared/calibration/published-h100.md), once per engine mode:

* normal ("mixed") mode: scenarios burst (long-first), sustained, long-then-stream, overload and
  low-load x budgets 1024 and 4096 x policies default, promote_shortest and hrrn;
* 1P1D (one prefill + one decode node): long-then-stream and overload x the same budgets and
  policies (12 combinations),

each for 5 measured rounds (seeds 0-4). The published study measured 320,640 requests in all (24
experiments); its scenario sizes are not all published, so the script extrapolates that study's wall
time from the measured cost per request of each half, counting half the requests in each.

    python benchmarks/sim_speed.py [--rounds 5] [--modes vllm,lightllm] [--out benchmarks/results/sim_speed.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prefillq.sim import simulate
from prefillq.workload import scenario

SCENARIOS = ("long-first", "sustained", "long-then-stream", "overload", "low-load")
PD_SCENARIOS = ("long-then-stream", "overload")
BUDGETS = (1024, 4096)
POLICIES = ("default", "promote_shortest", "hrrn")
PUBLISHED_STUDY_REQUESTS = 320_640
HALVES = (("mixed", SCENARIOS), ("1p1d", PD_SCENARIOS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="vllm,lightllm")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_speed.json"))
    args = parser.parse_args()
    console = Console()
    rows = []
    totals: dict[str, dict[str, float]] = {}
    for mode in args.modes.split(","):
        halves: dict[str, dict[str, float]] = {}
        for topology, scenarios in HALVES:
            half = {"requests": 0, "wall_s": 0.0, "sim_s": 0.0}
            for name in scenarios:
                for budget in BUDGETS:
                    requests = 0
                    wall = 0.0
                    sim_time = 0.0
                    for seed in range(args.rounds):
                        workload = scenario(name, seed=seed)
                        for policy in POLICIES:
                            start = time.perf_counter()
                            result = simulate(workload, policy, budget=budget, mode=mode, topology=topology,
                                              template_tokens=12 if mode == "lightllm" else 0)
                            wall += time.perf_counter() - start
                            requests += len(result.records)
                            sim_time += result.sim_time_s
                    rows.append({"mode": mode, "topology": topology, "scenario": name, "budget": budget,
                                 "runs": args.rounds * len(POLICIES), "requests": requests, "wall_s": wall,
                                 "sim_s": sim_time, "requests_per_s": requests / wall,
                                 "sim_per_wall": sim_time / wall})
                    half["requests"] += requests
                    half["wall_s"] += wall
                    half["sim_s"] += sim_time
            half["requests_per_s"] = half["requests"] / half["wall_s"]
            half["sim_per_wall"] = half["sim_s"] / half["wall_s"]
            halves[topology] = half
        each = PUBLISHED_STUDY_REQUESTS / 2
        estimate = sum(each * h["wall_s"] / h["requests"] for h in halves.values())
        totals[mode] = {"requests": sum(h["requests"] for h in halves.values()),
                        "wall_s": sum(h["wall_s"] for h in halves.values()),
                        "halves": halves, "full_study_estimate_s": estimate}

    table = Table(title=f"simulator speed (one row = {args.rounds} rounds x {len(POLICIES)} policies)")
    for column in ("mode", "topology", "scenario", "budget", "requests", "wall s", "req/s", "sim s / wall s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["mode"], row["topology"], row["scenario"], str(row["budget"]), f"{row['requests']:,}",
                      f"{row['wall_s']:.2f}", f"{row['requests_per_s']:,.0f}", f"{row['sim_per_wall']:,.0f}")
    console.print(table)
    for mode, total in totals.items():
        parts = "; ".join(f"{topology}: {h['requests']:,} requests in {h['wall_s']:.2f} s "
                          f"({h['requests_per_s']:,.0f} req/s, {h['sim_per_wall']:,.0f}x real time)"
                          for topology, h in total["halves"].items())
        console.print(f"[bold]{mode}[/bold]: {parts}; full published study ({PUBLISHED_STUDY_REQUESTS:,} requests, "
                      f"half per topology): ~{total['full_study_estimate_s']:.1f} s (target < 60 s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                                    "rounds": args.rounds, "rows": rows, "totals": totals}, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
