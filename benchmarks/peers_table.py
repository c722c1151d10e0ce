"""The table in docs/peers.md: every peer emulation beside default and auto, per workload and engine mode.

``prefillq compare --policies peers`` (default, auto and the four emulated engine options) on each published
scenario and both bundled Azure samples, in vLLM and LightLLM mode, each mode at its default profile and
budget; scenarios as the median of ``REPEATS`` seeds (a trace is replayed once: nothing in it is random).
Per cell: short-request TTFT P95 of every row, and each row's long-request TTFT P95 change vs
default. A peer cell is marked where the peer beats auto's short TTFT P95; the JSON lists those cells
with their long TTFT and throughput cost beside auto's.

    nice python benchmarks/peers_table.py [--json benchmarks/results/peers_table.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefillq.sim.compare import CompareSettings, prepare_comparison

SCENARIOS = ("long-first", "interleaved", "sustained", "long-then-stream", "overload", "low-load", "multi-turn")
# The Azure samples as the README replays one: ten minutes of the trace, three times faster (a busy engine).
TRACES = {"azure-conv": {"duration_s": 600.0, "rate_scale": 3.0},
          "azure-code": {"duration_s": 600.0, "rate_scale": 3.0}}
MODES = ("vllm", "lightllm")
REPEATS = 3
PEERS = ("sglang_hrrn", "sglang_spf", "trtllm_suf", "dynamo_wspt")
SHORT, LONG, TPUT = "short_ttft_p95_ms", "long_ttft_p95_ms", "output_tokens_per_s"


def workloads() -> list[tuple[str, dict[str, Any]]]:
    """(name in the table, CompareSettings keywords) for every workload."""
    rows: list[tuple[str, dict[str, Any]]] = [(name, {"scenario": name, "repeats": REPEATS}) for name in SCENARIOS]
    rows += [(f"sample:{name}", {"trace": Path(f"sample:{name}"), **window}) for name, window in TRACES.items()]
    return rows


def column(label: str) -> str:
    """A row label as a column name: the policy, without the partial-prefill setting (the same in each mode)."""
    return label.split(":", 1)[0]


def change(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base - 1.0


def run_cell(name: str, settings: dict[str, Any], mode: str) -> dict[str, Any]:
    """One workload in one mode: each row's short/long TTFT P95, throughput, and changes vs default."""
    comparison = prepare_comparison(CompareSettings(policies=["peers"], mode=mode, achievable=False, jobs=1,
                                                    **settings)).run()
    base = comparison.summaries["default"]
    rows = {}
    for label, summary in comparison.summaries.items():
        rows[column(label)] = {
            "row": label, SHORT: summary.get(SHORT), LONG: summary.get(LONG), TPUT: summary.get(TPUT),
            "long_ttft_p95_change": change(summary.get(LONG), base.get(LONG)),
            "output_tokens_per_s_change": change(summary.get(TPUT), base.get(TPUT)),
        }
    auto = rows["auto"][SHORT]
    beats = [peer for peer in PEERS if None not in (rows[peer][SHORT], auto) and rows[peer][SHORT] < auto]
    return {"workload": name, "mode": mode, "profile": comparison.profile, "budget": comparison.budget,
            "rows": rows, "peers_beating_auto": beats, "bound_short_ttft_p95_ms": comparison.bound.get(SHORT)}


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:+.0f}%"


def markdown(cells: list[dict[str, Any]]) -> str:
    """The table: short TTFT P95 (ms) of each row, then each row's long TTFT P95 change vs default. A peer's
    short TTFT P95 under auto's is in bold."""
    names = ["default", "auto", *PEERS]
    header = (["workload", "mode", *(f"{n} short p95" for n in names), *(f"{n} long p95 Δ" for n in names[1:])])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    for cell in cells:
        rows = cell["rows"]
        short = []
        for name in names:
            text = _ms(rows[name][SHORT])
            short.append(f"**{text}**" if name in cell["peers_beating_auto"] else text)
        long = [_pct(rows[name]["long_ttft_p95_change"]) for name in names[1:]]
        lines.append("| " + " | ".join([cell["workload"], cell["mode"], *short, *long]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/peers_table.json"))
    args = parser.parse_args()
    cells = [run_cell(name, settings, mode) for mode in MODES for name, settings in workloads()]
    print(markdown(cells))
    print()
    for cell in cells:
        auto = cell["rows"]["auto"]
        for peer in cell["peers_beating_auto"]:
            row = cell["rows"][peer]
            print(f"{cell['workload']} / {cell['mode']}: {peer} short p95 {_ms(row[SHORT])} ms < auto "
                  f"{_ms(auto[SHORT])} ms; long p95 {_pct(row['long_ttft_p95_change'])} (auto "
                  f"{_pct(auto['long_ttft_p95_change'])}), output {_pct(row['output_tokens_per_s_change'])} "
                  f"(auto {_pct(auto['output_tokens_per_s_change'])})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"repeats": REPEATS, "traces": TRACES, "cells": cells}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
