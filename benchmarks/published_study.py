"""Predictions of the LightLLM engine model for the whole published study, one table.

Every published scenario definition (../shared/calibration/published-h100.md: burst/long-first,
interleaved, sustained, long-then-stream, overload, low-load) x budget 1024 and 4096 x normal mode
and 1P1D x LightLLM's three strategies (default, promote_shortest, hrrn), simulated with
``mode="lightllm"`` and 12 chat-template tokens per prompt, chunk size = budget (the published
``batch_max_tokens = chunked_prefill_size``). Poisson scenarios run 5 rounds (seeds 0-4, as the
study's 5 measured rounds) and report the median of the per-round figures; the uniform ones
(long-first, interleaved) are deterministic and run once.

    python benchmarks/published_study.py [--rounds 5] [--json benchmarks/results/published_study.json]
                                         [--write-docs docs/compare.md] [--chunk-size N] [--gate]

``--write-docs`` replaces the table between the ``published-study`` markers of the given file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from prefillq.metrics import relative_change
from prefillq.sim import simulate
from prefillq.workload import scenario

SCENARIOS = ("long-first", "interleaved", "sustained", "long-then-stream", "overload", "low-load")
BUDGETS = (1024, 4096)
TOPOLOGIES = ("mixed", "1p1d")
POLICIES = ("default", "promote_shortest", "hrrn")
METRICS = ("short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "long_e2e_p95_ms", "short_tpot_p50_ms",
           "short_e2e_p95_ms", "output_tokens_per_s")
TEMPLATE_TOKENS = 12
BEGIN = "<!-- published-study:begin -->"
END = "<!-- published-study:end -->"


def run_cell(name: str, budget: int, topology: str, policy: str, rounds: int,
             options: dict[str, Any]) -> dict[str, float]:
    """Median over rounds of each metric of one (scenario, budget, topology, policy)."""
    seeds = range(rounds) if scenario(name).params.get("arrival") != "uniform" else range(1)
    per_round = []
    for seed in seeds:
        result = simulate(scenario(name, seed=seed), policy, mode="lightllm", budget=budget, topology=topology,
                          template_tokens=TEMPLATE_TOKENS, **options)
        per_round.append(result.summary)
    return {key: statistics.median(s[key] for s in per_round) for key in METRICS if per_round[0].get(key) is not None}


def run_study(rounds: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in SCENARIOS:
        for budget in BUDGETS:
            for topology in TOPOLOGIES:
                for policy in POLICIES:
                    rows.append({"scenario": name, "budget": budget, "topology": topology, "policy": policy,
                                 **run_cell(name, budget, topology, policy, rounds, options)})
    return rows


def _change(row: dict[str, Any], base: dict[str, Any], key: str) -> str:
    if row is base:
        return ""
    return f" ({relative_change(row[key], base[key]) * 100:+.0f}%)"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: one line per cell, the improved rows with their change against default."""
    lines = ["| scenario | budget | topology | policy | short TTFT p50 / p95 (ms) | long E2E p95 (s) "
             "| output tok/s | short TPOT p50 (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    base: dict[str, Any] = {}
    for row in rows:
        if row["policy"] == "default":
            base = row
        ttft = (f"{row['short_ttft_p50_ms']:,.0f} / {row['short_ttft_p95_ms']:,.0f}"
                f"{_change(row, base, 'short_ttft_p95_ms')}")
        e2e = f"{row['long_e2e_p95_ms'] / 1000:.2f}{_change(row, base, 'long_e2e_p95_ms')}"
        tput = f"{row['output_tokens_per_s']:,.0f}{_change(row, base, 'output_tokens_per_s')}"
        tpot = f"{row['short_tpot_p50_ms']:.1f}{_change(row, base, 'short_tpot_p50_ms')}"
        topology = "1P1D" if row["topology"] == "1p1d" else "normal"
        lines.append(f"| {row['scenario']} | {row['budget']} | {topology} | {row['policy']} | {ttft} | {e2e} "
                     f"| {tput} | {tpot} |")
    return "\n".join(lines)


def write_docs(path: Path, table: str, header: str) -> None:
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: {path} has no {BEGIN} ... {END} block")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    path.write_text(f"{before}{BEGIN}\n{header}\n\n{table}\n{END}{after}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/published_study.json"))
    parser.add_argument("--write-docs", type=Path, default=None)
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="chunked_prefill_size (default: the budget, as the published 1024 runs)")
    parser.add_argument("--gate", action="store_true", help="apply the router's ok_prefill rule")
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit("error: --rounds must be >= 1")
    options: dict[str, Any] = {}
    if args.chunk_size is not None:
        options["chunk_size"] = args.chunk_size
    if args.gate:
        options["prefill_token_gate"] = True
    start = time.perf_counter()
    rows = run_study(args.rounds, options)
    wall = time.perf_counter() - start
    table = markdown(rows)
    print(table)
    print(f"\n{len(rows)} cells in {wall:.1f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rounds": args.rounds, "options": options, "template_tokens": TEMPLATE_TOKENS,
                                     "profile": "h100-qwen3.5-0.8b", "rows": rows}, indent=1), encoding="utf-8")
    if args.write_docs is not None:
        header = (f"Generated by `python benchmarks/published_study.py --write-docs docs/compare.md` "
                  f"(mode lightllm, profile h100-qwen3.5-0.8b, {TEMPLATE_TOKENS} template tokens, chunk = "
                  f"{'budget' if args.chunk_size is None else args.chunk_size}, "
                  f"median of {args.rounds} seeds for Poisson scenarios; % vs default of the same block).")
        write_docs(args.write_docs, table, header)


if __name__ == "__main__":
    main()
