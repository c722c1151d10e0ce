"""How fast is the simulator? Simulated requests per wall second and simulated time per wall second.

Runs the normal-mode ("mixed") half of the published study: scenarios burst (long-first), sustained,
long-then-stream, overload and low-load x budgets 1024 and 4096 x policies default, promote_shortest
and hrrn x 5 measured rounds (seeds 0-4), once per engine mode. The published study also had a 1P1D
half (one prefill + one decode node; 24 experiments, 320,640 measured requests in all); 1P1D is not
simulated yet, so the script extrapolates the full study's wall time from the measured cost per
request, counting a 1P1D request as twice a mixed one (two nodes step per request).

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
BUDGETS = (1024, 4096)
POLICIES = ("default", "promote_shortest", "hrrn")
PUBLISHED_STUDY_REQUESTS = 320_640


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
        mode_requests = 0
        mode_wall = 0.0
        mode_sim = 0.0
        for name in SCENARIOS:
            for budget in BUDGETS:
                requests = 0
                wall = 0.0
                sim_time = 0.0
                for seed in range(args.rounds):
                    workload = scenario(name, seed=seed)
                    for policy in POLICIES:
                        start = time.perf_counter()
                        result = simulate(workload, policy, budget=budget, mode=mode,
                                          template_tokens=12 if mode == "lightllm" else 0)
                        wall += time.perf_counter() - start
                        requests += len(result.records)
                        sim_time += result.sim_time_s
                rows.append({"mode": mode, "scenario": name, "budget": budget, "runs": args.rounds * len(POLICIES),
                             "requests": requests, "wall_s": wall, "sim_s": sim_time,
                             "requests_per_s": requests / wall, "sim_per_wall": sim_time / wall})
                mode_requests += requests
                mode_wall += wall
                mode_sim += sim_time
        per_request = mode_wall / mode_requests
        # mixed half measured; 1P1D half extrapolated at twice the cost per request
        half = PUBLISHED_STUDY_REQUESTS / 2
        totals[mode] = {"requests": mode_requests, "wall_s": mode_wall, "sim_s": mode_sim,
                        "requests_per_s": mode_requests / mode_wall, "sim_per_wall": mode_sim / mode_wall,
                        "full_study_estimate_s": half * per_request + half * 2 * per_request}

    table = Table(title="simulator speed (measured: mixed mode; one row = 5 rounds x 3 policies)")
    for column in ("mode", "scenario", "budget", "requests", "wall s", "req/s", "sim s / wall s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["mode"], row["scenario"], str(row["budget"]), f"{row['requests']:,}",
                      f"{row['wall_s']:.2f}", f"{row['requests_per_s']:,.0f}", f"{row['sim_per_wall']:,.0f}")
    console.print(table)
    for mode, total in totals.items():
        console.print(f"[bold]{mode}[/bold]: {total['requests']:,} requests in {total['wall_s']:.2f} s wall "
                      f"({total['requests_per_s']:,.0f} req/s, {total['sim_per_wall']:,.0f}x real time); "
                      f"full published study ({PUBLISHED_STUDY_REQUESTS:,} requests, 1P1D half extrapolated "
                      f"at 2x): ~{total['full_study_estimate_s']:.1f} s (target < 60 s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                                    "rounds": args.rounds, "rows": rows, "totals": totals}, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
