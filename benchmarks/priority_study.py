"""Two priority classes on one simulated vLLM engine (issue 29): what strict tiers buy the interactive class
and what they cost the batch class.

Workload: the ``sustained`` scenario (Poisson arrivals, 25% long 8K prompts, 128-token short prompts, 128
output tokens) with ``interactive_share=0.2``: 20% of all requests are interactive (short, priority 0), the
other 80% batch (the remaining short and every long request, priority 1). Two loads: normal (30 req/s) and
heavy (60 req/s, the scenario's own rate). Rows:

* stock FCFS: ``--scheduling-policy fcfs``, policy ``default`` (the classes are ignored);
* stock priority: ``--scheduling-policy priority``, ``default`` (vLLM's own priority heap and preemption);
* priority + auto: ``--scheduling-policy priority`` with ``auto`` (ordered partial prefills) inside each tier.

Figures (medians over ``--seeds`` seeds, default profile): interactive short TTFT P95, batch short and long
TTFT P95, batch TTFT P95 (all its requests), output tokens/s, preemptions.

    nice python benchmarks/priority_study.py [--seeds 3] [--duration 8] [--json benchmarks/results/priority_study.json]

Prints one markdown table and writes every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from prefillq.config import parse_policy_spec
from prefillq.sim import simulate
from prefillq.workload import scenario

LOADS = (("normal", 30.0), ("heavy", 60.0))
ROWS = (("stock FCFS", "fcfs", "default"), ("stock priority", "priority", "default"),
        ("priority + auto", "priority", "auto:partial_prefills=ordered"))
FIGURES = {
    "interactive_short_ttft_p95_ms": "priority_0_short_ttft_p95_ms",
    "batch_short_ttft_p95_ms": "priority_1_short_ttft_p95_ms",
    "batch_long_ttft_p95_ms": "priority_1_long_ttft_p95_ms",
    "batch_ttft_p95_ms": "priority_1_ttft_p95_ms",
    "output_tokens_per_s": "output_tokens_per_s",
}


def run_cell(rate: float, scheduling_policy: str, policy: str, seed: int, duration_s: float) -> dict[str, Any]:
    workload = scenario("sustained", seed=seed, rate=rate, duration_s=duration_s, interactive_share=0.2)
    result = simulate(workload, parse_policy_spec(policy)[1], scheduling_policy=scheduling_policy)
    cell = {name: result.summary[key] for name, key in FIGURES.items()}
    cell["preemptions"] = result.preemptions
    cell["requests"] = len(workload.requests)
    return cell


def study(seeds: int, duration_s: float) -> list[dict[str, Any]]:
    rows = []
    for load, rate in LOADS:
        for label, scheduling_policy, policy in ROWS:
            cells = [run_cell(rate, scheduling_policy, policy, seed, duration_s) for seed in range(seeds)]
            medians = {key: statistics.median(c[key] for c in cells) for key in cells[0]}
            rows.append({"load": load, "rate": rate, "row": label, "scheduling_policy": scheduling_policy,
                         "policy": policy, **medians, "per_seed": cells})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| load | row | interactive short TTFT P95 (ms) | batch short TTFT P95 (ms) | batch long TTFT P95 (ms) "
            "| batch TTFT P95 (ms) | output tok/s | preemptions |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['load']} ({r['rate']:g}/s) | {r['row']} | {r['interactive_short_ttft_p95_ms']:,.0f} | "
                     f"{r['batch_short_ttft_p95_ms']:,.0f} | {r['batch_long_ttft_p95_ms']:,.0f} | "
                     f"{r['batch_ttft_p95_ms']:,.0f} | {r['output_tokens_per_s']:,.0f} | {r['preemptions']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per run")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/priority_study.json"))
    args = parser.parse_args()
    rows = study(args.seeds, args.duration)
    print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"seeds": args.seeds, "duration_s": args.duration, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
