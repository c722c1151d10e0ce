"""What the simulator's engine model misses on a served vLLM: step times, gaps between steps, front-end delays.

    PYTHONPATH=src python benchmarks/vllm_steps.py .tmp/fid/m1 [--profile cpu-tiny-llama] [--json OUT.json]

Reads the folders written by ``benchmarks/vllm_sustained.py`` (one per workload), whose servers ran
``prefillq.calibrate.probe.StepTraceScheduler`` (read with ``prefillq.calibrate.served``). Per
workload and policy, over the measured runs, it prints:

* **step time**: measured (``schedule()`` to ``update_from_output()``) / the profile's cost-model
  latency of the same batch, median by batch class (prefill only, decode only, mixed), and the
  ratio of the totals (the next step's start, so the loop's work between steps counts, as the fit does);
* **gap**: time between one step's end and the next one's start while the engine was busy, median
  and mean;
* **front-end**: the client's TTFT minus the engine's (front-end ``arrival_time`` to the end of the
  step that produced the first token), p10 / median / p90, and the line ``a + b * sequences`` through it.

Then, over all workloads and policies: the median decode-only step (``schedule()`` to
``update_from_output()``, decode contexts averaging at most 1,500 tokens) by batch size, and per
workload the median front-end time by the number of sequences in the first token's step, and whether
steps with several prefill chunks cost more than the cost model says (:func:`chunk_costs`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from prefillq.calibrate import COEFFICIENT_NAMES, predict
from prefillq.calibrate.served import (
    IDLE_GAP_S,
    ServerTrace,
    fit_frontend,
    frontend_seconds,
    samples_from_steps,
    server_traces,
    steps_of,
)
from prefillq.sim.costs import CostModel, RooflineCostModel, load_profile

BATCH_EDGES = (1, 8, 16, 24, 32, 40, 48, 56, 64)
DECODE_SIZES = (1, 8, 16, 32, 40, 64, 96, 128)


def decode_step_ms(traces: list[ServerTrace]) -> dict[int, float]:
    """Median decode-only step time (ms) at each of DECODE_SIZES sequences, contexts averaging <= 1.5K."""
    times: dict[int, list[float]] = {}
    for trace in traces:
        for step in trace.steps:
            contexts = step["decode_contexts"]
            if step["prefill_chunks"] or len(contexts) not in DECODE_SIZES or statistics.fmean(contexts) > 1500:
                continue
            times.setdefault(len(contexts), []).append((step["end"] - step["start"]) * 1000)
    return {n: statistics.median(times[n]) for n in sorted(times) if len(times[n]) >= 5}


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")


def diagnose(traces: list[ServerTrace], cost: CostModel) -> dict[str, Any]:
    coefficients = [getattr(cost, name) for name in COEFFICIENT_NAMES]
    shape = (cost.knee_tokens, cost.knee_exponent) if isinstance(cost, RooflineCostModel) else None  # cost_form
    values: dict[str, dict[str, list[float]]] = {}
    for trace in traces:
        for run in trace.runs:
            if run.get("phase") != "measured":
                continue
            steps = steps_of(trace, run)
            samples = samples_from_steps(steps)  # the same batches, timed to the next step's start
            predicted = [predict(coefficients, sample, shape) for sample in samples]
            into = values.setdefault(run["policy"], {"prefill": [], "decode": [], "mixed": [], "gaps": [],
                                                     "measured": [], "predicted": []})
            for step, sample, guess in zip(steps, samples, predicted, strict=True):
                into[sample.batch_class].append((step["end"] - step["start"]) / guess)
            for cur, nxt in itertools.pairwise(steps):
                if 0 <= nxt["start"] - cur["end"] < IDLE_GAP_S:
                    into["gaps"].append(nxt["start"] - cur["end"])
            into["measured"].append(sum(s.seconds for s in samples))
            into["predicted"].append(sum(predicted))
    out = {}
    for policy, v in values.items():
        delays = frontend_seconds([traces], "measured", policy=policy)
        seconds = [d for d, _ in delays]
        intercept, slope = fit_frontend(delays)
        out[policy] = {
            "step_ratio_median": {k: (statistics.median(v[k]) if v[k] else None)
                                  for k in ("prefill", "decode", "mixed")},
            "step_time_total_ratio": sum(v["measured"]) / sum(v["predicted"]),
            "gap_median_ms": statistics.median(v["gaps"]) * 1000, "gap_mean_ms": statistics.fmean(v["gaps"]) * 1000,
            "frontend_ms": [_quantile(seconds, q) * 1000 for q in (0.1, 0.5, 0.9)],
            "frontend_line_ms": [intercept * 1000, slope * 1000], "matched_requests": len(delays),
        }
    return out


CHUNK_GROUPS = (1, 2, 3, 4)  # steps by prefill chunks: 1, 2, 3, 4 or more


def chunk_costs(traces: list[ServerTrace], cost: CostModel) -> dict[str, Any]:
    """Do steps with several prefill chunks cost more than the five terms say? Over the measured runs:
    measured / predicted step time by the number of prefill chunks, and the least-squares line of
    the residual (measured - predicted, ms) against the chunks beyond the first: its slope is what a
    per-sequence prefill term would add per extra chunk."""
    coefficients = [getattr(cost, name) for name in COEFFICIENT_NAMES]
    shape = (cost.knee_tokens, cost.knee_exponent) if isinstance(cost, RooflineCostModel) else None
    ratios: dict[int, list[float]] = {group: [] for group in CHUNK_GROUPS}
    extra: list[tuple[int, float, float]] = []  # (chunks - 1, residual ms, predicted ms)
    for trace in traces:
        for run in trace.runs:
            if run.get("phase") != "measured":
                continue
            for sample in samples_from_steps(steps_of(trace, run)):
                chunks = len(sample.prefill_chunks)
                if not chunks:
                    continue
                guess = predict(coefficients, sample, shape)
                ratios[min(chunks, CHUNK_GROUPS[-1])].append(sample.seconds / guess)
                extra.append((chunks - 1, (sample.seconds - guess) * 1000, guess * 1000))
    n = len(extra)
    mean_x = statistics.fmean(x for x, _, _ in extra) if n else 0.0
    mean_y = statistics.fmean(y for _, y, _ in extra) if n else 0.0
    sxx = sum((x - mean_x) ** 2 for x, _, _ in extra)
    slope = sum((x - mean_x) * (y - mean_y) for x, y, _ in extra) / sxx if sxx else float("nan")
    return {"ratio_median_by_chunks": {g: statistics.median(v) if v else None for g, v in ratios.items()},
            "steps_by_chunks": {g: len(v) for g, v in ratios.items()},
            "residual_ms_per_extra_chunk": slope, "residual_ms_at_one_chunk": mean_y - slope * mean_x,
            "median_prefill_step_ms": statistics.median(p for _, _, p in extra) if extra else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the folder of vllm_sustained.py (one sub-folder per workload)")
    parser.add_argument("--profile", default="cpu-tiny-llama")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cost = load_profile(args.profile).cost
    workloads = {folder.name: server_traces(folder)  # each folder's traces read once
                 for folder in sorted(p for p in args.root.iterdir() if (p / "steps").is_dir())}
    result: dict[str, Any] = {name: diagnose(traces, cost) for name, traces in workloads.items()}
    head = ("workload", "policy", "step ratio prefill/decode/mixed", "total", "gap med/mean ms",
            "front-end p10/med/p90 ms", "front-end line ms", "n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for workload, policies in result.items():
        for policy, row in policies.items():
            ratio = "/".join("-" if v is None else f"{v:.2f}" for v in row["step_ratio_median"].values())
            fe = "/".join(f"{v:.1f}" for v in row["frontend_ms"])
            line = f"{row['frontend_line_ms'][0]:.2f} + {row['frontend_line_ms'][1]:.3f}·n"
            print(f"| {workload} | {policy} | {ratio} | {row['step_time_total_ratio']:.2f} | "
                  f"{row['gap_median_ms']:.2f}/{row['gap_mean_ms']:.2f} | {fe} | {line} | {row['matched_requests']} |")
    print("\nsteps with prefill chunks, measured / predicted (median) by chunks in the step [steps], and the "
          "residual's slope per extra chunk:")
    result["chunk_costs"] = {}
    for name, traces in workloads.items():
        chunks = result["chunk_costs"][name] = chunk_costs(traces, cost)
        groups = ", ".join(f"{g}{'+' if g == CHUNK_GROUPS[-1] else ''}: "
                           + ("-" if r is None else f"{r:.2f}") + f" [{chunks['steps_by_chunks'][g]}]"
                           for g, r in chunks["ratio_median_by_chunks"].items())
        print(f"  {name}: {groups}; {chunks['residual_ms_per_extra_chunk']:+.3f} ms per extra chunk "
              f"(median predicted prefill step {chunks['median_prefill_step_ms']:.2f} ms)")
    decode = decode_step_ms([trace for traces in workloads.values() for trace in traces])
    result["decode_step_ms_by_batch"] = decode
    print("\ndecode-only step, median ms by batch size (contexts <= 1.5K): "
          + ", ".join(f"{n}: {ms:.1f}" for n, ms in decode.items()))
    result["frontend_ms_by_batch"] = {}
    for name, traces in workloads.items():
        groups: dict[int, list[float]] = {}
        for delay, batch in frontend_seconds([traces], "measured"):
            groups.setdefault(next(edge for edge in BATCH_EDGES[::-1] if batch >= edge), []).append(delay * 1000)
        medians = {edge: statistics.median(v) for edge, v in sorted(groups.items())}
        result["frontend_ms_by_batch"][name] = medians
        print(f"front-end, median ms by sequences in the step (from): {name}: "
              + ", ".join(f"{edge}+: {ms:.1f}" for edge, ms in medians.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
