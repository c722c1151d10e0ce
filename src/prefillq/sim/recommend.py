"""Which row of a comparison to run: the recommendation ``prefillq compare`` prints under its table.

    choice = recommend(comparison.summaries, comparison.configs, baseline=comparison.baseline, mode="vllm")

The rule, in one place: among the rows that keep long requests' TTFT P95 within ``LONG_TTFT_P95_MAX_CHANGE``
of the plain default row's, output throughput within ``THROUGHPUT_MAX_DROP`` of it, and whose policy has a
starvation bound, the one with the lowest short-request TTFT P95 (ties: lower long TTFT P95, then higher
throughput, then table order). The default row always qualifies, so there is always an answer. In
``lightllm`` mode the answer is one of LightLLM's own ``--prefill_queue_strategy`` values, and ``auto`` is
reported beside it as what prefillq would add. A row that emulates another engine's own option (SGLang,
TensorRT-LLM, Dynamo: ``PEER_OPTIONS``) runs in neither engine, so it is shown but never recommended.

What the answer costs (long TTFT p95, short TPOT p50 and output throughput against the default row) is
given as a range, ``cost_ranges``: the simulated change plus and minus the calibrated model's measured
error on that change, in percentage points (``cost_error``). By default that error is the one
``benchmarks/fidelity_study.py`` measured on real vLLM (:data:`MEASURED_COST_ERROR`, docs/fidelity.md);
a profile whose ``calibration.cost_error`` block holds its own measurement gives that instead
(:func:`cost_error_of`). The choice itself uses the simulated figures, as before.
Pure: data in, data out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefillq.config import PEER_POLICIES, PolicyConfig
from prefillq.metrics import relative_change

LONG_TTFT_P95_MAX_CHANGE = 0.15   # long TTFT P95 at most 15% above default's
THROUGHPUT_MAX_DROP = 0.02        # output tokens/s at most 2% below default's
OVER_LIMIT_MIN_GAIN = 1.10        # a row over the limits is named when it cuts short TTFT P95 by more than this
VLLM_SCHEDULER_CLS = "prefillq.integrations.vllm.Scheduler"
LIGHTLLM_OWN_STRATEGIES = ("default", "promote_shortest", "hrrn")  # what stock LightLLM offers
# Each emulated peer policy (config.PEER_POLICIES) and the engine option it stands for, in that engine's terms.
PEER_OPTIONS = {
    "sglang_hrrn": "SGLang --schedule-policy hrrn",
    "sglang_spf": "SGLang --schedule-policy shortest-prefill-first",
    "trtllm_suf": "TensorRT-LLM context_scheduling_policy=shortest_uncached_first",
    "dynamo_wspt": "Dynamo --router-queue-policy wspt",
}
ENGINE_NAMES = {"vllm": "vLLM", "lightllm": "LightLLM"}
# How far the simulator's change vs default was from the real paired change on vLLM CPU, in percentage
# points (benchmarks/fidelity_study.py, docs/fidelity.md: the largest miss over its burst and sustained
# workloads and configurations): the half-width of each cost range.
MEASURED_COST_ERROR = {"long_ttft_p95_change": 5.0, "short_tpot_p50_change": 6.0,
                       "output_tokens_per_s_change": 2.0}
MEASURED_COST_ERROR_SOURCE = "the simulator's error measured on real vLLM (docs/fidelity.md)"
COST_CHANGES = tuple(MEASURED_COST_ERROR)
# the native keys a paste-ready configuration names when they differ from PolicyConfig's defaults
_CONFIG_KEYS = ("threshold", "long_max_wait_ms", "partial_prefills", "trust_request_priority")


def has_starvation_bound(config: PolicyConfig) -> bool:
    """Whether the policy bounds how long a waiting (or partly prefilled) request can be passed over:
    every policy does except strict ``short_request_first`` (``long_max_wait_ms = 0``), which delays a long
    prompt for as long as short ones keep arriving (SPEC §3.4, §3.6)."""
    return not (config.policy == "short_request_first" and config.long_max_wait_ms <= 0)


def emulated_option(config: PolicyConfig) -> str | None:
    """The other engine's option ``config`` emulates (e.g. ``SGLang --schedule-policy hrrn``), None for
    prefillq's own policies."""
    if config.policy not in PEER_POLICIES:
        return None
    return PEER_OPTIONS.get(config.policy, config.policy)


def emulations(configs: Mapping[str, PolicyConfig]) -> dict[str, str]:
    """Row label -> the engine option it emulates, for the rows that are emulations (table order)."""
    return {label: option for label, config in configs.items() if (option := emulated_option(config)) is not None}


def native_config(config: PolicyConfig) -> dict[str, Any]:
    """The configuration as our native JSON object, naming only what a reader needs: the policy, the
    short_request_first settings, and any other setting that differs from its default."""
    plain = PolicyConfig()
    data: dict[str, Any] = {"policy": config.policy}
    for key in _CONFIG_KEYS:
        value = getattr(config, key)
        wanted = config.policy == "short_request_first" and key in ("threshold", "long_max_wait_ms")
        if wanted or value != getattr(plain, key):
            data[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return data


def vllm_command(config: PolicyConfig, *, priority: bool = False) -> str:
    """The one line that runs ``config`` in vLLM (stock vLLM for the plain default: nothing to change);
    ``priority``: under vLLM's ``--scheduling-policy priority``, where the plug-in runs the policy inside
    the priority tiers (implied there, so the configuration does not name them)."""
    if config == PolicyConfig():
        line = "vllm serve MODEL"
    else:
        additional = json.dumps({"prefillq": native_config(config)})
        line = f"vllm serve MODEL --scheduler-cls {VLLM_SCHEDULER_CLS} --additional-config '{additional}'"
    return line + " --scheduling-policy priority" if priority else line


def lightllm_strategy(config: PolicyConfig) -> str | None:
    """The ``--prefill_queue_strategy`` value stock LightLLM runs ``config`` with, or None if it has none."""
    plain = PolicyConfig(policy=config.policy)
    same = config.with_(partial_prefills="first") == plain  # LightLLM's backend orders partial prefills itself
    return config.policy if same and config.policy in LIGHTLLM_OWN_STRATEGIES else None


def cost_error_of(profile_data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The cost error to state ranges with: a profile's own ``calibration.cost_error`` (``{"pts": {change:
    points}, "source": text}``, e.g. written by the fidelity study) where it has one, else the measured default."""
    own = ((profile_data or {}).get("calibration") or {}).get("cost_error")
    if isinstance(own, Mapping) and isinstance(own.get("pts"), Mapping):
        pts = {key: float(own["pts"].get(key, MEASURED_COST_ERROR[key])) for key in COST_CHANGES}
        return {"pts": pts, "source": str(own.get("source", "the profile's calibration.cost_error"))}
    return {"pts": dict(MEASURED_COST_ERROR), "source": MEASURED_COST_ERROR_SOURCE}


def cost_ranges(figures: Mapping[str, Any], error: Mapping[str, Any]) -> dict[str, Any]:
    """Per cost change: ``{"low", "high", "error_pts"}`` = the simulated change -/+ the error (None: unknown)."""
    ranges: dict[str, Any] = {}
    for key in COST_CHANGES:
        change, pts = figures.get(key), error["pts"][key]
        ranges[key] = None if change is None else {"low": change - pts / 100.0, "high": change + pts / 100.0,
                                                   "error_pts": pts}
    return ranges


def _figures(summary: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """A row's before/after figures and relative changes vs the default row (None where unknown)."""
    def pair(key: str) -> dict[str, Any]:
        return {"before": None if base is None else base.get(key), "after": summary.get(key)}

    def change(key: str) -> float | None:
        return None if base is None else relative_change(summary.get(key), base.get(key))

    return {
        "short_ttft_p95_ms": pair("short_ttft_p95_ms"),
        "long_ttft_p95_ms": pair("long_ttft_p95_ms"),
        "short_tpot_p50_ms": pair("short_tpot_p50_ms"),
        "output_tokens_per_s": pair("output_tokens_per_s"),
        "short_ttft_p95_change": change("short_ttft_p95_ms"),
        "long_ttft_p95_change": change("long_ttft_p95_ms"),
        "short_tpot_p50_change": change("short_tpot_p50_ms"),
        "output_tokens_per_s_change": change("output_tokens_per_s"),
    }


def why_not(summary: Mapping[str, Any], config: PolicyConfig, base: Mapping[str, Any] | None,
            mode: str = "vllm", long_limit: float = LONG_TTFT_P95_MAX_CHANGE) -> str | None:
    """Why a row cannot be recommended (None: it can); ``long_limit``: the most long TTFT P95 may rise."""
    option = emulated_option(config)
    if option is not None:
        runner = "prefillq's vLLM plug-in" if mode == "vllm" else ENGINE_NAMES.get(mode, mode)
        return f"an emulation of {option}; {runner} does not run it"
    if not has_starvation_bound(config):
        return "no starvation bound (strict short_request_first: long_max_wait_ms = 0)"
    if base is None:
        return None
    long_change = relative_change(summary.get("long_ttft_p95_ms"), base.get("long_ttft_p95_ms"))
    if long_change is not None and long_change > long_limit + 1e-12:
        return f"long TTFT p95 {long_change:+.0%} vs default (limit +{long_limit:.0%})"
    tput_change = relative_change(summary.get("output_tokens_per_s"), base.get("output_tokens_per_s"))
    if tput_change is not None and tput_change < -THROUGHPUT_MAX_DROP - 1e-12:
        return f"output tok/s {tput_change:+.1%} vs default (limit -{THROUGHPUT_MAX_DROP:.0%})"
    return None


def _rank(summary: Mapping[str, Any], position: int) -> tuple[float, float, float, int]:
    def number(key: str, missing: float) -> float:
        value = summary.get(key)
        return missing if value is None else float(value)

    return (number("short_ttft_p95_ms", float("inf")), number("long_ttft_p95_ms", float("inf")),
            -number("output_tokens_per_s", 0.0), position)


def _best(labels: list[str], summaries: Mapping[str, Mapping[str, Any]], reasons: Mapping[str, str | None],
          order: Mapping[str, int]) -> str | None:
    eligible = [label for label in labels if reasons[label] is None]
    return min(eligible, key=lambda label: _rank(summaries[label], order[label])) if eligible else None


def recommend(summaries: Mapping[str, Mapping[str, Any]], configs: Mapping[str, PolicyConfig], *,
              baseline: str | None, mode: str = "vllm", cost_error: Mapping[str, Any] | None = None,
              long_limit: float = LONG_TTFT_P95_MAX_CHANGE) -> dict[str, Any] | None:
    """The recommended row and what it buys and costs, as data (None when there are no rows).

    ``summaries`` and ``configs`` are keyed by row label in table order; ``baseline`` is the plain default
    row (None: there is none, so the limits cannot be checked and only the starvation bound is). Returns
    ``row``, ``config`` (native JSON object), ``command`` (the vLLM line, or LightLLM's flag in
    ``lightllm`` mode), the figures before (default) and after, ``candidates`` (each row: ``None`` if it
    qualifies, else why not), ``rule``, ``over_limit`` (the best short tail the limits turned down, or None),
    and in ``lightllm`` mode ``auto``: what prefillq's auto row reaches. ``cost_ranges`` states each cost
    change as a range with ``cost_error`` (:func:`cost_error_of`; default: the measured error), which is
    returned too. ``long_limit``: the most a row may raise long TTFT P95 over default's (the user's
    ``--long-cost-limit``; default +15%).
    Emulations of other engines' options are never the answer (None when every row is one).
    """
    labels = [label for label in summaries if label in configs]
    pool = [label for label in labels if emulated_option(configs[label]) is None]  # what the engine runs
    if not pool:
        return None
    order = {label: position for position, label in enumerate(labels)}
    base = None if baseline is None else summaries.get(baseline)
    reasons = {label: why_not(summaries[label], configs[label], base, mode, long_limit) for label in labels}
    if baseline in reasons:
        reasons[baseline] = None  # the stock engine is always a safe answer
    if mode == "lightllm":
        own = [label for label in pool if lightllm_strategy(configs[label]) is not None]
        pool = own or pool
    row = _best(pool, summaries, reasons, order) or (baseline if baseline in pool else None)
    if row is None:
        row = min(pool, key=lambda label: order[label])  # nothing qualifies and no default row: the first row
    config = configs[row]
    strategy = lightllm_strategy(config)
    if mode == "lightllm":
        command = (f"--prefill_queue_strategy {strategy}" if strategy is not None
                   else f"--prefill_queue_strategy {config.policy}")
    else:
        command = vllm_command(config)
    result: dict[str, Any] = {
        "row": row, "config": native_config(config), "command": command, "engine": mode,
        "is_default": row == baseline, "baseline": baseline, "qualifies": reasons[row] is None,
        **_figures(summaries[row], base),
        "rule": {"long_ttft_p95_max_change": long_limit, "throughput_max_drop": THROUGHPUT_MAX_DROP,
                 "starvation_bound": True, "limits_checked": base is not None},
        "candidates": reasons,
    }
    error = dict(cost_error) if cost_error is not None else cost_error_of(None)
    result["cost_error"] = error
    result["cost_ranges"] = cost_ranges(result, error)
    result["over_limit"] = _over_limit(pool, row, summaries, configs, reasons, base, order)
    if mode == "lightllm":
        result["lightllm_strategy"] = strategy
        result["auto"] = _auto_beside(summaries, configs, reasons, base, order)
    return result


def _over_limit(pool: list[str], row: str, summaries: Mapping[str, Mapping[str, Any]],
                configs: Mapping[str, PolicyConfig], reasons: Mapping[str, str | None],
                base: Mapping[str, Any] | None, order: Mapping[str, int]) -> dict[str, Any] | None:
    """The trade the limits turned down: the row with the lowest short TTFT P95 among those that have a
    starvation bound but cost long requests or throughput more than the limits allow, when it cuts the
    recommended row's short TTFT P95 by more than a tenth (None otherwise). The user decides; the
    recommendation itself never crosses the limits."""
    if base is None:
        return None
    costly = [label for label in pool if reasons[label] is not None and has_starvation_bound(configs[label])]
    if not costly:
        return None
    label = min(costly, key=lambda name: _rank(summaries[name], order[name]))
    short, current = summaries[label].get("short_ttft_p95_ms"), summaries[row].get("short_ttft_p95_ms")
    if short is None or current is None or short >= current / OVER_LIMIT_MIN_GAIN:
        return None
    return {"row": label, "config": native_config(configs[label]), "why_not": reasons[label],
            **_figures(summaries[label], base)}


def _auto_beside(summaries: Mapping[str, Mapping[str, Any]], configs: Mapping[str, PolicyConfig],
                 reasons: Mapping[str, str | None], base: Mapping[str, Any] | None,
                 order: Mapping[str, int]) -> dict[str, Any] | None:
    """In LightLLM mode: the best ``auto`` row (what prefillq's ranker would add to LightLLM's strategies)."""
    autos = [label for label in order if configs[label].policy == "auto"]
    if not autos:
        return None
    label = min(autos, key=lambda name: _rank(summaries[name], order[name]))
    return {"row": label, "command": "--prefill_queue_strategy auto", "qualifies": reasons[label] is None,
            "why_not": reasons[label], **_figures(summaries[label], base)}
