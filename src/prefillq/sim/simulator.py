"""The event loop: feed a workload's arrivals to a simulated engine and collect per-request records."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillq.metrics import RequestRecord, summarize
from prefillq.sim.costs import Profile, default_profile, load_profile
from prefillq.sim.node import Discarded, EngineLimits, SimRequest, SimulationError, Timeline, request_factory
from prefillq.sim.records import SimRecords, class_figures
from prefillq.sim.vllm import VllmNode
from prefillq.workload import Workload

MODES = ("vllm", "lightllm")
TOPOLOGIES = ("mixed", "1p1d")


@dataclass
class SimResult:
    """Everything one simulated run produced."""

    workload: str
    policy: str
    profile: str
    mode: str
    limits: EngineLimits
    records: Sequence[RequestRecord]  # SimRecords for one node: columns, records built when read
    summary: dict[str, Any]
    timeline: Sequence[tuple[float, int, int, int, int]] = field(default_factory=Timeline)
    lanes: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    long_waits_s: list[float] = field(default_factory=list)
    short_waits_s: list[float] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0
    sim_time_s: float = 0.0
    node: Any = None  # the engine node (kept only with record_steps=True, for inspection in tests)
    topology: str = "mixed"
    pd: dict[str, Any] = field(default_factory=dict)  # disaggregated topologies: transfers, segments, retries
    fleet: dict[str, Any] = field(default_factory=dict)  # fleets: per-replica load, imbalance, gateway (sim/fleet/)
    prefix_cache: dict[str, Any] = field(default_factory=dict)  # hit rate etc. (empty: no prefix caching)

    def _with_prefix_summary(self) -> SimResult:
        """With prefix caching, the summary gains the hit rate and the prompt tokens actually prefilled."""
        if self.prefix_cache:
            self.summary["prefix_cache_hit_rate"] = self.prefix_cache["hit_rate"]
            self.summary["prefill_tokens"] = self.prefix_cache["prefill_tokens"]
        return self


def _limits(profile: Profile, budget: int | None, max_num_seqs: int | None, kv_blocks: int | None,
            long_prefill_token_threshold: int | None) -> EngineLimits:
    return EngineLimits(
        max_num_batched_tokens=profile.limit("max_num_batched_tokens") if budget is None else int(budget),
        max_num_seqs=profile.limit("max_num_seqs") if max_num_seqs is None else int(max_num_seqs),
        kv_blocks=profile.limit("kv_blocks") if kv_blocks is None else int(kv_blocks),
        block_size=profile.limit("block_size"),
        long_prefill_token_threshold=(profile.limit("long_prefill_token_threshold")
                                      if long_prefill_token_threshold is None else int(long_prefill_token_threshold)),
    )


def make_node(policy: Any, profile: Profile, limits: EngineLimits, mode: str, *, record_steps: bool = False,
              **options: Any) -> Any:
    """An engine node of the given mode (``vllm`` or ``lightllm``)."""
    if mode == "vllm":
        hash_block_tokens = options.pop("hash_block_tokens", None)
        queue = options.pop("queue", None)  # a queue factory (sim/clairvoyant.py's reference schedules)
        scheduling_policy = options.pop("scheduling_policy", "fcfs")  # vLLM's --scheduling-policy
        if options:
            raise ValueError(f"unknown vllm-mode options: {', '.join(options)}")
        return VllmNode(policy, profile.cost, limits, record_steps=record_steps, hash_block_tokens=hash_block_tokens,
                        queue=queue, scheduling_policy=scheduling_policy)
    if mode == "lightllm":
        from prefillq.sim.lightllm import LightLLMNode, lightllm_cost

        return LightLLMNode(policy, lightllm_cost(profile), limits, record_steps=record_steps, **options)
    raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")


def prefix_cache_setting(workload: Workload, mode: str, topology: str,
                         prefix_cache: bool | None) -> tuple[int | None, str | None]:
    """(the trace block size of the workload's hashes when the prefix cache is on, else None; a note
    when the workload's hashes are ignored). ``prefix_cache`` None: on when the requests carry hashes.

    Prefix caching is modelled in vLLM mode on the mixed topology (fleet replicas included). LightLLM
    mode and the 1p1d topology ignore the hashes (with a note) by default and refuse ``prefix_cache=True``.
    """
    hash_block_tokens = workload.params.get("prefix_hash_block_tokens")
    if prefix_cache is False:
        return None, None
    if not hash_block_tokens:
        if prefix_cache:
            raise ValueError("prefix caching needs requests that carry block hashes (a trace with hash_ids, "
                             "or the multi-turn scenario); this workload has none")
        return None, None
    where = f"{mode} mode" if mode != "vllm" else f"the {topology} topology" if topology != "mixed" else None
    if where is None:
        return int(hash_block_tokens), None
    if prefix_cache:
        raise ValueError(f"prefix caching is modelled in vllm mode on the mixed topology only, not in {where}; "
                         "drop --prefix-cache")
    return None, f"{where} does not model prefix caching: the workload's block hashes are ignored"


def run_node(node: Any, workload: Workload, progress: Callable[[float], None] | None = None,
             template_tokens: int = 0, frontend: tuple[float, float] = (0.0, 0.0)) -> SimRecords:
    """The event loop: arrivals join the node between steps; an idle node jumps to the next arrival.

    Requests are built as they arrive and dropped once finished: what remains of each is its row in
    the returned :class:`SimRecords` (whose times include the profile's front-end time, ``frontend``
    = (``frontend_s``, ``frontend_per_seq_s``)).
    """
    specs = workload.requests
    # a lean run (its node keeps no step end times) records first-token and finish times only
    records = SimRecords(specs, node.step_end_s, *frontend, lean=isinstance(node.step_end_s, Discarded))
    finish_hook = node.on_finish
    if finish_hook is None:
        node.on_finish = records.finish
    else:
        def on_finish(r: SimRequest) -> None:
            records.finish(r)
            finish_hook(r)

        node.on_finish = on_finish
    arrivals = records.arrival_s
    total = len(specs)
    make = request_factory(specs, template_tokens)
    add, step, has_work = node.add_request, node.step, node.has_work
    next_arrival = 0
    upcoming = arrivals[0] if total else math.inf  # the next arrival's time
    now = 0.0
    reported = 0
    unqueued = getattr(node, "run_unqueued_steps", None)  # steps while nothing waits, fast (vLLM mode)
    while True:
        while upcoming <= now:
            request = make(next_arrival)
            add(request, upcoming)
            next_arrival += 1
            upcoming = arrivals[next_arrival] if next_arrival < total else math.inf
        busy = has_work()
        end = step(now) if busy else None
        if end is not None:
            now = end
            if unqueued is not None:
                now = unqueued(now, upcoming)
        elif next_arrival < total:
            now = max(now, upcoming)
        elif busy:
            raise SimulationError("the engine has waiting requests but cannot schedule any of them")
        else:
            break
        if progress is not None and node.finished_count - reported >= 256:
            reported = node.finished_count
            progress(reported / max(1, total))
    return records


def simulate(workload: Workload, policy: Any = "default", *, profile: str | Path | Profile | None = None,
             budget: int | None = None, mode: str = "vllm", max_num_seqs: int | None = None,
             kv_blocks: int | None = None, long_prefill_token_threshold: int | None = None, seed: int = 0,
             topology: str = "mixed", template_tokens: int = 0, record_steps: bool = False,
             progress: Callable[[float], None] | None = None, pd: Any = None, fleet: Any = None,
             prefix_cache: bool | None = None, lean: bool = False, **mode_options: Any) -> SimResult:
    """Simulate ``workload`` on one engine running ``policy`` (any config form ``make_queue`` accepts).

    ``budget`` is the prefill token budget per step (``max_num_batched_tokens``); None takes the
    profile's default, as do ``max_num_seqs`` and ``kv_blocks``. The simulation is deterministic
    (``seed`` is recorded for symmetry with real runs; nothing in the engine model is random).
    ``topology`` is ``mixed`` (one node doing prefill and decode) or ``1p1d`` (a router in front of
    prefill-only and decode-only node pairs, ``sim/pd/``; ``pd`` is a
    :class:`~prefillq.sim.pd.PdConfig` or a dict of its fields). In ``1p1d`` the policy runs
    on the prefill node; ``budget``, ``max_num_seqs`` and ``kv_blocks`` are the prefill node's (the
    decode node takes ``max_num_seqs``/``kv_blocks`` too unless ``pd`` sets its own).
    ``fleet`` (a :class:`~prefillq.sim.fleet.FleetConfig` or a dict of its fields) runs the workload on
    that many mixed replicas behind a router, each running ``policy`` (``sim/fleet/``).
    ``prefix_cache`` (vLLM mode, mixed topology): None turns vLLM's prefix caching on when the
    workload's requests carry block hashes (:func:`prefix_cache_setting`), False off.
    ``lean`` (one node): keep no step end times, timeline, lane samples, scheduling times or token steps, for
    a run read only for its TTFT and end-to-end figures (the summary's inter-token figures are then None, the
    result's waits empty; the others are the same).
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; valid topologies: {', '.join(TOPOLOGIES)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    prof = load_profile(default_profile(mode) if profile is None else profile)
    limits = _limits(prof, budget, max_num_seqs, kv_blocks, long_prefill_token_threshold)
    if template_tokens < 0:
        raise ValueError(f"template_tokens must be >= 0, got {template_tokens}")
    hash_block_tokens, _ = prefix_cache_setting(workload, mode, topology, prefix_cache)
    if hash_block_tokens is not None:
        mode_options["hash_block_tokens"] = hash_block_tokens
    if topology != "mixed":
        return _simulate_pd(workload, policy, prof, limits, mode, pd, template_tokens=template_tokens,
                            record_steps=record_steps, progress=progress, **mode_options)
    if pd is not None:
        raise ValueError("pd settings need topology='1p1d'")
    if fleet is not None:
        return _simulate_fleet(workload, policy, prof, limits, mode, fleet, template_tokens=template_tokens,
                               record_steps=record_steps, progress=progress, **mode_options)
    node = make_node(policy, prof, limits, mode, record_steps=record_steps, **mode_options)
    if lean and not record_steps:
        node.keep_no_history()
    records = run_node(node, workload, progress, template_tokens, (prof.frontend_s, prof.frontend_per_seq_s))
    start = records.arrival_s[0] if len(records) else 0.0
    last = records.last_finish_s()
    end = start if last is None else last
    summary = {**summarize(records), **class_figures(records, workload)}
    prefix = node.prefix_stats() if mode == "vllm" else {}
    return SimResult(
        workload=workload.name, policy=node.policy_name, profile=prof.name, mode=mode, limits=limits,
        records=records, summary=summary, timeline=node.timeline, lanes=node.lanes,
        long_waits_s=records.waits_s("long"), short_waits_s=records.waits_s("short"),
        steps=node.step_index, preemptions=node.preemption_count, sim_time_s=end - start,
        node=node if record_steps else None, prefix_cache=prefix,
    )._with_prefix_summary()


def _simulate_pd(workload: Workload, policy: Any, prof: Profile, limits: EngineLimits, mode: str, pd: Any, *,
                 template_tokens: int, record_steps: bool,
                 progress: Callable[[float], None] | None, **mode_options: Any) -> SimResult:
    """``simulate`` for the disaggregated topology (router + prefill/decode pairs)."""
    from prefillq.config import load_config
    from prefillq.sim.pd import PdConfig, PdSystem

    config = PdConfig.from_value(pd)
    transfer = config.transfer_model(prof.transfer_model())
    cost = prof.cost
    if mode == "lightllm":
        from prefillq.sim.lightllm import lightllm_cost

        cost = lightllm_cost(prof)
    system = PdSystem(policy, cost, limits, config.decode_limits(limits), transfer, config,
                      retry_timeout_s=config.retry_timeout_s(), mode=mode, record_steps=record_steps, **mode_options)
    clients = system.run(workload, template_tokens, progress)
    records = system.records(prof.frontend_s)
    start = workload.requests[0].arrival_s if workload.requests else 0.0
    end = max((c.finish_s for c in clients if c.finish_s is not None), default=start)
    first_prefill = system.pairs[0].prefill
    stats = system.stats()

    def waits(klass: str) -> list[float]:
        return [c.segments[0].first_scheduled_s - c.arrival_s for c in clients
                if c.spec.klass == klass and c.segments and c.segments[0].first_scheduled_s is not None]

    return SimResult(
        workload=workload.name, policy=load_config(policy).policy, profile=prof.name, mode=mode, limits=limits,
        records=records, summary={**summarize(records), **class_figures(records, workload)},
        timeline=first_prefill.timeline, lanes=first_prefill.lanes,
        long_waits_s=waits("long"), short_waits_s=waits("short"), steps=stats["prefill_steps"],
        preemptions=stats["prefill_preemptions"], sim_time_s=end - start, node=system if record_steps else None,
        topology="1p1d", pd=stats,
    )


def _simulate_fleet(workload: Workload, policy: Any, prof: Profile, limits: EngineLimits, mode: str, fleet: Any, *,
                    template_tokens: int, record_steps: bool, progress: Callable[[float], None] | None,
                    **mode_options: Any) -> SimResult:
    """``simulate`` on replicas of the engine behind a router (``sim/fleet/``)."""
    from prefillq.sim.fleet import FleetConfig, FleetSystem

    system = FleetSystem(lambda: make_node(policy, prof, limits, mode, record_steps=record_steps, **mode_options),
                         FleetConfig.from_value(fleet), frontend=(prof.frontend_s, prof.frontend_per_seq_s))
    requests = system.run(workload, template_tokens, progress)
    records = system.records()
    start = requests[0].arrival_s if requests else 0.0
    end = max((r.finish_s for r in requests if r.finish_s is not None), default=start)
    first = system.replicas[0].node
    return SimResult(
        workload=workload.name, policy=first.policy_name, profile=prof.name, mode=mode, limits=limits,
        records=records, summary={**summarize(records), **class_figures(records, workload)},
        timeline=first.timeline, lanes=first.lanes,
        long_waits_s=[r.first_scheduled_s - r.arrival_s for r in requests
                      if r.klass == "long" and r.first_scheduled_s is not None],
        short_waits_s=[r.first_scheduled_s - r.arrival_s for r in requests
                       if r.klass == "short" and r.first_scheduled_s is not None],
        steps=sum(replica.node.step_index for replica in system.replicas),
        preemptions=sum(replica.node.preemption_count for replica in system.replicas), sim_time_s=end - start,
        node=system if record_steps else None, fleet=system.stats(records),
        prefix_cache=merge_prefix_stats([r.node.prefix_stats() for r in system.replicas]) if mode == "vllm" else {},
    )._with_prefix_summary()


def merge_prefix_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The prefix-cache figures of several nodes, added up (empty when none has a cache)."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    total = {key: sum(p[key] for p in parts) for key in ("queried_tokens", "hit_tokens", "evicted_blocks",
                                                          "prefill_tokens", "preempted_requests",
                                                          "preempted_queried_tokens", "preempted_hit_tokens")}
    total["hit_rate"] = total["hit_tokens"] / total["queried_tokens"] if total["queried_tokens"] else 0.0
    return total
