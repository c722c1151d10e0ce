"""The recommendation of ``prefillq compare --scheduling-policy priority`` when the requests have priority
classes: which row to run, chosen for the class that is served first, and what it buys and costs each class.

    choice = recommend_by_class(comparison.summaries, comparison.configs, baseline="default", classes=[0, 1])

The rule is :func:`prefillq.sim.recommend.recommend`'s own, read per class: the *high* class (the lowest
priority value, served first) takes the place of "short requests" and the *low* class (the highest value,
served last) the place of "long requests". Among the rows that keep the low class's long-request TTFT P95
within the same +15% of the default row's, output throughput within the same -2%, and that have a
starvation bound, the one with the lowest short-request TTFT P95 of the high class. The answer carries the
whole engine's before/after figures as compare's recommendation always does, and ``per_class``: each
class's short, long and overall TTFT P95 before (the default row: vLLM's own priority order) and after.
Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.metrics import relative_change
from prefillq.sim.recommend import cost_ranges, recommend, vllm_command
from prefillq.sim.records import class_key

# The figures a recommendation sets before and after (whole engine), and those it reports per class.
ENGINE_FIGURES = ("short_ttft_p95_ms", "long_ttft_p95_ms", "short_tpot_p50_ms", "output_tokens_per_s")
CLASS_FIGURES = ("short_ttft_p95_ms", "long_ttft_p95_ms", "ttft_p95_ms")
CHANGE_KEYS = {"short_ttft_p95_ms": "short_ttft_p95_change", "long_ttft_p95_ms": "long_ttft_p95_change",
                "short_tpot_p50_ms": "short_tpot_p50_change", "output_tokens_per_s": "output_tokens_per_s_change",
                "ttft_p95_ms": "ttft_p95_change"}


def class_view(summary: Mapping[str, Any], high: int, low: int) -> dict[str, Any]:
    """A row's summary as the per-class rule reads it: the high class's short TTFT P95 as
    ``short_ttft_p95_ms``, the low class's long TTFT P95 as ``long_ttft_p95_ms`` (when the low class has no
    long request: its TTFT P95 over all its requests); every other key as it is."""
    low_long = summary.get(class_key(low, "long_ttft_p95_ms"))
    if low_long is None:
        low_long = summary.get(class_key(low, "ttft_p95_ms"))
    return {**summary, "short_ttft_p95_ms": summary.get(class_key(high, "short_ttft_p95_ms")),
            "long_ttft_p95_ms": low_long}


def _before_after(summary: Mapping[str, Any], base: Mapping[str, Any] | None, keys: Sequence[str],
                  name: Any = lambda key: key) -> dict[str, Any]:
    """``{key: {before, after}}`` and each key's relative change (None where unknown)."""
    figures: dict[str, Any] = {}
    for key in keys:
        before = None if base is None else base.get(name(key))
        after = summary.get(name(key))
        figures[key] = {"before": before, "after": after}
        figures[CHANGE_KEYS[key]] = relative_change(after, before)
    return figures


def recommend_by_class(summaries: Mapping[str, Mapping[str, Any]], configs: Mapping[str, PolicyConfig], *,
                       baseline: str | None, classes: Sequence[int], mode: str = "vllm",
                       plain: Mapping[str, Any] | None = None,
                       cost_error: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The recommended row chosen on the high class's short TTFT P95 subject to the low class's long TTFT
    P95 (module docstring), as :func:`~prefillq.sim.recommend.recommend` returns it, with ``chosen_by``
    (the two classes and the figures read), ``per_class`` (class -> figures before/after and changes) and
    the vLLM line in priority mode. None when there are no rows; with fewer than two classes, ``plain`` or
    the plain recommendation (there is nothing to weigh between classes).

    ``plain``: the recommendation compare already made; keys it has beyond these (what the caller added to
    it) are kept when both choose the same row, and dropped when the row differs (they describe another).
    ``cost_error``: as :func:`~prefillq.sim.recommend.recommend` takes it (default: ``plain``'s); the cost
    ranges are those of the whole engine's changes, as the plain recommendation states them."""
    ordered = sorted(set(classes))
    if len(ordered) < 2:
        return dict(plain) if plain is not None else recommend(summaries, configs, baseline=baseline, mode=mode,
                                                               cost_error=cost_error)
    if cost_error is None and plain is not None:
        cost_error = plain.get("cost_error")
    given = ((plain or {}).get("rule") or {}).get("long_ttft_p95_max_change")  # the user's --long-cost-limit
    limit = {} if given is None else {"long_limit": given}
    high, low = ordered[0], ordered[-1]
    views = {label: class_view(summary, high, low) for label, summary in summaries.items()}
    rec = recommend(views, configs, baseline=baseline, mode=mode, cost_error=cost_error, **limit)
    if rec is None:
        return None
    base = None if baseline is None else summaries.get(baseline)
    row = summaries[rec["row"]]
    rec.update(_before_after(row, base, ENGINE_FIGURES))  # the whole engine's figures, as compare shows them
    if rec.get("cost_error") is not None:  # their ranges, not the class view's
        rec["cost_ranges"] = cost_ranges(rec, rec["cost_error"])
    rec["candidates"] = {label: None if reason is None else _class_reason(reason, high, low)
                         for label, reason in rec["candidates"].items()}
    rec["chosen_by"] = {"high_class": high, "low_class": low,
                        "high": f"class {high} short TTFT p95", "low": f"class {low} long TTFT p95"}
    rec["per_class"] = {
        str(c): _before_after(row, base, CLASS_FIGURES, name=lambda key, c=c: class_key(c, key)) for c in ordered}
    if mode == "vllm":  # the plug-in runs the row's policy inside vLLM's priority tiers
        rec["command"] = vllm_command(configs[rec["row"]], priority=True)
    if plain is not None and plain.get("row") == rec["row"]:
        for key, value in plain.items():
            rec.setdefault(key, value)
    return rec


def _class_reason(reason: str, high: int, low: int) -> str:
    """A row's reason for not qualifying in the per-class terms it was judged in."""
    return reason.replace("long TTFT p95", f"class {low} long TTFT p95").replace(
        "short TTFT p95", f"class {high} short TTFT p95")
