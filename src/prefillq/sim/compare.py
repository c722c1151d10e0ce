"""Run several policies on the same workload(s) and collect what ``prefillq compare`` reports.

    setup = prepare_comparison(CompareSettings(scenario="long-first"))   # workload, profile, policies
    comparison = setup.run()                                           # -> Comparison (data only)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from prefillq.config import PEER_POLICIES, PolicyConfig, load_config, parse_policy_spec
from prefillq.metrics import RequestRecord, median_summary
from prefillq.sim.background import Background
from prefillq.sim.bound import METHOD as BOUND_METHOD
from prefillq.sim.bound import lower_bounds
from prefillq.sim.clairvoyant import SCHEDULES, achievable_summary, schedule_figures, start_schedules
from prefillq.sim.costs import Profile, default_profile, load_profile
from prefillq.sim.pd import PdConfig
from prefillq.sim.recommend import LONG_TTFT_P95_MAX_CHANGE, cost_error_of, emulations, recommend, vllm_command
from prefillq.sim.records import CLASS_FIGURES, RepeatRecords, class_key
from prefillq.sim.simulator import MODES, TOPOLOGIES, SimResult, prefix_cache_setting, simulate
from prefillq.sim.vllm import SCHEDULING_POLICIES
from prefillq.validation import check_choice, check_int, check_number, reject_unknown_keys
from prefillq.workload import Workload, load_trace, scenario

DEFAULT_POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first")
# Without --policies/--policy, compare adds auto beside them, with ordered partial prefills on vLLM (LightLLM's
# engine orders partial prefills by the strategy anyway): the row the recommendation most often lands on.
AUTO_ROW = {"vllm": "auto:partial_prefills=ordered", "lightllm": "auto"}
DEFAULT_SCENARIO = "long-first"
# ``--policies peers`` (alone or in a list): stock default, the auto row and every other engine's option that
# prefillq emulates (policies/peers/, docs/peers.md).
PEER_GROUP = "peers"
# A shorter arrival window is a burst (a backlog to clear), not a rate the engine has to sustain.
MIN_RATE_WINDOW_S = 1.0
# A short_request_first row whose threshold puts more than this share of the requests and of the prompt
# tokens in one lane is (nearly) the default order: the lane-split warning names it.
LANE_SHARE_MAX = 0.95


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
    records: dict[str, Sequence[tuple[int, RequestRecord]]]
    last_runs: dict[str, SimResult]
    bound: dict[str, Any]
    workload_params: dict[str, Any] = field(default_factory=dict)
    configs: dict[str, PolicyConfig] = field(default_factory=dict)   # each row's configuration, by label
    baseline: str | None = None     # the row '% vs default' is measured against (None: no plain default row)
    warnings: list[str] = field(default_factory=list)
    achievable: dict[str, Any] | None = None  # the clairvoyant reference (sim/clairvoyant.py); None: not run


def compare_policies(make_workload: Callable[[int], Workload],
                     policies: Sequence[str] | Mapping[str, PolicyConfig] = DEFAULT_POLICIES, *,
                     profile: str | Profile | None = None, budget: int | None = None, mode: str = "vllm",
                     repeats: int = 1, seed: int = 0, template_tokens: int = 0, max_num_seqs: int | None = None,
                     kv_blocks: int | None = None, long_prefill_token_threshold: int | None = None,
                     topology: str = "mixed", pd: Any = None, fleet: Any = None,
                     row_fleets: Mapping[str, Any] | None = None, prefix_cache: bool | None = None,
                     on_run_done: Callable[[str, int], None] | None = None,
                     engine_options: Mapping[str, Any] | None = None, achievable: bool = True,
                     jobs: int | None = 1, on_progress: Callable[[float], None] | None = None) -> Comparison:
    """Simulate each row on ``make_workload(seed + repeat)`` for every repeat.

    ``policies`` maps row labels to configurations, or lists policy names (each its own label). The
    numbers depend on the configuration only, never on the label. ``fleet`` (a ``FleetConfig``) runs
    every row on a fleet of replicas, ``row_fleets`` some rows on their own fleet (e.g. another gateway).
    ``engine_options`` go to the engine model (``mode="lightllm"``: ``schedule``, ``router_tick_s``,
    ``prefill_token_gate``). ``achievable`` also runs the clairvoyant reference schedules
    (``sim/clairvoyant.py``; not on the 1p1d topology), one more simulation each per repeat. With
    ``jobs`` > 1 those run in up to ``jobs - 1`` worker processes while this one runs the rows, with
    ``jobs=None`` each in a worker of its own (where processes can be forked; elsewhere, and with
    ``jobs=1``, here after the rows). The numbers are the same either way. ``on_progress(fraction)`` hears,
    every few hundred finished requests, the share of the rows' simulations (all repeats) done so far, for a
    progress bar's estimate on a big trace (the reference schedules in workers run beside the rows).
    """
    configs = (dict(policies) if isinstance(policies, Mapping)
               else {name: load_config(name) for name in policies})
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    prof = load_profile(default_profile(mode) if profile is None else profile)
    budget_value = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget_value < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget_value}")
    per_repeat: dict[str, list[dict[str, Any]]] = {p: [] for p in configs}
    records: dict[str, RepeatRecords] = {p: RepeatRecords() for p in configs}  # read when asked
    last_runs: dict[str, SimResult] = {}
    bounds: list[dict[str, Any]] = []
    references: list[dict[str, Any]] = []
    achievable = achievable and topology == "mixed"
    engines = pd.pairs if pd is not None else fleet.replicas if fleet is not None else 1
    workload = None
    started: list[Background] = []  # each repeat's reference runs
    try:
        for repeat in range(repeats):
            workload = make_workload(seed + repeat)
            if achievable:
                def run_reference(config: PolicyConfig, options: dict[str, Any], work: Workload = workload) -> Any:
                    return simulate(work, config, profile=prof, budget=budget_value, mode=mode,
                                    max_num_seqs=max_num_seqs, kv_blocks=kv_blocks,
                                    long_prefill_token_threshold=long_prefill_token_threshold,
                                    template_tokens=template_tokens, fleet=fleet, prefix_cache=prefix_cache,
                                    lean=True, **(engine_options or {}), **options).summary

                # the reference schedules start now in worker processes (jobs > 1) while this one runs the rows
                done = None if on_run_done is None else partial(on_run_done, "achievable", repeat)
                workers = len(SCHEDULES) if jobs is None else jobs - 1
                started.append(start_schedules(run_reference, mode, workers=workers, on_done=done))
            bounds.append(lower_bounds(workload, profile=prof, budget=budget_value, template_tokens=template_tokens,
                                       engines=engines, mode=mode, topology=topology, prefix_cache=prefix_cache))
            for row, (policy, config) in enumerate(configs.items()):
                progress = None if on_progress is None else partial(
                    _row_progress, on_progress, repeat * len(configs) + row, repeats * len(configs))
                result = simulate(workload, config, profile=prof, budget=budget_value, mode=mode,
                                  max_num_seqs=max_num_seqs, kv_blocks=kv_blocks,
                                  long_prefill_token_threshold=long_prefill_token_threshold, seed=seed + repeat,
                                  template_tokens=template_tokens, topology=topology, pd=pd,
                                  fleet=(row_fleets or {}).get(policy, fleet), prefix_cache=prefix_cache,
                                  progress=progress, **(engine_options or {}))
                per_repeat[policy].append(result.summary)
                records[policy].add(repeat, result.records)
                last_runs[policy] = result
                if progress is not None:
                    progress(1.0)
                if on_run_done is not None:
                    on_run_done(policy, repeat)
            if achievable:
                references.append(schedule_figures(SCHEDULES, started[repeat].results()))
    finally:
        for runs in started:  # an error above: stop the workers still running
            runs.close()
    assert workload is not None
    # each repeat's statistic is at least that repeat's bound, so the median of the bounds bounds the median
    bound_summary = median_summary([{k: v for k, v in b.items() if k not in ("ttft_s", "method")} for b in bounds])
    bound_summary["method"] = BOUND_METHOD
    bound_summary["ttft_s"] = bounds[-1]["ttft_s"]
    summaries = {p: median_summary(per_repeat[p]) for p in configs}
    return Comparison(
        workload=workload.name, profile=prof.name, mode=mode, budget=budget_value, repeats=repeats, seed=seed,
        summaries=summaries, per_repeat=per_repeat, records=records,
        last_runs=last_runs, bound=bound_summary, workload_params=dict(workload.params), configs=configs,
        baseline=baseline_row(configs),
        achievable=achievable_summary(references, summaries, bound_summary) if references else None,
    )


def _row_progress(report: Callable[[float], None], done: int, total: int, fraction: float) -> None:
    """The share of all the rows' simulations done when row run ``done`` (of ``total``) is ``fraction`` done."""
    report((done + fraction) / total)


def baseline_row(configs: Mapping[str, PolicyConfig]) -> str | None:
    """The row '% vs default' is measured against: the first whose configuration is the plain default
    (``default``, ``fcfs`` or ``{"policy": "default"}``, every setting at its default); None if none is."""
    plain = PolicyConfig()
    return next((label for label, config in configs.items() if config == plain), None)


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
    hash_block_tokens: int = 512           # trace: prompt tokens per hash_ids entry (Mooncake's 512)
    policies: Sequence[str] | None = None  # plain names, each row labelled by its canonical name;
    policy_specs: Sequence[str] = ()       # SPECs (parse_policy_spec), each row labelled by its SPEC as given
    long_prefill_token_threshold: int | None = None  # None: the profile's (0 = off)
    profile: str | Path | Profile | None = None  # None: the mode's default (sim.costs.default_profile)
    budget: int | None = None
    mode: str = "vllm"
    repeats: int = 1
    seed: int = 0
    template_tokens: int = 0
    max_num_seqs: int | None = None
    kv_blocks: int | None = None
    topology: str = "mixed"
    pd: PdConfig | None = None
    fleet: Any = None                      # a sim.fleet.FleetConfig: every row on that many replicas
    gateway_policies: Sequence[str] = ()   # several: each row once per gateway SPEC ("none": no gateway)
    prefix_cache: bool | None = None       # vLLM's prefix caching: None = on when the workload carries hashes
    engine_options: Mapping[str, Any] = field(default_factory=dict)  # --mode lightllm: schedule, ...
    achievable: bool = True                # run the clairvoyant reference schedules beside the bound
    jobs: int | None = None                # simulations at once (compare_policies); None: each reference its own worker
    scheduling_policy: str = "fcfs"        # vLLM's --scheduling-policy: "priority" honours the requests' classes
    long_cost_limit: float = LONG_TTFT_P95_MAX_CHANGE  # the recommendation's limit on long TTFT P95's rise

    def profile_or_default(self) -> str | Path | Profile:
        return default_profile(self.mode) if self.profile is None else self.profile


@dataclass
class PreparedComparison:
    """A checked comparison, ready to run: its label, rows (label -> configuration), profile and workload."""

    settings: CompareSettings
    label: str
    rows: dict[str, PolicyConfig]
    profile: Profile
    make_workload: Callable[[int], Workload]
    warnings: list[str] = field(default_factory=list)
    row_fleets: dict[str, Any] = field(default_factory=dict)

    @property
    def policies(self) -> list[str]:
        """The row labels, in table order."""
        return list(self.rows)

    @property
    def runs(self) -> int:
        """Simulations to run: every row, and each clairvoyant reference schedule, once per repeat."""
        references = len(SCHEDULES) if self.settings.achievable and self.settings.topology == "mixed" else 0
        return (len(self.rows) + references) * self.settings.repeats

    def run(self, on_run_done: Callable[[str, int], None] | None = None,
            on_progress: Callable[[float], None] | None = None) -> Comparison:
        """Run the comparison; ``on_run_done(row, repeat)`` after each simulation, ``on_progress(fraction)`` as
        the rows' simulations advance (``compare_policies``)."""
        s = self.settings
        comparison = compare_policies(
            self.make_workload, self.rows, profile=self.profile, budget=s.budget, mode=s.mode, repeats=s.repeats,
            seed=s.seed, template_tokens=s.template_tokens, max_num_seqs=s.max_num_seqs, kv_blocks=s.kv_blocks,
            long_prefill_token_threshold=s.long_prefill_token_threshold, topology=s.topology, pd=s.pd,
            fleet=s.fleet, row_fleets=self.row_fleets, prefix_cache=s.prefix_cache, on_run_done=on_run_done,
            engine_options=engine_options(s), achievable=s.achievable, jobs=s.jobs, on_progress=on_progress)
        comparison.warnings = list(self.warnings)
        return comparison


def engine_options(settings: CompareSettings) -> dict[str, Any]:
    """The engine model's options: the LightLLM ones, and vLLM's scheduling policy when not FCFS."""
    options = dict(settings.engine_options)
    if settings.scheduling_policy != "fcfs":
        options["scheduling_policy"] = settings.scheduling_policy
    return options


def _check_scheduling_policy(settings: CompareSettings, rows: Mapping[str, PolicyConfig]) -> None:
    """vLLM's priority scheduling: the vllm mode's mixed topology, prefillq's own policies (tiers)."""
    check_choice("scheduling_policy", settings.scheduling_policy, SCHEDULING_POLICIES, error=CompareError)
    if settings.scheduling_policy == "fcfs":
        return
    if settings.mode != "vllm" or settings.topology != "mixed":
        raise CompareError("--scheduling-policy priority models vLLM's priority scheduling: it needs --mode vllm "
                           "and the mixed topology")
    peers = [label for label, config in rows.items() if config.policy in PEER_POLICIES]
    if peers:
        raise CompareError(f"--scheduling-policy priority serves strict tiers with prefillq's policies inside; "
                           f"other engines' emulations have no tiers: drop {', '.join(peers)}")


def prepare_comparison(settings: CompareSettings) -> PreparedComparison:
    """Check ``settings``, load the profile and build the workload factory (errors: ValueError subclasses)."""
    check_choice("mode", settings.mode, MODES, error=CompareError)
    check_choice("topology", settings.topology, TOPOLOGIES, error=CompareError)
    if settings.budget is not None:
        check_int("budget", settings.budget, minimum=1, error=CompareError)
    check_int("repeats", settings.repeats, minimum=1, error=CompareError)
    if settings.jobs is not None:
        check_int("jobs", settings.jobs, minimum=1, error=CompareError)
    check_int("template_tokens", settings.template_tokens, error=CompareError)
    if settings.long_prefill_token_threshold is not None:
        check_int("long_prefill_token_threshold", settings.long_prefill_token_threshold, error=CompareError)
    _check_engine_options(settings)
    if (settings.pd is not None) != (settings.topology != "mixed"):
        raise CompareError("PD settings go with the 1p1d topology only (and it needs them)")
    if settings.fleet is not None and settings.topology != "mixed":
        raise CompareError("replicas behind a router run the mixed topology (one engine per replica), not 1p1d")
    rows = comparison_rows(settings.policies, settings.policy_specs, mode=settings.mode)
    rows, row_fleets = gateway_rows(rows, settings.fleet, settings.gateway_policies)
    _check_scheduling_policy(settings, rows)
    profile = load_profile(settings.profile_or_default())
    label, make_workload = _workload_factory(settings)
    budget = profile.limit("max_num_batched_tokens") if settings.budget is None else settings.budget
    workload = make_workload(settings.seed)
    warning = prefill_load_warning(workload, profile, budget, settings)
    warnings = ([warning] if warning else []) + lane_split_warnings(workload, rows, settings.template_tokens)
    try:
        _, ignored = prefix_cache_setting(workload, settings.mode, settings.topology, settings.prefix_cache)
    except ValueError as exc:
        raise CompareError(str(exc)) from None
    if ignored:
        warnings.append(ignored)
    return PreparedComparison(settings, label, rows, profile, make_workload, warnings, row_fleets)


def gateway_rows(rows: dict[str, PolicyConfig], fleet: Any,
                 gateways: Sequence[str]) -> tuple[dict[str, PolicyConfig], dict[str, Any]]:
    """With several gateway SPECs, each row once per gateway (labelled ``ROW | gateway SPEC``; ``none``
    is no gateway queue), and each new row's fleet; otherwise the rows as they are and no row fleets."""
    if len(gateways) < 2:
        return rows, {}
    if fleet is None:
        raise CompareError("several gateway policies need the fleet settings (--replicas, --router, ...)")
    expanded: dict[str, PolicyConfig] = {}
    fleets: dict[str, Any] = {}
    for gateway in gateways:
        gateway_config = None if gateway.strip().lower() == "none" else parse_policy_spec(gateway)[1]
        for label, config in rows.items():
            row = f"{label} | gateway {gateway.strip()}"
            if row in expanded:
                raise CompareError(f"two rows are labelled {row!r}; give each gateway policy once")
            expanded[row] = config
            fleets[row] = replace(fleet, gateway_policy=gateway_config)
    return expanded, fleets


def _check_engine_options(settings: CompareSettings) -> None:
    """The LightLLM engine's options: only with ``--mode lightllm``, each a valid value."""
    options = settings.engine_options
    if not options:
        return
    if settings.mode != "lightllm":
        raise CompareError(f"{', '.join(sorted(options))}: LightLLM engine options need --mode lightllm")
    from prefillq.sim.lightllm import SCHEDULES

    reject_unknown_keys(options, ("schedule", "router_tick_s", "prefill_token_gate"), "LightLLM engine options",
                        error=CompareError)
    if "schedule" in options:
        check_choice("schedule", options["schedule"], SCHEDULES, error=CompareError)
    if "router_tick_s" in options:
        check_number("router_tick_s", options["router_tick_s"], error=CompareError)


def comparison_rows(policies: Sequence[str] | None, specs: Sequence[str] = (), *,
                    mode: str = "vllm") -> dict[str, PolicyConfig]:
    """The table's rows, label -> configuration: the plain ``policies`` names first (labelled by their
    canonical names, a repeat dropped, as ``--policies default,fcfs`` always did), then each SPEC
    labelled as given. Without either, the four policies at their defaults and ``auto`` (``AUTO_ROW`` of
    the ``mode``). The name ``peers`` stands for the rows of :func:`peer_rows`, in its place. Two rows with
    one label are a CompareError; a bad name or SPEC is a ConfigError naming it."""
    if policies is None and not specs:
        policies, specs = DEFAULT_POLICIES, (AUTO_ROW.get(mode, "auto"),)
    rows: dict[str, PolicyConfig] = {}
    for name in (name.strip() for name in policies or ()):
        if name.lower() == PEER_GROUP:
            for label, config in map(parse_policy_spec, peer_rows(mode)):
                rows.setdefault(label, config)
            continue
        if ":" in name or "{" in name or "=" in name:
            raise CompareError(f"--policies takes plain policy names, got {name!r}; give a configured row as "
                               "--policy SPEC (repeatable), e.g. --policy short_request_first:threshold=512")
        if name:
            config = load_config(name)
            rows.setdefault(config.policy, config)
    for spec in specs:
        if spec.strip().lower() == PEER_GROUP:
            raise CompareError(f"{PEER_GROUP!r} is a group of rows, not a policy: give it to --policies "
                               f"(e.g. --policies {PEER_GROUP} or --policies default,auto,{PEER_GROUP})")
        label, config = parse_policy_spec(spec)
        if label in rows:
            raise CompareError(f"two rows are labelled {label!r}; give each --policy SPEC once (a --policies "
                               "name is a row too)")
        rows[label] = config
    if not rows:
        raise CompareError("no policies to compare")
    return rows


def peer_rows(mode: str = "vllm") -> tuple[str, ...]:
    """The ``peers`` group's rows as SPECs: stock ``default``, the ``auto`` row of ``mode`` (``AUTO_ROW``) and
    every emulated peer option. In vLLM mode ``sglang_spf`` runs with ordered partial prefills, the only
    place the simulator applies its chunk cap; LightLLM mode has no such cap to model."""
    def spec(peer: str) -> str:
        return f"{peer}:partial_prefills=ordered" if peer == "sglang_spf" and mode == "vllm" else peer

    return ("default", AUTO_ROW.get(mode, "auto"), *(spec(peer) for peer in PEER_POLICIES))


def lane_split_warnings(workload: Workload, rows: Mapping[str, PolicyConfig], template_tokens: int = 0) -> list[str]:
    """A warning per short_request_first row whose threshold leaves a lane empty, or puts more than
    ``LANE_SHARE_MAX`` of the requests *and* of the prompt tokens in one lane, with the threshold
    ``prefillq tune`` would choose. (A few long prompts holding most of the work behind a stream of
    short ones, as in ``long-then-stream``, are what the policy is for: that split is not warned about.)

    The policy sees each prompt with the template tokens the server adds, so the lanes are counted (and
    the suggestion given) on those lengths; tune's threshold is found on the prompts alone.
    """
    if not any(config.policy == "short_request_first" for config in rows.values()):
        return []  # no lanes to check (and no pass over a big trace's requests)
    lengths = [r.prompt_tokens + template_tokens for r in workload.requests]
    warnings: list[str] = []
    suggestion: str | None = None
    for label, config in rows.items():
        if config.policy != "short_request_first" or not lengths:
            continue
        split = _LaneSplit.of(lengths, config.threshold)
        if not split.lopsided:
            continue
        if suggestion is None:
            suggestion = _tuned_threshold(workload, lengths, template_tokens)
        warnings.append(f"row {label!r}: short_request_first threshold {config.threshold} splits the requests "
                        f"{split}, so {split.effect}; {suggestion}")
    return warnings


@dataclass(frozen=True)
class _LaneSplit:
    """How a threshold splits prompt lengths into short_request_first's lanes (requests and tokens)."""

    short: int
    total: int
    short_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, lengths: Sequence[int], threshold: int) -> _LaneSplit:
        short = [n for n in lengths if n <= threshold]
        return cls(len(short), len(lengths), sum(short), sum(lengths))

    @property
    def lopsided(self) -> bool:
        if self.short in (0, self.total):
            return True
        request_share, token_share = self.short / self.total, self.short_tokens / self.total_tokens
        return (min(request_share, token_share) > LANE_SHARE_MAX
                or max(request_share, token_share) < 1.0 - LANE_SHARE_MAX)

    @property
    def effect(self) -> str:
        if self.short in (0, self.total):
            return "it orders requests as default (FCFS) does"
        return "it reorders few requests"

    def __str__(self) -> str:
        if self.short in (0, self.total):
            return f"{self.short} short / {self.total - self.short} long"
        return (f"{self.short} short / {self.total - self.short} long ({self.short / self.total:.0%} of the "
                f"requests and {self.short_tokens / self.total_tokens:.0%} of the prompt tokens short)")


def _tuned_threshold(workload: Workload, lengths: Sequence[int], template_tokens: int) -> str:
    """The threshold ``prefillq tune`` would choose for ``workload`` (plus the template tokens), in words."""
    from prefillq.workload.split import split_threshold

    found = workload.params.get("split") or {}
    if found.get("method") not in (None, "user", "recorded") and found.get("threshold") is not None:
        tuned = int(found["threshold"])  # the trace reader already found it
    else:
        tuned = split_threshold([n - template_tokens for n in lengths], error=CompareError).threshold
    threshold = tuned + template_tokens
    template = f" ({tuned} plus the {template_tokens} template tokens)" if template_tokens else ""
    split = _LaneSplit.of(lengths, threshold)
    if split.lopsided:
        return (f"prefillq tune would choose threshold={threshold}{template}, which splits them {split} too: "
                "no threshold gives this workload two sizeable lanes")
    return (f"prefillq tune would choose threshold={threshold}{template}, which splits them {split}: "
            f"--policy short_request_first:threshold={threshold}")


def _below(value: float, current: float) -> str:
    """``value`` rounded to the fewest significant digits that still show a number under ``current`` (advice
    never names the value already in use)."""
    for digits in range(2, 8):
        text = f"{value:.{digits}g}"
        if float(text) < current:
            return text
    return f"{value:.8g}"


def prefill_load_warning(workload: Workload, profile: Profile, budget: int, settings: CompareSettings) -> str | None:
    """A warning when the workload offers more prompt tokens per second than the engine can prefill.

    The capacity is the best case (full-budget steps, no attention or decode cost, every prefill node
    busy), so a workload over it is overloaded for sure: its queues grow for as long as requests
    arrive. Bursts (arrival window under ``MIN_RATE_WINDOW_S``) are left alone.
    """
    requests = workload.requests
    window_s = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    if window_s < MIN_RATE_WINDOW_S:
        if settings.trace is not None and settings.rate_scale > 1 and len(requests) > 1:
            return (f"--rate-scale {settings.rate_scale:g} replays the trace's {len(requests):,} requests within "
                    f"{window_s:.2g} s: a burst, not the trace's traffic; a smaller --rate-scale (or a longer "
                    "--duration) keeps its arrival pattern")
        return None
    columns = getattr(requests, "columns", None)  # a trace's arrays: the same integers, no RequestSpec per row
    prompts = columns()[1] if columns is not None else [r.prompt_tokens for r in requests]
    offered = (sum(prompts) + settings.template_tokens * len(requests)) / window_s
    capacity = budget / profile.cost.step_latency(budget, 0.0, 0, 0)
    if settings.pd is not None:
        capacity *= settings.pd.pairs  # every pair's prefill node prefills
    if settings.fleet is not None:
        capacity *= settings.fleet.replicas
    factor = offered / capacity
    if factor <= 1.0:
        return None
    if settings.trace is not None:
        scale = _below(settings.rate_scale / factor, settings.rate_scale)
        advice = f"replay it slower, e.g. --rate-scale {scale} or lower"
    elif "rate" in workload.params:
        rate = float(workload.params["rate"])
        advice = f"lower its rate, e.g. --set rate={_below(rate / factor, rate)} or lower"
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
                       duration_s=settings.duration_s, long_threshold=settings.long_threshold,
                       hash_block_tokens=settings.hash_block_tokens)
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
        "long_prefill_token_threshold": (settings.long_prefill_token_threshold
                                         if settings.long_prefill_token_threshold is not None
                                         else _profile_limit(settings.profile_or_default(),
                                                             "long_prefill_token_threshold")),
        "baseline": comparison.baseline,
        "configs": {label: config.to_dict() for label, config in comparison.configs.items()},
        "warnings": list(comparison.warnings),
    }
    if settings.engine_options:
        details["engine_options"] = dict(settings.engine_options)
    details["scheduling_policy"] = settings.scheduling_policy
    classes = comparison.workload_params.get("priority_classes")
    if classes:  # each summary has priority_<class>_<figure> keys (sim/records.py class_figures)
        details["priority_classes"] = {
            "classes": list(classes), "figures": list(CLASS_FIGURES),
            "by_row": {label: {str(c): {name: summary.get(class_key(c, name)) for name in CLASS_FIGURES}
                               for c in classes} for label, summary in comparison.summaries.items()}}
    details["achievable"] = comparison.achievable  # beside "bound": the clairvoyant reference (None: not run)
    error = cost_error_of(load_profile(settings.profile_or_default()).extra)  # its calibration block, if any
    details["recommendation"] = rec = recommend(comparison.summaries, comparison.configs, mode=settings.mode,
                                                baseline=comparison.baseline, cost_error=error,
                                                long_limit=settings.long_cost_limit)
    if rec is not None and settings.scheduling_policy == "priority":  # the plug-in runs the policy in tiers
        rec["command"] = vllm_command(comparison.configs[rec["row"]], priority=True)
    details["emulations"] = emulations(comparison.configs)  # rows that stand for another engine's own option
    prefix = {label: run.prefix_cache for label, run in comparison.last_runs.items() if run.prefix_cache}
    if prefix:
        details["prefix_cache"] = prefix  # the last repeat's figures; the summaries hold the medians
    if settings.pd is not None:
        details["pd"] = {**settings.pd.to_dict(), "busy_retry_timeout_s": settings.pd.retry_timeout_s()}
        details["pd_stats"] = {policy: run.pd for policy, run in comparison.last_runs.items()}
    if settings.fleet is not None:
        details["fleet"] = settings.fleet.to_dict()
        details["fleet_stats"] = {policy: run.fleet for policy, run in comparison.last_runs.items()}
    return details


def _profile_limit(profile: str | Path | Profile, key: str) -> Any:
    return load_profile(profile).limit(key)
