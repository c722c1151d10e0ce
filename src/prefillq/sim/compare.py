"""Run several policies on the same workload(s) and collect what ``prefillq compare`` reports.

    setup = prepare_comparison(CompareSettings(scenario="long-first"))   # workload, profile, policies
    comparison = setup.run()                                           # -> Comparison (data only)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillq.config import load_config
from prefillq.metrics import RequestRecord, median_summary
from prefillq.sim.bound import METHOD as BOUND_METHOD
from prefillq.sim.bound import lower_bounds
from prefillq.sim.costs import Profile, load_profile
from prefillq.sim.pd import PdConfig
from prefillq.sim.simulator import MODES, TOPOLOGIES, SimResult, simulate
from prefillq.validation import check_choice, check_int
from prefillq.workload import Workload, load_trace, scenario

DEFAULT_POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first")
DEFAULT_SCENARIO = "long-first"
# A shorter arrival window is a burst (a backlog to clear), not a rate the engine has to sustain.
MIN_RATE_WINDOW_S = 1.0


class CompareError(ValueError):
    """A comparison that cannot be set up as asked (conflicting or out-of-range settings)."""


@dataclass
class Comparison:
    """Summaries per policy (median over repeats), records, timelines and the lower bounds on short TTFT."""

    workload: str
    profile: str
    mode: str
    budget: int
    repeats: int
    seed: int
    summaries: dict[str, dict[str, Any]]
    per_repeat: dict[str, list[dict[str, Any]]]
    records: dict[str, list[tuple[int, RequestRecord]]]
    last_runs: dict[str, SimResult]
    bound: dict[str, Any]
    workload_params: dict[str, Any] = field(default_factory=dict)


def compare_policies(make_workload: Callable[[int], Workload], policies: Sequence[str] = DEFAULT_POLICIES, *,
                     profile: str | Profile = "h100-qwen3.5-0.8b", budget: int | None = None, mode: str = "vllm",
                     repeats: int = 1, seed: int = 0, template_tokens: int = 0, max_num_seqs: int | None = None,
                     kv_blocks: int | None = None, topology: str = "mixed", pd: Any = None,
                     on_run_done: Callable[[str, int], None] | None = None) -> Comparison:
    """Simulate each policy on ``make_workload(seed + repeat)`` for every repeat."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    prof = load_profile(profile)
    budget_value = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget_value < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget_value}")
    per_repeat: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    records: dict[str, list[tuple[int, RequestRecord]]] = {p: [] for p in policies}
    last_runs: dict[str, SimResult] = {}
    bounds: list[dict[str, Any]] = []
    engines = pd.pairs if pd is not None else 1
    workload = None
    for repeat in range(repeats):
        workload = make_workload(seed + repeat)
        bounds.append(lower_bounds(workload, profile=prof, budget=budget_value, template_tokens=template_tokens,
                                   engines=engines))
        for policy in policies:
            result = simulate(workload, policy, profile=prof, budget=budget_value, mode=mode,
                              max_num_seqs=max_num_seqs, kv_blocks=kv_blocks, seed=seed + repeat,
                              template_tokens=template_tokens, topology=topology, pd=pd)
            per_repeat[policy].append(result.summary)
            records[policy].extend((repeat, rec) for rec in result.records)
            last_runs[policy] = result
            if on_run_done is not None:
                on_run_done(policy, repeat)
    assert workload is not None
    # each repeat's statistic is at least that repeat's bound, so the median of the bounds bounds the median
    bound_summary = median_summary([{k: v for k, v in b.items() if k not in ("ttft_s", "method")} for b in bounds])
    bound_summary["method"] = BOUND_METHOD
    bound_summary["ttft_s"] = bounds[-1]["ttft_s"]
    return Comparison(
        workload=workload.name, profile=prof.name, mode=mode, budget=budget_value, repeats=repeats, seed=seed,
        summaries={p: median_summary(per_repeat[p]) for p in policies}, per_repeat=per_repeat, records=records,
        last_runs=last_runs, bound=bound_summary, workload_params=dict(workload.params),
    )


@dataclass(frozen=True)
class CompareSettings:
    """Everything ``prefillq compare`` is asked: the workload source, the policies and the engine."""

    scenario: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)  # scenario parameters
    trace: Path | None = None
    rate_scale: float = 1.0
    limit: int | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    long_threshold: int | None = None
    policies: Sequence[str] = DEFAULT_POLICIES
    profile: str | Path | Profile = "h100-qwen3.5-0.8b"
    budget: int | None = None
    mode: str = "vllm"
    repeats: int = 1
    seed: int = 0
    template_tokens: int = 0
    max_num_seqs: int | None = None
    kv_blocks: int | None = None
    topology: str = "mixed"
    pd: PdConfig | None = None


@dataclass
class PreparedComparison:
    """A checked comparison, ready to run: its label, policies, profile and workload factory."""

    settings: CompareSettings
    label: str
    policies: list[str]
    profile: Profile
    make_workload: Callable[[int], Workload]
    warnings: list[str] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.policies) * self.settings.repeats

    def run(self, on_run_done: Callable[[str, int], None] | None = None) -> Comparison:
        s = self.settings
        return compare_policies(self.make_workload, self.policies, profile=self.profile, budget=s.budget, mode=s.mode,
                                repeats=s.repeats, seed=s.seed, template_tokens=s.template_tokens,
                                max_num_seqs=s.max_num_seqs, kv_blocks=s.kv_blocks, topology=s.topology, pd=s.pd,
                                on_run_done=on_run_done)


def prepare_comparison(settings: CompareSettings) -> PreparedComparison:
    """Check ``settings``, load the profile and build the workload factory (errors: ValueError subclasses)."""
    check_choice("mode", settings.mode, MODES, error=CompareError)
    check_choice("topology", settings.topology, TOPOLOGIES, error=CompareError)
    if settings.budget is not None:
        check_int("budget", settings.budget, minimum=1, error=CompareError)
    check_int("repeats", settings.repeats, minimum=1, error=CompareError)
    check_int("template_tokens", settings.template_tokens, error=CompareError)
    if (settings.pd is not None) != (settings.topology != "mixed"):
        raise CompareError("PD settings go with the 1p1d topology only (and it needs them)")
    names = [name.strip() for name in settings.policies if name.strip()]
    if not names:
        raise CompareError("no policies to compare")
    policies = list(dict.fromkeys(load_config(name).policy for name in names))  # ConfigError names a bad one
    profile = load_profile(settings.profile)
    label, make_workload = _workload_factory(settings)
    budget = profile.limit("max_num_batched_tokens") if settings.budget is None else settings.budget
    warning = prefill_load_warning(make_workload(settings.seed), profile, budget, settings)
    return PreparedComparison(settings, label, policies, profile, make_workload, [warning] if warning else [])


def prefill_load_warning(workload: Workload, profile: Profile, budget: int, settings: CompareSettings) -> str | None:
    """A warning when the workload offers more prompt tokens per second than the engine can prefill.

    The capacity is the best case (full-budget steps, no attention or decode cost, every prefill node
    busy), so a workload over it is overloaded for sure: its queues grow for as long as requests
    arrive. Bursts (arrival window under ``MIN_RATE_WINDOW_S``) are left alone.
    """
    requests = workload.requests
    window_s = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    if window_s < MIN_RATE_WINDOW_S:
        return None
    offered = sum(r.prompt_tokens + settings.template_tokens for r in requests) / window_s
    capacity = budget / profile.cost.step_latency(budget, 0.0, 0, 0)
    if settings.pd is not None:
        capacity *= settings.pd.pairs  # every pair's prefill node prefills
    factor = offered / capacity
    if factor <= 1.0:
        return None
    if settings.trace is not None:
        advice = f"replay it slower, e.g. --rate-scale {settings.rate_scale / factor:.2g} or lower"
    elif "rate" in workload.params:
        advice = f"lower its rate, e.g. --set rate={float(workload.params['rate']) / factor:.3g} or lower"
    else:
        advice = "offer fewer requests per second"
    return (f"the workload offers {factor:.1f}x the engine's prefill capacity ({offered:,.0f} vs {capacity:,.0f} "
            f"prompt tokens/s at budget {budget}), so its queues grow for as long as requests arrive; {advice}")


def _workload_factory(settings: CompareSettings) -> tuple[str, Callable[[int], Workload]]:
    """The label and the seed -> workload function of a scenario or a trace (built once here to check it)."""
    if settings.trace is None:
        name = settings.scenario or DEFAULT_SCENARIO
        overrides = dict(settings.overrides)
        scenario(name, seed=settings.seed, **overrides)  # WorkloadError for a bad name or parameter

        def make_scenario(run_seed: int) -> Workload:
            return scenario(name, seed=run_seed, **overrides)

        return f"scenario {name}", make_scenario
    if settings.scenario is not None:
        raise CompareError("give either a scenario or a trace, not both")
    if settings.overrides:
        raise CompareError("scenario parameter overrides apply to scenarios, not traces")
    trace = load_trace(settings.trace, rate_scale=settings.rate_scale, limit=settings.limit, start_s=settings.start_s,
                       duration_s=settings.duration_s, long_threshold=settings.long_threshold)
    if not trace.requests:
        raise CompareError(f"{settings.trace}: no requests in the selected window")
    return f"trace {trace.name}", lambda _seed: trace


def workload_split(comparison: Comparison) -> dict[str, Any]:
    """How requests were classed short/long: a trace's ``{"threshold", "method"}`` (method ``user`` for
    ``--long-threshold``, ``recorded`` for bench records' own classes, else how the threshold ``prefillq tune``
    would choose was found), or method ``scenario`` (the scenario defines each request's class)."""
    split = comparison.workload_params.get("split")
    return dict(split) if split else {"threshold": None, "method": "scenario"}


def comparison_details(settings: CompareSettings, comparison: Comparison) -> dict[str, Any]:
    """The settings and per-repeat data that go into the JSON summary next to the policies' figures."""
    details: dict[str, Any] = {
        "mode": settings.mode, "budget": comparison.budget, "repeats": settings.repeats, "seed": settings.seed,
        "template_tokens": settings.template_tokens, "workload": comparison.workload_params,
        "per_repeat": comparison.per_repeat, "topology": settings.topology, "split": workload_split(comparison),
    }
    if settings.pd is not None:
        details["pd"] = {**settings.pd.to_dict(), "busy_retry_timeout_s": settings.pd.retry_timeout_s()}
        details["pd_stats"] = {policy: run.pd for policy, run in comparison.last_runs.items()}
    return details
