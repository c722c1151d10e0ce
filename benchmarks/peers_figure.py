"""The picture in docs/peers.md: short-request TTFT P95 against load for every peer option, default and auto.

Simulator, vLLM mode (profile h200-qwen3-0.6b, its budget of 1024 tokens/step), the rows of
``prefillq compare --policies peers`` (auto and sglang_spf with ordered partial prefills), two sweeps:

* left, load: the ``sustained`` scenario (Poisson arrivals for 8 s, 25% 8K prompts) at each request rate
  of ``RATES``, median over ``REPEATS`` seeds;
* right, queue depth: the ``long-first`` burst (48 prompts of 16K tokens, then N of 128 at 1 ms
  spacing) for each N of ``SHORTS``, so that up to 48 + N requests wait at once (SGLang's hrrn stops
  sorting above 128).

Short TTFT P95 on a log scale, with the proven lower bound; long TTFT P95 goes into the JSON.

    nice python benchmarks/peers_figure.py [--out docs/peers-load.png] [--json benchmarks/results/peers_load.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefillq.sim.compare import CompareSettings, prepare_comparison

RATES = (10, 20, 30, 40, 50, 55, 60, 65, 70, 75, 80, 90)
SHORTS = (16, 32, 48, 64, 72, 80, 88, 96, 112, 128, 160, 192, 256)
LEADING_LONG = 48  # the long-first burst's long prompts
REPEATS = 3
SHORT, LONG = "short_ttft_p95_ms", "long_ttft_p95_ms"
STYLE = {  # stock and prefillq's own rows solid, the emulations dashed or dotted
    "default": ("black", "-", "o"),
    "auto:partial_prefills=ordered": ("#1f77b4", "-", "s"),
    "sglang_hrrn": ("#ff7f0e", "--", "^"),
    "sglang_spf:partial_prefills=ordered": ("#2ca02c", "--", "v"),
    "trtllm_suf": ("#d62728", "--", "D"),
    "dynamo_wspt": ("#9467bd", ":", "x"),
}


def point(scenario: str, overrides: dict[str, Any], repeats: int) -> dict[str, Any]:
    """One simulated ``compare --policies peers``: each row's figures (median over the repeats) and the bound."""
    comparison = prepare_comparison(CompareSettings(scenario=scenario, overrides=overrides, policies=["peers"],
                                                    repeats=repeats, achievable=False, jobs=1)).run()
    return {"bound_short_ttft_p95_ms": comparison.bound.get(SHORT),
            "rows": {label: {key: s.get(key) for key in (SHORT, LONG, "output_tokens_per_s")}
                     for label, s in comparison.summaries.items()}}


def sweep() -> dict[str, Any]:
    """Both sweeps, with the engine's best-case prefill capacity (prompt tokens/s at a full budget)."""
    setup = prepare_comparison(CompareSettings(scenario="sustained", policies=["default"], achievable=False))
    budget = setup.profile.limit("max_num_batched_tokens")
    capacity = budget / setup.profile.cost.step_latency(budget, 0.0, 0, 0)
    load = [{"rate": rate, **point("sustained", {"rate": float(rate)}, REPEATS)} for rate in RATES]
    depth = [{"shorts": n, "queue_depth": LEADING_LONG + n, **point("long-first", {"num_requests": n}, 1)}
             for n in SHORTS]
    return {"mode": "vllm", "profile": setup.profile.name, "budget": budget, "repeats": REPEATS,
            "prefill_capacity_tokens_per_s": capacity, "load": load, "depth": depth}


def draw(data: dict[str, Any], out: Path) -> Path:
    from prefillq.report.plots import pyplot, save_figure  # matplotlib only when drawing

    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    # the rate whose prompt tokens (25% of 8,192, 75% of 128) fill the best-case prefill capacity
    saturation = data["prefill_capacity_tokens_per_s"] / (0.25 * 8192 + 0.75 * 128)
    panels = ((left, data["load"], "rate", saturation, " prefill\n capacity", "left"),
              (right, data["depth"], "queue_depth", 128, "SGLang hrrn \nstops sorting \nabove 128 ", "right"))
    for axis, points, x_key, marker_x, marker_text, align in panels:
        xs = [p[x_key] for p in points]
        for label, (colour, line, marker) in STYLE.items():
            axis.plot(xs, [p["rows"][label][SHORT] for p in points], color=colour, linestyle=line, marker=marker,
                      markersize=4, label=label.replace(":partial_prefills=ordered", " (ordered partial prefills)"))
        axis.plot(xs, [p["bound_short_ttft_p95_ms"] for p in points], color="grey", linestyle="-.", linewidth=1,
                  label="proven lower bound")
        axis.set_yscale("log")
        axis.axvline(marker_x, color="grey", linewidth=0.8, alpha=0.6)
        axis.text(marker_x, 0.55, marker_text, transform=axis.get_xaxis_transform(), fontsize=7, color="grey",
                  ha=align)
        axis.set_ylabel("short-request TTFT P95 (ms, log scale)")
        axis.grid(True, which="major", alpha=0.3)
    left.set_xlabel("offered load (requests/s; Poisson, 25% of prompts 8K, the rest 128)")
    left.set_title(f"load: scenario sustained, median of {data['repeats']} seeds", fontsize=10)
    right.set_xlabel(f"requests waiting after the burst ({LEADING_LONG} of 16K, then N of 128)")
    right.set_title("queue depth: scenario long-first with N short prompts", fontsize=10)
    handles, labels = left.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.suptitle(f"vLLM engine model ({data['profile']}, budget {data['budget']} tokens/step); "
                    "dashed and dotted: emulations of other engines' options", fontsize=10)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    return save_figure(figure, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/peers-load.png"))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/peers_load.json"))
    args = parser.parse_args()
    data = sweep()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    labels = list(STYLE)
    print("short TTFT p95 (ms) | " + " | ".join(labels))
    for name, x_key in (("load", "rate"), ("depth", "queue_depth")):
        for p in data[name]:
            print(f"{x_key} {p[x_key]} | " + " | ".join(f"{p['rows'][label][SHORT]:,.0f}" for label in labels))
    print(draw(data, args.out))


if __name__ == "__main__":
    main()
