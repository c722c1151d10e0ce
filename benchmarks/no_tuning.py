"""Does ``auto`` (no settings) match the best fixed policy on every workload? The matrix of issue 22.

Cells (simulator, default profile):

* **vllm** (the target cells): long-first, interleaved, sustained, long-then-stream, low-load, multi-turn,
  Azure conv (600 s, rate x3) and Azure code (600 s, rate x2), each at budgets 1024 and 4096;
* **1p1d**: the published study's scenarios on one prefill + one decode node;
* **lightllm**: the published study's scenarios in LightLLM mode (12 template tokens), where the
  fixed rows are LightLLM's three strategies;
* **fleet**: 4 replicas behind ``least_outstanding_tokens`` with a gateway queue running each policy.

Fixed rows: ``default``, ``promote_shortest``, ``hrrn``, ``short_request_first`` (threshold 256, strict),
each with ``partial_prefills`` first and ordered (LightLLM mode: its three strategies). Per cell, the
best fixed row is the one with the lowest short TTFT P95; auto is compared with it:

    short P95 <= 1.10 x best's,  long P95 <= 1.10 x best's long P95 + 5 ms,  throughput >= 0.98 x default's

and under compare's recommendation rule (sim/recommend.py): the best fixed row among those within its limits
(long TTFT P95 <= 1.15 x default's, throughput >= 0.98 x default's, a starvation bound), auto within the
same limits and short P95 <= 1.10 x that row's.

    nice python benchmarks/no_tuning.py [--jobs 2] [--seeds 1] [--groups vllm,1p1d,lightllm,fleet]
                                        [--json benchmarks/results/no_tuning.json]

Prints one markdown table (misses marked) and writes every row as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.sim import simulate
from prefillq.sim.fleet import FleetConfig
from prefillq.sim.recommend import LONG_TTFT_P95_MAX_CHANGE, THROUGHPUT_MAX_DROP, has_starvation_bound
from prefillq.workload import load_trace, scenario

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
SCENARIOS = ("long-first", "interleaved", "sustained", "long-then-stream", "low-load", "multi-turn")
PUBLISHED = ("long-first", "interleaved", "sustained", "long-then-stream", "overload", "low-load")
TRACE_CELLS = (("azure-conv", "azure-2023-conv.csv", 3.0), ("azure-code", "azure-2023-code.csv", 2.0))
BUDGETS = (1024, 4096)
FIXED = ("default", "promote_shortest", "hrrn", "short_request_first")
LIGHTLLM_FIXED = ("default", "promote_shortest", "hrrn")
SHORT_SLACK, LONG_SLACK, LONG_SLACK_MS, THROUGHPUT_FLOOR = 1.10, 1.10, 5.0, 0.98
METRICS = ("short_ttft_p95_ms", "long_ttft_p95_ms", "output_tokens_per_s")
TRACE_DURATION_S = 600.0
FLEET_REPLICAS, FLEET_INFLIGHT = 4, 8


def _workload(name: str, seed: int, scale: float = 1.0):
    """A cell's workload; ``scale`` multiplies the arrival rate (a fleet of 4 gets 4x the traffic)."""
    for label, file, rate_scale in TRACE_CELLS:
        if name == label:
            try:
                from prefillq.workload import sample_path  # shipped samples (sample:azure-conv), when present

                path = sample_path(label)
            except (ImportError, ValueError, OSError):
                path = TRACES / file
            return load_trace(path, rate_scale=rate_scale * scale, duration_s=TRACE_DURATION_S)
    if scale != 1.0:
        base = scenario(name, seed=seed)
        return scenario(name, seed=seed, rate=base.params["rate"] * scale)
    return scenario(name, seed=seed)


def _rows(group: str) -> dict[str, PolicyConfig]:
    if group == "fleet":  # the gateway orders; partial prefills are the engines' business
        return {name: PolicyConfig(name) for name in (*FIXED, "auto")}
    if group == "lightllm":
        return {name: PolicyConfig(name) for name in (*LIGHTLLM_FIXED, "auto")}
    rows = {}
    for name in FIXED:
        rows[name] = PolicyConfig(name)
        rows[f"{name}+ordered"] = PolicyConfig(name, partial_prefills="ordered")
    rows["auto"] = PolicyConfig("auto")
    rows["auto+ordered"] = PolicyConfig("auto", partial_prefills="ordered")
    return rows


def _run(job: tuple[str, str, int, str, PolicyConfig, int]) -> tuple[tuple, dict[str, float]]:
    group, name, budget, label, config, seeds = job
    per_seed = []
    uniform = name.startswith("azure") or scenario(name).params.get("arrival") == "uniform"
    for seed in range(1 if uniform else seeds):
        workload = _workload(name, seed, FLEET_REPLICAS if group == "fleet" else 1.0)
        if group == "fleet":
            fleet = FleetConfig(replicas=FLEET_REPLICAS, router="least_outstanding_tokens", gateway_policy=config,
                                max_inflight_per_replica=FLEET_INFLIGHT)
            result = simulate(workload, "default", budget=budget, fleet=fleet)
        elif group == "lightllm":
            result = simulate(workload, config, budget=budget, mode="lightllm", template_tokens=12)
        else:
            result = simulate(workload, config, budget=budget, topology="1p1d" if group == "1p1d" else "mixed")
        per_seed.append(result.summary)
    return (group, name, budget, label), {
        key: statistics.median(s[key] for s in per_seed) for key in METRICS if per_seed[0].get(key) is not None}


def cells(groups: list[str]) -> list[tuple[str, str, int]]:
    out = []
    for group in groups:
        names = {"vllm": (*SCENARIOS, *(c[0] for c in TRACE_CELLS)), "1p1d": PUBLISHED, "lightllm": PUBLISHED,
                 "fleet": ("sustained", "azure-conv")}[group]
        out += [(group, name, budget) for name in names for budget in BUDGETS]
    return out


def _config_of(label: str) -> PolicyConfig:
    name, _, ordered = label.partition("+")
    return PolicyConfig(name, partial_prefills="ordered" if ordered else "first")


def verdict(rows: dict[str, dict[str, float]]) -> dict[str, Any]:
    """auto against the best fixed row of one cell (auto's better of first/ordered is NOT chosen: 'auto'
    in vLLM mode means its recommended setting, ``partial_prefills = "ordered"``)."""
    fixed = {label: m for label, m in rows.items() if not label.startswith("auto")}
    best_label = min(fixed, key=lambda label: (fixed[label]["short_ttft_p95_ms"], label))
    best, default = fixed[best_label], fixed["default"]
    auto_label = "auto+ordered" if "auto+ordered" in rows else "auto"
    auto = rows[auto_label]
    short_ok = auto["short_ttft_p95_ms"] <= SHORT_SLACK * best["short_ttft_p95_ms"]
    long_ok = auto["long_ttft_p95_ms"] <= LONG_SLACK * best["long_ttft_p95_ms"] + LONG_SLACK_MS
    tput_ok = auto["output_tokens_per_s"] >= THROUGHPUT_FLOOR * default["output_tokens_per_s"]
    # The same question under compare's recommendation rule: the best fixed row among those that keep long
    # TTFT P95 within +15% of default's, throughput within -2% and have a starvation bound; auto must meet
    # the same limits and be within SHORT_SLACK of that row's short P95.
    def within(metrics: dict[str, float]) -> bool:
        return (metrics["long_ttft_p95_ms"] <= (1 + LONG_TTFT_P95_MAX_CHANGE) * default["long_ttft_p95_ms"] + 1e-9
                and metrics["output_tokens_per_s"] >= (1 - THROUGHPUT_MAX_DROP) * default["output_tokens_per_s"])

    bounded = {label: m for label, m in fixed.items()
               if label == "default" or (has_starvation_bound(_config_of(label)) and within(m))}
    limited_label = min(bounded, key=lambda label: (bounded[label]["short_ttft_p95_ms"], label))
    limited_ok = (within(auto) and auto["short_ttft_p95_ms"]
                  <= SHORT_SLACK * bounded[limited_label]["short_ttft_p95_ms"])
    return {"best": best_label, "best_short_p95_ms": best["short_ttft_p95_ms"],
            "best_within_limits": limited_label,
            "best_within_limits_short_p95_ms": bounded[limited_label]["short_ttft_p95_ms"],
            "auto_long_vs_default": auto["long_ttft_p95_ms"] / default["long_ttft_p95_ms"],
            "hit_within_limits": limited_ok,
            "best_long_p95_ms": best["long_ttft_p95_ms"], "auto": auto_label,
            "auto_short_p95_ms": auto["short_ttft_p95_ms"], "auto_long_p95_ms": auto["long_ttft_p95_ms"],
            "auto_throughput_vs_default": auto["output_tokens_per_s"] / default["output_tokens_per_s"],
            "short_ok": short_ok, "long_ok": long_ok, "throughput_ok": tput_ok,
            "hit": short_ok and long_ok and tput_ok}


def run(groups: list[str], seeds: int, jobs: int) -> list[dict[str, Any]]:
    work = [(group, name, budget, label, config, seeds)
            for group, name, budget in cells(groups) for label, config in _rows(group).items()]
    results: dict[tuple, dict[str, dict[str, float]]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for (group, name, budget, label), metrics in pool.map(_run, work, chunksize=1):
            results.setdefault((group, name, budget), {})[label] = metrics
    return [{"group": g, "cell": n, "budget": b, "rows": rows, **verdict(rows)}
            for (g, n, b), rows in results.items()]


def markdown(cells_out: list[dict[str, Any]]) -> str:
    lines = ["| group | cell | budget | best fixed row | short P95 best / auto (ms) | long P95 best / auto (ms) "
             "| auto tput vs default | | best within limits: short P95 (ms) | auto long vs default | |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells_out:
        miss = [k for k, ok in (("short", c["short_ok"]), ("long", c["long_ok"]), ("tput", c["throughput_ok"]))
                if not ok]
        lines.append(f"| {c['group']} | {c['cell']} | {c['budget']} | {c['best']} "
                     f"| {c['best_short_p95_ms']:,.0f} / {c['auto_short_p95_ms']:,.0f} "
                     f"| {c['best_long_p95_ms']:,.0f} / {c['auto_long_p95_ms']:,.0f} "
                     f"| {c['auto_throughput_vs_default']:.3f} | {'MISS ' + ','.join(miss) if miss else 'ok'} "
                     f"| {c['best_within_limits']} {c['best_within_limits_short_p95_ms']:,.0f} "
                     f"| {c['auto_long_vs_default']:.2f} | {'ok' if c['hit_within_limits'] else 'MISS'} |")
    target = [c for c in cells_out if c["group"] == "vllm"]
    lines.append("")
    lines.append(f"vLLM-mode cells within target: {sum(c['hit'] for c in target)} of {len(target)}; "
                 f"all cells: {sum(c['hit'] for c in cells_out)} of {len(cells_out)}; under compare's limits "
                 f"(long TTFT P95 <= +{LONG_TTFT_P95_MAX_CHANGE:.0%} and throughput >= -{THROUGHPUT_MAX_DROP:.0%} vs "
                 f"default, a starvation bound): {sum(c['hit_within_limits'] for c in cells_out)} of {len(cells_out)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="seeds per Poisson scenario (median taken)")
    parser.add_argument("--groups", default="vllm,1p1d,lightllm,fleet")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/no_tuning.json"))
    args = parser.parse_args()
    started = time.monotonic()
    out = run(args.groups.split(","), args.seeds, args.jobs)
    print(markdown(out))
    print(f"\n{time.monotonic() - started:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
