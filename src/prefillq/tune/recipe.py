"""The whole recipe (SPEC §3.5) on a trace: threshold, simulation window, candidate runs, choice, configs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from prefillq.metrics import percentile
from prefillq.tune.choose import (
    ORDERED_POLICIES,
    POLICIES_SIMULATED,
    SIM_REQUEST_TARGET,
    STRICT_LABEL,
    Progress,
    TuneResult,
    choose_policy,
    metric_or_inf,
    ordered_label,
    simulate_candidates,
)
from prefillq.tune.ordered import choose_partial_prefills, strict_ordered_warning
from prefillq.tune.render import explain, render_configs
from prefillq.tune.threshold import LaneShares, TuneError, choose_threshold, lane_shares
from prefillq.tune.wait import DEFAULT_W_SLO_MS, FAVOR_POSITION, WaitChoice
from prefillq.workload.split import prompt_class


def reclassify(workload: Any, threshold: int) -> Any:
    """A copy of ``workload`` whose request classes follow ``threshold`` (``<= threshold`` is short)."""
    requests = [replace(r, klass=prompt_class(r.prompt_tokens, threshold)) for r in workload.requests]
    params = dict(workload.params)
    params["long_threshold"] = int(threshold)
    return type(workload)(name=workload.name, requests=requests, params=params)


def simulation_window(workload: Any, *, window_s: float | None = None,
                      target_requests: int = SIM_REQUEST_TARGET) -> tuple[Any, dict[str, Any]]:
    """The part of the trace to simulate, shifted to start at 0, and a description of it.

    ``window_s`` = 0 means the whole trace. ``None`` (auto) keeps the whole trace when it holds at most
    ``target_requests`` requests; otherwise the window is as long as ``target_requests`` requests last on
    average, placed where the offered prefill tokens are highest (the busiest stretch is where the queue
    order matters and where the wait gate must hold).
    """
    requests = workload.requests
    if not requests:
        raise TuneError("the trace has no requests to simulate")
    first, last = requests[0].arrival_s, requests[-1].arrival_s
    span = max(last - first, 1e-9)
    if window_s is not None and window_s < 0:
        raise TuneError(f"window must be >= 0 seconds, got {window_s!r}")
    if window_s == 0 or (window_s is None and len(requests) <= target_requests) or \
            (window_s is not None and window_s >= span):
        description = f"the whole trace ({len(requests):,} requests, {span:,.0f} s)"
        return workload, {"start_s": first, "end_s": last, "requests": len(requests), "whole_trace": True,
                          "description": description, "selection": "whole"}
    length = float(window_s) if window_s is not None else span * target_requests / len(requests)
    # Two pointers over arrivals: the window [t, t + length) starting at a request with the most tokens.
    best_start, best_tokens, tokens, j = 0, -1, 0, 0
    for i, request in enumerate(requests):
        while j < len(requests) and requests[j].arrival_s < request.arrival_s + length:
            tokens += requests[j].prompt_tokens
            j += 1
        if tokens > best_tokens:
            best_start, best_tokens = i, tokens
        tokens -= request.prompt_tokens
    start = requests[best_start].arrival_s
    chosen = [r for r in requests if start <= r.arrival_s < start + length]
    shifted = [replace(r, arrival_s=round(r.arrival_s - start, 9)) for r in chosen]
    params = dict(workload.params)
    params.update({"window_start_s": start, "window_s": length})
    window = type(workload)(name=f"{workload.name}[{start:.0f}s+{length:.0f}s]", requests=shifted,
                            params=params)
    description = (f"the busiest {length:,.0f} s of the trace ({start:,.0f}-{start + length:,.0f} s of the "
                   f"replayed timeline, {len(chosen):,} of {len(requests):,} requests, the most prefill "
                   "tokens of any window that long)")
    return window, {"start_s": start, "end_s": start + length, "requests": len(chosen), "whole_trace": False,
                    "description": description, "selection": "busiest"}



def tune(
    workload: Any,
    *,
    profile: str | None = None,
    budget: int | None = None,
    w_slo_ms: float = DEFAULT_W_SLO_MS,
    favor: str = "short",
    window_s: float | None = None,
    simulate: Callable[..., Any] | None = None,
    progress: Progress | None = None,
    executor: Any = None,
    ttft_slo: Any = None,
) -> TuneResult:
    """Run the whole recipe on a :class:`prefillq.workload.Workload` (see :mod:`prefillq.tune`).

    ``executor`` (``prefillq.sweep.make_executor(...)``) runs the candidate simulations in parallel;
    None runs them here, one after another. The result is the same. With ``ttft_slo`` (a
    ``prefillq.slo.TtftSlo``) every run reports its goodput and the configuration that maximises it is
    recommended (:mod:`prefillq.tune.goodput`).
    """
    if favor not in FAVOR_POSITION:
        raise TuneError(f"favor must be 'short' or 'long', got {favor!r}")
    if not (isinstance(w_slo_ms, int | float) and math.isfinite(w_slo_ms) and w_slo_ms > 0):
        raise TuneError(f"the long-request SLO must be a positive number of ms, got {w_slo_ms!r}")
    if not workload.requests:
        raise TuneError(f"{workload.params.get('trace', workload.name)}: the trace has no requests")
    if simulate is None:
        from prefillq.sim import simulate as simulate_default

        simulate = simulate_default
    lengths = [r.prompt_tokens for r in workload.requests]
    threshold = choose_threshold(lengths)
    lanes = lane_shares(lengths, threshold.threshold)
    window, window_info = simulation_window(reclassify(workload, threshold.threshold), window_s=window_s)

    sim_kwargs: dict[str, Any] = {}
    if profile is not None:
        sim_kwargs["profile"] = profile
    if budget is not None:
        sim_kwargs["budget"] = budget
    runs = simulate_candidates(window, threshold.threshold, simulate=simulate, sim_kwargs=sim_kwargs,
                               w_slo_ms=w_slo_ms, favor=favor, progress=progress, executor=executor,
                               slo=ttft_slo)
    wait, summaries = runs.wait, runs.summaries
    choice = choose_policy({k: summaries[k] for k in POLICIES_SIMULATED}, bimodal=threshold.bimodal,
                           w_slo_ms=w_slo_ms)
    policy, ordered = choose_partial_prefills(summaries, choice.policy, bimodal=threshold.bimodal,
                                              w_slo_ms=w_slo_ms)
    if policy != choice.policy:
        choice = replace(choice, policy=policy, reason="with \"first\" no policy beats default clearly, but "
                         + ordered.reason)
    if ttft_slo is not None:
        policy, choice, ordered = _goodput_choice(summaries, ttft_slo, choice, ordered)
    warning = strict_ordered_warning(policy, wait.long_max_wait_ms, ordered.partial_prefills)
    ordered.warnings = [warning] if warning else []
    limits = getattr(runs.strict, "limits", None)
    simulation = {"profile": getattr(runs.strict, "profile", profile),
                  "budget": getattr(limits, "max_num_batched_tokens", budget),
                  "policies": list(POLICIES_SIMULATED), "strict_short_request_first": STRICT_LABEL,
                  "ordered_runs": [ordered_label(name) for name in ORDERED_POLICIES],
                  "tuned_short_request_first": runs.tuned.to_dict(), "policy_warnings": runs.warnings,
                  "ttft_slo": None if ttft_slo is None else str(ttft_slo)}
    offered = _offered_load(window)
    simulation.update(offered)
    if wait.capacity_problem or wait.near_slo:
        wait.evidence = _capacity_evidence(wait, summaries, runs.default_long_waits, lanes, offered)
    configs = render_configs(choice.policy, threshold.threshold, wait.long_max_wait_ms,
                             lightllm_strategy=choice.lightllm_strategy, partial_prefills=ordered.partial_prefills)
    result = TuneResult(trace=_trace_info(workload, threshold.percentiles, lengths), threshold=threshold,
                        lanes=lanes, window=window_info, simulation=simulation, wait=wait, choice=choice,
                        summaries=summaries, configs=configs, explanation=[], prompt_lengths=lengths,
                        ordered=ordered, warnings=list(ordered.warnings))
    result.explanation = explain(result)
    return result


def _goodput_choice(summaries: dict[str, dict[str, Any]], slo: Any, choice: Any, ordered: Any) -> tuple[str, Any, Any]:
    """Replace the short-TTFT recommendation by the goodput-maximising one (SPEC §6)."""
    from prefillq.tune.goodput import choose_by_goodput

    best = choose_by_goodput(summaries, slo, usual=(choice.policy, ordered.partial_prefills))
    if (best.policy, best.partial_prefills) != (choice.policy, ordered.partial_prefills):
        ordered = replace(ordered, partial_prefills=best.partial_prefills,
                          reason=f"partial_prefills = \"{best.partial_prefills}\" is part of the configuration "
                                 "with the highest goodput")
    return best.policy, replace(choice, policy=best.policy, reason=best.reason), ordered


def _trace_info(workload: Any, percentiles: dict[str, float], lengths: list[int]) -> dict[str, Any]:
    return {
        "path": str(workload.params.get("trace", workload.name)),
        "format": workload.params.get("format"),
        "requests": len(workload.requests),
        "duration_s": workload.duration_s,
        "rate_scale": workload.params.get("rate_scale", 1.0),
        "prompt_tokens": {k: round(v, 1) for k, v in percentiles.items()}
        | {"min": min(lengths), "max": max(lengths)},
    }


def _offered_load(window: Any) -> dict[str, Any]:
    requests = window.requests
    span = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9) if requests else 0.0
    tokens = sum(r.prompt_tokens for r in requests)
    return {"window_requests": len(requests), "window_s": span,
            "offered_prefill_tokens_per_s": tokens / span if span else 0.0,
            "offered_requests_per_s": len(requests) / span if span else 0.0}


def _capacity_evidence(wait: WaitChoice, summaries: dict[str, dict[str, Any]],
                       default_long_waits: Sequence[float], lanes: LaneShares,
                       offered: dict[str, Any]) -> list[str]:
    evidence = [f"long requests' queue wait under strict short-first: P90 {wait.w_normal_p90_ms:,.0f} ms, "
                f"P95 {wait.w_normal_p95_ms:,.0f} ms (W_slo {wait.w_slo_ms:,.0f} ms)"]
    if default_long_waits:
        fcfs_p95 = percentile([wait_s * 1000.0 for wait_s in default_long_waits], 95)
        added = wait.w_normal_p95_ms - fcfs_p95
        if fcfs_p95 >= wait.w_slo_ms:
            verdict = "so they exceed W_slo even without any reordering: capacity is short for this traffic"
        elif added >= 0.5 * wait.w_slo_ms:
            verdict = (f"so short requests overtaking them add ~{added:,.0f} ms: the long lane is starved by the "
                       "short lane's load; a higher threshold leaves fewer, longer requests in the long lane "
                       "and fewer aged-long promotions")
        else:
            verdict = "so most of the wait is load, not reordering: capacity is close to its limit"
        evidence.append(f"the same requests under default (FCFS) wait {fcfs_p95:,.0f} ms at P95, {verdict}")
    base = summaries.get("default", {})
    strict = summaries.get(STRICT_LABEL, {})
    evidence.append(f"long TTFT P95: {metric_or_inf(base, 'long_ttft_p95_ms'):,.0f} ms under default, "
                    f"{metric_or_inf(strict, 'long_ttft_p95_ms'):,.0f} ms under strict short-first")
    evidence.append(f"the long lane holds {lanes.long_request_share:.0%} of the requests and "
                    f"{lanes.long_token_share:.0%} of the prefill tokens; offered load "
                    f"{offered['offered_prefill_tokens_per_s']:,.0f} prompt tokens/s")
    return evidence


