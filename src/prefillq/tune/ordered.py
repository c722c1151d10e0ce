"""Step 4 of the recipe: whether to run the chosen policy with ``partial_prefills = "ordered"`` (SPEC §3.6).

Each reordering policy is simulated a second time with ``"ordered"`` (vLLM mode: the step's prefill
budget is handed out in the policy's order over partial prefills and waiting requests together).
``default`` is not: it keeps arrival order, so ``"ordered"`` gives it nothing to change.
:func:`choose_partial_prefills` recommends ``"ordered"`` only where those runs support it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefillq.tune.choose import (
    ORDERED_POLICIES,
    ORDERED_SUFFIX,
    SAME_RESULT_ABS_MS,
    SAME_RESULT_TOLERANCE,
    eligibility,
    metric_or_inf,
    ordered_label,
    same_result,
)
from prefillq.tune.wait import DEFAULT_W_SLO_MS

STRICT_ORDERED_WARNING = (
    "warning: strict short-first (long_max_wait_ms = 0) with partial_prefills = \"ordered\": a long prompt, "
    "even one whose prefill has started, can wait indefinitely under a continuous flood of short prompts "
    "; set long_max_wait_ms > 0 to bound its wait")


@dataclass
class OrderedChoice:
    """The ``partial_prefills`` recommendation, and every comparison that led to it."""

    partial_prefills: str = "first"
    reason: str = ""
    policy_switched_from: str | None = None        # set when "ordered" turned default into a policy
    per_policy: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _compare(summaries: dict[str, dict[str, Any]], policy: str, w_slo_ms: float) -> dict[str, Any]:
    """``policy`` with "ordered" against default (the limits) and against itself with "first" (the gain)."""
    label = ordered_label(policy)
    eligible, excluded = eligibility({"default": summaries["default"], label: summaries[label]}, w_slo_ms)
    first_p95 = metric_or_inf(summaries[policy], "short_ttft_p95_ms")
    ordered_p95 = metric_or_inf(summaries[label], "short_ttft_p95_ms")
    gain = ordered_p95 < first_p95 and not same_result(ordered_p95, first_p95)
    return {
        "short_ttft_p95_first_ms": first_p95,
        "short_ttft_p95_ordered_ms": ordered_p95,
        "short_ttft_p95_gain": (1 - ordered_p95 / first_p95) if 0 < first_p95 < float("inf") else None,
        "long_ttft_p95_first_ms": metric_or_inf(summaries[policy], "long_ttft_p95_ms"),
        "long_ttft_p95_ordered_ms": metric_or_inf(summaries[label], "long_ttft_p95_ms"),
        "output_tokens_per_s_ordered": metric_or_inf(summaries[label], "output_tokens_per_s"),
        "within_limits": label in eligible,
        "excluded": excluded.get(label),
        "clear_gain": gain,
        "supported": label in eligible and gain,
    }


def choose_partial_prefills(summaries: dict[str, dict[str, Any]], policy: str, *, bimodal: bool = True,
                            w_slo_ms: float = DEFAULT_W_SLO_MS) -> tuple[str, OrderedChoice]:
    """The policy to recommend and its ``partial_prefills``, from the "first" choice ``policy``.

    ``"ordered"`` is recommended for ``policy`` when its ordered run stays within the limits that make a
    policy eligible (at least 97% of default's output throughput, long TTFT P95 at most default's +
    ``W_slo``) and cuts short TTFT P95 below the same policy's "first" run by more than the "same
    result" tolerance (5% or 5 ms). When the "first" runs keep ``default``, the ordered run that meets
    the limits and beats default's short TTFT P95 by more than that tolerance (the lowest, if several)
    is recommended instead: the order only pays off once partial prefills follow it. Ties (within that
    tolerance of the lowest) go by :func:`choose_policy`'s preference: ``short_request_first`` first
    when the histogram has a clear valley (``bimodal``), ``hrrn`` first when it has none.
    """
    per_policy = {name: _compare(summaries, name, w_slo_ms) for name in ORDERED_POLICIES
                  if name in summaries and ordered_label(name) in summaries}
    choice = OrderedChoice(per_policy=per_policy)
    tolerance = f"{SAME_RESULT_TOLERANCE:.0%} or {SAME_RESULT_ABS_MS:g} ms"
    if policy == "default":
        base = metric_or_inf(summaries["default"], "short_ttft_p95_ms")
        better = [name for name, c in per_policy.items() if c["within_limits"]
                  and c["short_ttft_p95_ordered_ms"] < base and not same_result(c["short_ttft_p95_ordered_ms"], base)]
        if not better:
            choice.reason = ("default keeps arrival order, which \"ordered\" does not change, and no policy "
                             "run with \"ordered\" beats default clearly within the limits")
            return policy, choice
        lowest = min(per_policy[name]["short_ttft_p95_ordered_ms"] for name in better)
        preference = (["short_request_first", "hrrn", "promote_shortest", "auto"] if bimodal
                      else ["hrrn", "promote_shortest", "short_request_first", "auto"])
        best = next(name for name in preference if name in better
                    and same_result(per_policy[name]["short_ttft_p95_ordered_ms"], lowest))
        c = per_policy[best]
        choice.partial_prefills, choice.policy_switched_from = "ordered", "default"
        choice.reason = (f"with partial_prefills = \"ordered\" {best} predicts a short TTFT P95 of "
                         f"{c['short_ttft_p95_ordered_ms']:,.0f} ms against default's {base:,.0f} ms, within the "
                         "limits: the order only pays off once partial prefills follow it")
        return best, choice
    c = per_policy.get(policy)
    if c is None:
        choice.reason = f"{policy} was not simulated with \"ordered\""
    elif c["supported"]:
        choice.partial_prefills = "ordered"
        choice.reason = (f"{policy} with \"ordered\" predicts a short TTFT P95 of "
                         f"{c['short_ttft_p95_ordered_ms']:,.0f} ms against {c['short_ttft_p95_first_ms']:,.0f} ms "
                         f"with \"first\" ({c['short_ttft_p95_gain']:.0%} lower), its long TTFT P95 "
                         f"{c['long_ttft_p95_ordered_ms']:,.0f} ms and throughput within the limits")
    elif not c["within_limits"]:
        choice.reason = f"with \"ordered\" {policy} is outside the limits: {c['excluded']}"
    else:
        choice.reason = (f"with \"ordered\" {policy} predicts a short TTFT P95 of "
                         f"{c['short_ttft_p95_ordered_ms']:,.0f} ms against {c['short_ttft_p95_first_ms']:,.0f} ms "
                         f"with \"first\", not a clear gain (within {tolerance}, or worse)")
    return policy, choice


def strict_ordered_warning(policy: str, long_max_wait_ms: float, partial_prefills: str) -> str | None:
    """The SPEC §3.6 warning when strict short-first is recommended with "ordered", else None."""
    if policy == "short_request_first" and partial_prefills == "ordered" and long_max_wait_ms == 0:
        return STRICT_ORDERED_WARNING
    return None


__all__ = ["ORDERED_POLICIES", "ORDERED_SUFFIX", "STRICT_ORDERED_WARNING", "OrderedChoice",
           "choose_partial_prefills", "ordered_label", "strict_ordered_warning"]
