"""What ``prefillq tune`` hands an operator: paste-ready configuration, the explanation, the histogram.

Configuration for vLLM (our ``prefillq`` key and the vLLM Ascend ``short_request_first_config`` key, both
read by :class:`prefillq.integrations.vllm.Scheduler`) and LightLLM (``--prefill_queue_strategy``).
Data only: the command prints it. matplotlib is imported only when a histogram is drawn.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefillq.tune.choose import LIGHTLLM_STRATEGIES, TuneResult, metric_or_inf

VLLM_SCHEDULER_CLS = "prefillq.integrations.vllm.Scheduler"  # right with and without async scheduling


def native_config(policy: str, threshold: int, long_max_wait_ms: float,
                  partial_prefills: str = "first") -> dict[str, Any]:
    """Our native configuration object for a policy (threshold/wait only for short_request_first;
    ``partial_prefills`` only when it is not the default ``"first"``)."""
    config: dict[str, Any] = {"policy": policy}
    if policy == "short_request_first":
        config.update(threshold=int(threshold), long_max_wait_ms=_json_number(long_max_wait_ms))
    if partial_prefills != "first":
        config["partial_prefills"] = partial_prefills
    return config


def ascend_config(threshold: int, long_max_wait_ms: float) -> dict[str, Any]:
    """The vLLM Ascend form; it can only express short_request_first."""
    return {"scheduler_config": {"short_request_first_config": {
        "enabled": True, "threshold": int(threshold), "long_max_wait_ms": _json_number(long_max_wait_ms)}}}


def _json_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


ASCEND_ORDERED_NOTE = ("the vLLM Ascend key cannot express partial_prefills = \"ordered\" (it always means "
                       "\"first\"); use the prefillq key above for it")
LIGHTLLM_ORDERED_NOTE = "LightLLM's backend already orders partial prefills by its strategy; nothing to set"


def render_configs(policy: str, threshold: int, long_max_wait_ms: float, *,
                   lightllm_strategy: str | None = None, partial_prefills: str = "first") -> dict[str, str]:
    """Ready-to-paste configuration for vLLM (our key and the vLLM Ascend key) and LightLLM.

    With ``partial_prefills = "ordered"`` only our key carries it; ``vllm_ascend_note`` and
    ``lightllm_note`` say what the other two do instead.
    """
    ours = json.dumps({"prefillq": native_config(policy, threshold, long_max_wait_ms, partial_prefills)})
    ascend = json.dumps(ascend_config(threshold, long_max_wait_ms))
    strategy = lightllm_strategy or (policy if policy in LIGHTLLM_STRATEGIES else "hrrn")
    return {
        "vllm": (f"vllm serve MODEL --scheduler-cls {VLLM_SCHEDULER_CLS} \\\n"
                 f"    --additional-config '{ours}'"),
        "vllm_additional_config": ours,
        "vllm_ascend": (f"vllm serve MODEL --scheduler-cls {VLLM_SCHEDULER_CLS} \\\n"
                        f"    --additional-config '{ascend}'"),
        "vllm_ascend_additional_config": ascend,
        "lightllm": f"--prefill_queue_strategy {strategy}",
        "vllm_ascend_note": ASCEND_ORDERED_NOTE if partial_prefills == "ordered" else "",
        "lightllm_note": LIGHTLLM_ORDERED_NOTE if partial_prefills == "ordered" else "",
    }


def _percent_change(new: float, old: float) -> str:
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return "n/a"
    return f"{(new - old) / old:+.1%}"


# --- explanation -------------------------------------------------------------------------------

def explain(result: TuneResult) -> list[str]:
    """Plain-language paragraphs explaining the recommendation."""
    t, lanes, wait, choice = result.threshold, result.lanes, result.wait, result.choice
    trace = result.trace
    prompt = trace["prompt_tokens"]
    lines = [
        f"Trace: {trace['requests']:,} requests over {trace['duration_s']:,.0f} s "
        f"(rate scale {trace['rate_scale']:g}); prompt tokens p50 {prompt['p50']:,.0f}, "
        f"p90 {prompt['p90']:,.0f}, max {prompt['max']:,}.",
        f"Threshold {t.threshold:,} tokens ({t.method}): {t.reason}.",
        f"Lanes at {t.threshold:,}: short {lanes.short_request_share:.0%} of requests / "
        f"{lanes.short_token_share:.0%} of prefill tokens; long {lanes.long_request_share:.0%} of requests / "
        f"{lanes.long_token_share:.0%} of prefill tokens.",
        f"Simulated {result.window['description']} on profile {result.simulation.get('profile') or 'default'}"
        + (f" with a prefill budget of {result.simulation['budget']:,} tokens per step."
           if result.simulation.get("budget") else "."),
        f"long_max_wait_ms {wait.long_max_wait_ms:,.0f}: {wait.reason}.",
    ]
    if wait.evidence:
        lines.append("Evidence: " + "; ".join(wait.evidence) + ".")
    degraded = result.simulation.get("policy_warnings", {}).get("short_request_first", 0)
    if degraded:
        lines.append(f"The tuned short_request_first run logged {degraded} degradation warning(s) (long requests "
                     "promoted over waiting short ones several times in a row): raise the threshold first, "
                     "then the wait.")
    base = result.summaries.get("default", {})
    chosen = result.summaries.get(f"{choice.policy} (ordered)" if result.partial_prefills == "ordered"
                                  else choice.policy, {})
    effect = ""
    if choice.policy != "default":
        def change(key: str) -> str:
            return _percent_change(metric_or_inf(chosen, key), metric_or_inf(base, key))

        ordered = " (with partial_prefills ordered)" if result.partial_prefills == "ordered" else ""
        effect = (f" Predicted against default{ordered}: short TTFT P95 {change('short_ttft_p95_ms')}, short TTFT "
                  f"p50 {change('short_ttft_p50_ms')}, long TTFT P95 {change('long_ttft_p95_ms')}, output "
                  f"tokens/s {change('output_tokens_per_s')}.")
    lines.append(f"Policy {choice.policy}: {choice.reason}.{effect}")
    for name, why in choice.excluded.items():
        lines.append(f"Not {name}: {why}.")
    if result.ordered is not None and result.ordered.reason and not result.ordered.policy_switched_from:
        lines.append(f"Partial prefills {result.partial_prefills}: {result.ordered.reason}.")
    lines.extend(f"{warning[0].upper()}{warning[1:]}." for warning in result.warnings)
    if choice.policy not in LIGHTLLM_STRATEGIES:
        lines.append(f"LightLLM has no short_request_first; its best strategy here is "
                     f"{choice.lightllm_strategy} ({choice.lightllm_reason}).")
    if choice.policy != "short_request_first":
        lines.append("The vLLM Ascend key only configures short_request_first; its snippet below carries the "
                     "tuned threshold and wait in case you run that policy anyway.")
    return lines


# --- the histogram -----------------------------------------------------------------------------

def plot_histogram(result: TuneResult, path: str | Path) -> Path:
    """PNG: histogram of prompt lengths (log axis), lanes coloured, threshold and valley marked."""
    import numpy as np

    from prefillq.report.plots import pyplot, save_figure

    plt = pyplot()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = np.asarray(result.prompt_lengths, dtype=float)
    t = result.threshold
    low, high = max(1.0, float(lengths.min())), float(lengths.max())
    bins = np.logspace(math.log10(low) - 0.01, math.log10(max(high, low * 1.01)) + 0.01, 60)
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    short, long = lengths[lengths <= t.threshold], lengths[lengths > t.threshold]
    lanes = result.lanes
    ax.hist(short, bins=bins, color="#2b8cbe", label=f"short lane: {lanes.short_request_share:.0%} of "
            f"requests, {lanes.short_token_share:.0%} of prefill tokens")
    ax.hist(long, bins=bins, color="#e6550d", label=f"long lane: {lanes.long_request_share:.0%} of "
            f"requests, {lanes.long_token_share:.0%} of prefill tokens")
    ax.axvline(t.threshold, color="black", linewidth=1.6, label=f"threshold {t.threshold:,} ({t.method})")
    if t.valley_tokens is not None:
        depth = f" (density {t.valley_depth_ratio:.0%} of the smaller peak)" if t.valley_depth_ratio else ""
        ax.axvline(t.valley_tokens, color="grey", linestyle="--", linewidth=1,
                   label=f"{'valley' if t.bimodal else 'deepest dip'} ~{t.valley_tokens:,.0f}{depth}")
    ax.set_xscale("log")
    ax.set_xlabel("prompt tokens (log scale)")
    ax.set_ylabel("requests")
    name = Path(str(result.trace.get("path", ""))).name
    ax.set_title(f"{name}: prompt lengths, recommended policy {result.choice.policy}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, path, dpi="figure")
