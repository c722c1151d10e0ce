"""Step 3 of the recipe: the candidate simulations and the choice of a policy among them.

:func:`simulate_candidates` runs strict short-first (which measures ``W_normal``), derives
``long_max_wait_ms`` from it, then runs ``default``, ``promote_shortest``, ``hrrn`` and the tuned
``short_request_first`` on the same window, and the reordering ones again with ``partial_prefills =
"ordered"``; :func:`choose_policy` recommends one (rules in its docstring), and
:func:`prefillq.tune.ordered.choose_partial_prefills` decides whether to run it "ordered".
:class:`TuneResult` is everything the recipe found, and its JSON.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.tune.threshold import LaneShares, ThresholdChoice, TuneError
from prefillq.tune.wait import DEFAULT_W_SLO_MS, WaitChoice, choose_long_max_wait

SAME_RESULT_TOLERANCE = 0.05
"""Policies whose short TTFT P95 is within 5% (or 5 ms) of each other are treated as equal."""
SAME_RESULT_ABS_MS = 5.0
NO_VALLEY_MARGIN = 0.25
"""Without a clear valley, a threshold-free policy within 25% of short_request_first's short TTFT P95 wins."""
THROUGHPUT_LOSS_MAX = 0.03
"""A policy that loses more than 3% of default's output throughput is not recommended."""
SIM_REQUEST_TARGET = 4000
"""Windows are sized to hold about this many requests, so that the five simulations finish quickly."""
POLICIES_SIMULATED = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
LIGHTLLM_STRATEGIES = ("default", "promote_shortest", "hrrn")
ORDERED_POLICIES = ("promote_shortest", "hrrn", "short_request_first", "auto")
"""Simulated a second time with ``partial_prefills = "ordered"`` (``default`` keeps arrival order either way)."""
ORDERED_SUFFIX = " (ordered)"
STRICT_LABEL = "short_request_first (strict)"
"""The summaries' key of the strict short-first run (``long_max_wait_ms = 0``) that measures W_normal."""


@dataclass
class PolicyChoice:
    policy: str
    reason: str
    excluded: dict[str, str] = field(default_factory=dict)   # policy -> why it was not eligible
    lightllm_strategy: str = "default"                       # best of LightLLM's three
    lightllm_reason: str = ""


def ordered_label(policy: str) -> str:
    """The summaries' key of ``policy``'s run with ``partial_prefills = "ordered"``."""
    return f"{policy}{ORDERED_SUFFIX}"


def metric_or_inf(summary: dict[str, Any], key: str) -> float:
    """A summary figure as a float; a missing or NaN one is +inf (it sorts last, never wins)."""
    value = summary.get(key)
    return math.inf if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def same_result(a: float, b: float) -> bool:
    return abs(a - b) <= max(SAME_RESULT_ABS_MS, SAME_RESULT_TOLERANCE * max(abs(a), abs(b)))


def eligibility(summaries: dict[str, dict[str, Any]], w_slo_ms: float) -> tuple[list[str], dict[str, str]]:
    """The eligible policies, and why each of the others is not (throughput loss or long TTFT)."""
    base = summaries["default"]
    base_tp = metric_or_inf(base, "output_tokens_per_s")
    base_long = metric_or_inf(base, "long_ttft_p95_ms")
    excluded: dict[str, str] = {}
    eligible: list[str] = []
    for name, summary in summaries.items():
        tp = metric_or_inf(summary, "output_tokens_per_s")
        long_p95 = metric_or_inf(summary, "long_ttft_p95_ms")
        if name != "default" and math.isfinite(base_tp) and tp < (1 - THROUGHPUT_LOSS_MAX) * base_tp:
            excluded[name] = (f"loses {1 - tp / base_tp:.1%} of output throughput "
                              f"(limit {THROUGHPUT_LOSS_MAX:.0%})")
        elif name != "default" and math.isfinite(base_long) and long_p95 > base_long + w_slo_ms:
            excluded[name] = (f"long TTFT P95 {long_p95:,.0f} ms exceeds default's {base_long:,.0f} ms by "
                              f"more than W_slo = {w_slo_ms:,.0f} ms")
        else:
            eligible.append(name)
    return eligible, excluded


def choose_policy(summaries: dict[str, dict[str, Any]], *, bimodal: bool,
                  w_slo_ms: float = DEFAULT_W_SLO_MS) -> PolicyChoice:
    """Recommend a policy from simulated summaries (keys of :func:`prefillq.metrics.summarize`).

    Rules, in order: a policy is *eligible* if it keeps at least 97% of default's output throughput and
    its long-request TTFT P95 exceeds default's by no more than ``W_slo``. Among eligible policies the
    lowest short-request TTFT P95 wins; results within 5% (or 5 ms) count as equal. If nothing beats
    default by more than that, keep ``default``. Among equals, prefer ``short_request_first`` when the
    histogram has a clear valley (the split fits the traffic) and ``hrrn`` when it has none (no threshold
    to go stale; starvation bounded by work done). Without a valley, ``short_request_first`` must also
    beat the threshold-free policies by more than :data:`NO_VALLEY_MARGIN`.
    """
    if "default" not in summaries:
        raise TuneError("choose_policy needs the default policy's summary as the baseline")
    eligible, excluded = eligibility(summaries, w_slo_ms)

    def key(name: str) -> tuple[float, float]:
        return (metric_or_inf(summaries[name], "short_ttft_p95_ms"),
                metric_or_inf(summaries[name], "short_ttft_p50_ms"))

    best = min(eligible, key=key)
    base_short = key("default")[0]
    best_short = key(best)[0]
    preference = (["short_request_first", "hrrn", "promote_shortest", "auto"] if bimodal
                  else ["hrrn", "promote_shortest", "short_request_first", "auto"])
    lightllm = _lightllm_choice(summaries, eligible, preference)
    if best == "default" or same_result(best_short, base_short):
        return _keep_default(excluded, best, {name: key(name)[0] for name in summaries})
    equals = [name for name in eligible if name != "default" and same_result(key(name)[0], best_short)]
    chosen = next(name for name in [*preference, best] if name in equals or name == best)
    gain = 1 - key(chosen)[0] / base_short if base_short > 0 else 0.0
    tie = f"{', '.join(equals)} predict about the same short TTFT P95 (within {SAME_RESULT_TOLERANCE:.0%})"
    if chosen == best and len(equals) <= 1:
        within = " of the policies within the limits" if excluded else ""
        why = (f"it predicts the lowest short-request TTFT P95{within} ({key(chosen)[0]:,.0f} ms, {gain:.0%} "
               "below default)")
    elif chosen == "hrrn":
        why = (f"{tie}; the prompt lengths have no clear valley, so a short/long threshold would be a guess "
               "that drifts with the traffic, while hrrn needs no threshold and bounds starvation by work "
               "done")
    elif chosen == "short_request_first":
        why = (f"{tie}; the prompt lengths have a clear valley, which is what the short/long split is built "
               "for, and long_max_wait_ms bounds the long requests' extra wait in milliseconds")
    else:
        why = f"{tie}; {chosen} is preferred among them"
    if chosen == "short_request_first" and not bimodal:
        chosen, why = _threshold_free_alternative(chosen, why, eligible, {name: key(name)[0] for name in eligible})
    return PolicyChoice(policy=chosen, reason=why, excluded=excluded, lightllm_strategy=lightllm[0],
                        lightllm_reason=lightllm[1])


def _keep_default(excluded: dict[str, str], best: str, short_p95: dict[str, float]) -> PolicyChoice:
    """No eligible policy beats default clearly: keep it, and say whether an excluded one would have."""
    base_short = short_p95["default"]
    better_but_excluded = [name for name in excluded
                           if short_p95[name] < base_short and not same_result(short_p95[name], base_short)]
    if better_but_excluded:
        listed = ", ".join(f"{name} ({short_p95[name]:,.0f} ms)" for name in better_but_excluded)
        reason = (f"{listed} would cut short TTFT P95 below default's {base_short:,.0f} ms, but at a cost "
                  "beyond the limits below; no policy within them does clearly better, so keep default "
                  "(FCFS), and look at capacity")
    else:
        reason = (f"no policy predicts a short TTFT P95 clearly better than default's {base_short:,.0f} ms "
                  f"(best: {best} at {short_p95[best]:,.0f} ms, within {SAME_RESULT_TOLERANCE:.0%} or "
                  f"{SAME_RESULT_ABS_MS:g} ms): the waiting queue is rarely long enough for its order to "
                  "matter, so keep default (FCFS); re-run with --rate-scale to see what changes at higher "
                  "load")
    return PolicyChoice(policy="default", excluded=excluded, lightllm_strategy="default",
                        lightllm_reason="no strategy clearly beats default within the limits on this "
                        "trace", reason=reason)


def _threshold_free_alternative(chosen: str, why: str, eligible: list[str],
                                short_p95: dict[str, float]) -> tuple[str, str]:
    """Without a valley the threshold is a percentile guess: prefer a threshold-free policy that comes close."""
    base_short = short_p95["default"]
    alternatives = [name for name in ("hrrn", "promote_shortest", "auto") if name in eligible
                    and short_p95[name] <= (1 + NO_VALLEY_MARGIN) * short_p95[chosen]
                    and not same_result(short_p95[name], base_short)]
    if not alternatives:
        return chosen, why
    alternative = min(alternatives, key=lambda name: short_p95[name])
    why = (f"short_request_first predicts the lowest short TTFT P95 ({short_p95[chosen]:,.0f} ms), but the "
           "prompt lengths have no clear valley, so its threshold is a percentile guess that will "
           f"drift with the traffic; {alternative} needs no threshold and comes within "
           f"{NO_VALLEY_MARGIN:.0%} of it ({short_p95[alternative]:,.0f} ms, "
           f"{1 - short_p95[alternative] / base_short:.0%} below default)")
    return alternative, why


def _lightllm_choice(summaries: dict[str, dict[str, Any]], eligible: list[str],
                     preference: list[str]) -> tuple[str, str]:
    candidates = [name for name in eligible if name in LIGHTLLM_STRATEGIES]
    if not candidates:
        return "default", "no LightLLM strategy is eligible"

    def p95(name: str) -> float:
        return metric_or_inf(summaries[name], "short_ttft_p95_ms")

    best = min(candidates, key=p95)
    if best == "default" or same_result(p95(best), p95("default")):
        return "default", "no LightLLM strategy clearly beats default within the limits on this trace"
    equals = [name for name in candidates if name != "default" and same_result(p95(name), p95(best))]
    chosen = next(name for name in [*preference, best] if name in equals or name == best)
    if chosen == best:
        return chosen, f"lowest predicted short TTFT P95 among LightLLM's strategies ({p95(chosen):,.0f} ms)"
    return chosen, (f"short TTFT P95 {p95(chosen):,.0f} ms, within {SAME_RESULT_TOLERANCE:.0%} of {best}'s "
                    f"{p95(best):,.0f} ms and preferred on a tie")


# --- the candidate simulations -----------------------------------------------------------------

Progress = Callable[[str, float, int], None]
"""progress(label, done, total): ``done`` counts finished simulations (fractions while one runs)."""


class _WarningLog(logging.Handler):
    """Collects the policy warnings (e.g. short_request_first's degradation warning) of one simulation."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _policy_warnings() -> Iterator[_WarningLog]:
    """Count the ``prefillq`` logger's warnings instead of printing them in the middle of the output."""
    logger = logging.getLogger("prefillq")
    handler = _WarningLog()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@dataclass
class CandidateRuns:
    """What the simulations of one tuning found."""

    strict: Any                               # the strict short-first run (its result object)
    wait: WaitChoice                          # long_max_wait_ms, from the strict run's long waits
    tuned: PolicyConfig                       # short_request_first with the threshold and that wait
    summaries: dict[str, dict[str, Any]]      # per policy of POLICIES_SIMULATED, the ordered runs, STRICT_LABEL
    default_long_waits: list[float]           # the long requests' queue waits under default (s)
    warnings: dict[str, int]                  # policy warnings logged per run


def _summary(result: Any, slo: Any) -> dict[str, Any]:
    """A run's summary, with its TTFT-SLO goodput when an SLO is given (``prefillq.slo.TtftSlo``)."""
    summary = dict(result.summary)
    if slo is not None and getattr(result, "records", None) is not None:
        from prefillq.metrics import ttft_goodput

        summary.update(ttft_goodput(result.records, slo))
    return summary


def _simulate_candidate(job: tuple[Callable[..., Any], Any, PolicyConfig, dict[str, Any], Any]) -> tuple[Any, Any, int]:
    """One candidate run in a worker: (its summary, its long requests' waits, its policy warnings)."""
    simulate, window, config, kwargs, slo = job
    with _policy_warnings() as log:
        result = simulate(window, config, **kwargs)
    return _summary(result, slo), list(result.long_waits_s), len(log.messages)


def simulate_candidates(window: Any, threshold: int, *, simulate: Callable[..., Any],
                        sim_kwargs: dict[str, Any], w_slo_ms: float, favor: str,
                        progress: Progress | None = None, executor: Any = None, slo: Any = None) -> CandidateRuns:
    """Strict short-first, the wait derived from it, then every policy of :data:`POLICIES_SIMULATED`,
    then those of :data:`ORDERED_POLICIES` again with ``partial_prefills = "ordered"`` (keys from
    :func:`ordered_label`).

    With an ``executor`` (``prefillq.sweep.executors``) the policies' runs after the strict one go
    through it (in parallel); the results are the same.
    """
    names = [*POLICIES_SIMULATED, *(ordered_label(name) for name in ORDERED_POLICIES)]
    total = 1 + len(names)

    def step(label: str, done: float) -> None:
        if progress is not None:
            progress(label, done, total)

    reports_progress = "progress" in inspect.signature(simulate).parameters
    warnings: dict[str, int] = {}

    def run(label: str, done: int, config: PolicyConfig) -> Any:
        step(label, done)
        kwargs = dict(sim_kwargs)
        if reports_progress:
            kwargs["progress"] = lambda fraction: step(label, done + min(max(fraction, 0.0), 1.0))
        with _policy_warnings() as log:
            result = simulate(window, config, **kwargs)
        warnings[label] = len(log.messages)
        return result

    strict = run(STRICT_LABEL, 0, PolicyConfig("short_request_first", threshold=threshold, long_max_wait_ms=0.0))
    wait = choose_long_max_wait(strict.long_waits_s, w_slo_ms=w_slo_ms, favor=favor)
    tuned = PolicyConfig("short_request_first", threshold=threshold, long_max_wait_ms=wait.long_max_wait_ms)
    summaries: dict[str, dict[str, Any]] = {}
    default_long_waits: list[float] = []
    configs = [tuned if name == "short_request_first" else PolicyConfig(name) for name in POLICIES_SIMULATED]
    configs += [configs[POLICIES_SIMULATED.index(name)].with_(partial_prefills="ordered")
                for name in ORDERED_POLICIES]
    if executor is not None:
        jobs = [(simulate, window, config, dict(sim_kwargs), slo) for config in configs]
        runs = executor.map(_simulate_candidate, jobs, on_done=lambda done, _total: step("policies", 1 + done))
    else:
        runs = []
        for done, (name, config) in enumerate(zip(names, configs, strict=True), start=1):
            result = run(name, done, config)
            runs.append((_summary(result, slo), list(result.long_waits_s), warnings.pop(name)))
    for name, (summary, long_waits, warned) in zip(names, runs, strict=True):
        summaries[name] = summary
        warnings[name] = warned
        if name == "default":
            default_long_waits = long_waits
    step("done", total)
    summaries[STRICT_LABEL] = dict(strict.summary)
    return CandidateRuns(strict=strict, wait=wait, tuned=tuned, summaries=summaries,
                         default_long_waits=default_long_waits, warnings=warnings)


# --- the result --------------------------------------------------------------------------------

@dataclass
class TuneResult:
    """Everything ``prefillq tune`` found; :meth:`to_dict` is the JSON written by ``--json``."""

    trace: dict[str, Any]
    threshold: ThresholdChoice
    lanes: LaneShares
    window: dict[str, Any]
    simulation: dict[str, Any]
    wait: WaitChoice
    choice: PolicyChoice
    summaries: dict[str, dict[str, Any]]
    configs: dict[str, str]
    explanation: list[str]
    prompt_lengths: list[int] = field(default_factory=list, repr=False)
    ordered: Any = None                     # prefillq.tune.ordered.OrderedChoice
    warnings: list[str] = field(default_factory=list)

    @property
    def partial_prefills(self) -> str:
        return getattr(self.ordered, "partial_prefills", "first")

    @property
    def policy(self) -> str:
        return self.choice.policy

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.choice.policy,
            "threshold": self.threshold.threshold,
            "threshold_method": self.threshold.method,
            "long_max_wait_ms": self.wait.long_max_wait_ms,
            "w_normal_p90_ms": self.wait.w_normal_p90_ms,
            "w_normal_p95_ms": self.wait.w_normal_p95_ms,
            "w_slo_ms": self.wait.w_slo_ms,
            "favor": self.wait.favor,
            "capacity_problem": self.wait.capacity_problem,
            "bimodal": self.threshold.bimodal,
            "partial_prefills": self.partial_prefills,
            "warnings": list(self.warnings),
            "lightllm_strategy": self.choice.lightllm_strategy,
            "lanes": asdict(self.lanes),
            "trace": self.trace,
            "window": self.window,
            "simulation": self.simulation,
            "threshold_detail": asdict(self.threshold),
            "wait_detail": asdict(self.wait),
            "policy_detail": asdict(self.choice),
            "partial_prefills_detail": asdict(self.ordered) if self.ordered is not None else None,
            "predicted": self.summaries,
            "configs": self.configs,
            "explanation": self.explanation,
        }

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_jsonable(self.to_dict()), indent=2, sort_keys=False) + "\n")
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _jsonable(value.item())
    return value
