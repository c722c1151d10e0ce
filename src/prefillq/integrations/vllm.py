"""prefillq policies inside vLLM's V1 engine (supported: vLLM 0.32, 0.33 and 0.34; see ``SUPPORTED_VLLM``).

Select with ``--scheduler-cls prefillq.integrations.vllm.Scheduler`` in every scheduling mode: with
vLLM's async scheduling on (its default on GPUs) the class builds itself on vLLM's ``AsyncScheduler``,
otherwise on ``Scheduler`` (``...AsyncScheduler`` is the same class, kept for old command lines).
vLLM imports this module inside its EngineCore process. This is the
scheduler plug-in only; the calibration harness that measures an engine running it is
:mod:`prefillq.calibrate.probe`. The two are the only modules of prefillq that import vLLM, and
``import prefillq`` loads neither.

What the subclasses change, and nothing else:

* ``self.waiting`` (vLLM's waiting queue of requests that hold no KV blocks) becomes a prefillq queue.
  It implements vLLM's ``RequestQueue`` contract: peek is O(1) and pinned (the following pop returns the
  peeked request), ``remove_requests`` ignores requests it does not hold, and preempted requests come
  back through ``prepend_request`` and count as resumed. ``kv_holding_waiting`` (requests that already
  hold KV blocks, which vLLM always drains first) keeps vLLM's own order.
* After every ``schedule()`` the queue is told how many prefill tokens that step submitted, which
  advances HRRN's processed-token counter and ends promote_shortest's one-promotion-per-step.
* With ``partial_prefills="ordered"`` (SPEC §3.6), before each ``schedule()`` the queue's ``plan_step``
  caps every running partial prefill at what the waiting requests ranked ahead of it leave of the
  step's budget. vLLM's own ``schedule()`` runs unchanged; the cap is applied where it sizes each
  running request's chunk (``_reserve_prefill_lookahead``, the last per-request adjustment before KV
  allocation; a chunk of 0 makes vLLM skip the request for the step without preempting it). A
  ``--long-prefill-token-threshold`` still applies first, so it stays a ceiling on top of the cap.
* Step records, off unless asked for (``{"prefillq": {"record_steps": "DIR"}}`` or ``PREFILLQ_RECORD_STEPS``):
  after ``schedule()`` and ``update_from_output()`` the step's tokens, sequences, prefill/decode split and
  times are handed to a background writer (:mod:`prefillq.integrations.vllm_steps`); they only read.

Configuration, first match wins: ``--additional-config '{"prefillq": {...}}'``; the vLLM Ascend key
``{"scheduler_config": {"short_request_first_config": {...}}}`` in the same JSON; the ``PREFILLQ_CONFIG``
environment variable (JSON text, a policy name or a path to a JSON file); else the default policy (FCFS)
(:func:`prefillq.config.resolve_config`).
With vLLM's ``--scheduling-policy priority`` the queue serves strict tiers of ``Request.priority``
(lower first), the configured policy inside each tier (``default``: vLLM's own (priority, arrival) order);
choosing that mode declares request priorities trusted (SPEC §4.1). The engine refuses to start with
``short_request_first`` on a decode-only node (``kv_role == "kv_consumer"``), with a vLLM outside the
supported range that lacks a hook the plug-in needs (one that has them all starts with a warning), and with vLLM 0.34's
``cache_aware_admission_window`` under any policy but ``default`` (the window would reorder the queue
behind the policy's back; with ``default`` it works as in stock vLLM). vLLM 0.34's ``async_kv_waiting``
queue (requests about to load KV asynchronously) keeps vLLM's own order, like ``kv_holding_waiting``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler as _VllmAsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler
from vllm.v1.request import Request, RequestStatus

from prefillq.config import ConfigError, PolicyConfig, deployment_config, resolve_config
from prefillq.integrations.metrics import MetricsError, MetricsExporter, PartialPrefillCounters, start_exporter
from prefillq.integrations.vllm_cache_keys import CacheKeys
from prefillq.integrations.vllm_plan import PLAN_ATTRIBUTES, PartialPlan
from prefillq.integrations.vllm_steps import StepRecorder, prefill_tokens_scheduled, split_recording
from prefillq.policies import PolicyQueue, make_queue
from prefillq.policies.tiers import TiersQueue
from prefillq.requests import QueuedRequest

logger = logging.getLogger("prefillq")

# Our queues implement RequestQueue's methods; registering makes isinstance checks agree.
RequestQueue.register(PolicyQueue)
RequestQueue.register(TiersQueue)

# vLLM releases (major, minor) the plug-in is tested against (`make test` runs vLLM's own scheduler tests
# of each with our classes). Keep in step with pyproject.toml's `vllm` extra and docs/vllm.md.
SUPPORTED_VLLM = ((0, 32), (0, 33), (0, 34))
SUPPORTED_RANGE = ">=0.32,<0.35"
# The exact releases `make test` runs vLLM's own scheduler tests and ours on; any other build in the range
# (a patch release, a dev or pre-release build such as 0.34.1.dev45+g...) starts with a warning.
TESTED_RELEASES = ("0.32.0", "0.33.0", "0.34.0")
# What the plug-in reaches into: methods of vLLM's Scheduler it calls or overrides, and attributes a
# scheduler instance must have after vLLM's own __init__.
NEEDED_METHODS = ("schedule", "_preempt_request", "_reserve_prefill_lookahead", "_make_cached_request_data",
                  "_free_request", "get_request_counts", "shutdown")
NEEDED_ATTRIBUTES = ("waiting", "running", "requests", "kv_holding_waiting", "deferred_waiting",
                     "kv_cache_manager", "max_num_scheduled_tokens", "scheduler_config", *PLAN_ATTRIBUTES,
                     "kv_cache_manager.prefix_cache_lookup_enabled",
                     "kv_cache_manager.coordinator.find_longest_cache_hit",
                     "kv_cache_manager.block_pool.get_num_free_blocks", "kv_cache_manager.watermark_blocks",
                     "kv_cache_manager.allocate_slots", "kv_cache_manager.enable_caching")


@functools.cache
def _cached_data_signature() -> inspect.Signature:
    """The parameters of vLLM's _make_cached_request_data, by name (where the give-back finds the step's
    state; callers pass them by position or by keyword)."""
    return inspect.signature(_VllmScheduler._make_cached_request_data)


# --- configuration ------------------------------------------------------------------------------

def scheduling_policy(vllm_config: Any) -> str:
    """vLLM's ``--scheduling-policy`` (``fcfs`` or ``priority``)."""
    policy = vllm_config.scheduler_config.policy
    return str(getattr(policy, "value", policy))


def _check_deployment(vllm_config: Any, config: PolicyConfig) -> PolicyConfig:
    """The configuration to run, after the deployment checks. Under vLLM's priority scheduling the policy
    runs inside strict tiers of ``Request.priority`` (SPEC §4.1: choosing that mode is the operator's
    declaration that request priorities are trusted)."""
    kv_transfer = vllm_config.kv_transfer_config
    kv_role = kv_transfer.kv_role if kv_transfer is not None else None
    return deployment_config(config, kv_role=kv_role, scheduling_policy=scheduling_policy(vllm_config))


def _start_metrics(vllm_config: Any, config: PolicyConfig, queue: PolicyQueue,
                   counters: PartialPrefillCounters) -> MetricsExporter | None:
    """The engine's Prometheus endpoint when ``metrics_port`` is set: port + the local data-parallel rank."""
    if not config.metrics_port:
        return None
    rank = getattr(vllm_config.parallel_config, "data_parallel_rank_local", None) or 0
    try:
        return start_exporter(config.metrics_port + rank, queue, counters)
    except MetricsError as exc:
        logger.error("prefillq refuses to start the engine: %s", exc)
        raise ConfigError(f"prefillq refuses to start the engine: {exc}") from None


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def vllm_version_tuple() -> tuple[int, int]:
    """(major, minor) of the installed vLLM (a version outside the supported range was refused or warned
    about at start-up)."""
    parts = vllm_version().split(".")
    return int(parts[0]), int(parts[1])


def version_in_range(version: str) -> bool:
    """Whether a vLLM version string falls in ``SUPPORTED_VLLM`` (any patch release, pre-releases too)."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) in SUPPORTED_VLLM
    except (IndexError, ValueError):
        return False


def check_vllm_version(version: str, missing: list[str]) -> str | None:
    """SPEC §4.1: None for a tested release; a warning for another build in the range, or outside it when no
    hook is ``missing``; else ConfigError."""
    if version_in_range(version):
        if version in TESTED_RELEASES:
            return None
        return (f"vLLM {version} is a build of a supported release line that prefillq was not tested with "
                f"(tested: {', '.join(TESTED_RELEASES)}); every hook the plug-in needs is checked at start-up, "
                "but check the results")
    supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_VLLM)
    if missing:
        raise ConfigError(f"vLLM {version} is outside the range prefillq supports ({SUPPORTED_RANGE}: {supported}) "
                          f"and lacks what the plug-in needs ({', '.join(missing)}); install a supported vLLM, "
                          "e.g. pip install 'prefillq[vllm]'")
    return (f"vLLM {version} is outside the range prefillq is tested with ({SUPPORTED_RANGE}: {supported}); every "
            "hook the plug-in needs is present, so it runs, but check the results")


def _missing_methods() -> list[str]:
    return [f"Scheduler.{name}" for name in NEEDED_METHODS if not hasattr(_VllmScheduler, name)]


def _has_path(obj: Any, dotted: str) -> bool:
    for name in dotted.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _missing_attributes(scheduler: Any) -> list[str]:
    return [f"Scheduler.{name}" for name in NEEDED_ATTRIBUTES if not _has_path(scheduler, name)]


def _async_scheduling(args: tuple, kwargs: dict) -> bool:
    """Whether the vLLM config a scheduler is built with has async scheduling on."""
    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    scheduler_config = getattr(vllm_config, "scheduler_config", None)
    return bool(getattr(scheduler_config, "async_scheduling", False))


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("prefillq: %s", message)


# --- logging ------------------------------------------------------------------------------------

def route_logs_to_vllm() -> None:
    """Make the ``prefillq`` logger's INFO lines (statistics, warnings) reach vLLM's log.

    vLLM configures only its own ``vllm`` logger (with ``propagate=False``); the root logger of an
    EngineCore process usually has no handler, so our records would be dropped at INFO level.
    """
    ours = logging.getLogger("prefillq")
    if ours.level == logging.NOTSET or ours.level > logging.INFO:
        ours.setLevel(logging.INFO)
    if ours.handlers:
        return
    vllm_handlers = logging.getLogger("vllm").handlers
    if vllm_handlers:
        for handler in vllm_handlers:
            ours.addHandler(handler)
        ours.propagate = False
    elif not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [prefillq] %(message)s"))
        ours.addHandler(handler)


# --- the policy view of a vLLM request ---------------------------------------------------------

def request_view(request: Request, *, trust_priority: bool,
                 prefix_hit: Callable[[Request], int] | None = None) -> QueuedRequest:
    """What a prefillq policy sees of a vLLM ``Request``.

    ``priority`` is vLLM's per-request priority, which any client can set in its request body; it is
    passed on only when the operator set ``trust_request_priority``. ``cached_tokens`` is what the
    engine already knows: tokens computed before (a preempted or KV-loaded request), or else the
    prefix-cache hit it would get right now. A request preempted after it produced output recomputes its
    output too (all but the last token), so that counts as its prompt: its remaining work is its recompute.
    """
    computed = request.num_computed_tokens
    output = request.num_output_tokens
    preempted = request.status == RequestStatus.PREEMPTED or request.num_preemptions > 0
    prompt = max(request.num_prompt_tokens, request.num_tokens - 1) if preempted else request.num_prompt_tokens
    cached = computed
    if cached == 0 and prefix_hit is not None:
        cached = prefix_hit(request)
    return QueuedRequest(
        request_id=request.request_id,
        prompt_tokens=prompt,
        cached_tokens=max(0, min(cached, prompt)),
        output_tokens=output,
        priority=int(request.priority) if trust_priority else 0,
        resumed=preempted or computed > 0 or output > 0,
    )


class _HeadMove:
    """Stands in for the waiting queue while vLLM 0.34 reorders its admission window: everything reads
    the queue itself, except that ``remove_requests`` followed by ``prepend_request`` calls is collected
    and handed to the queue as one ``move_to_front`` (the same result as the calls one by one, without a
    Python call into the queue per moved request). Any other use first applies what was collected."""

    def __init__(self, queue: Any, window: int) -> None:
        self._queue = queue
        self._window = window
        self._removed: list[Any] | None = None
        self._prepended: list[Any] = []

    def remove_requests(self, requests: Any) -> None:
        if self._removed is None:
            self._removed = list(requests)
            return
        self.settle()
        self._queue.remove_requests(requests)

    def prepend_request(self, request: Any) -> None:
        if self._removed is not None:
            self._prepended.append(request)
        else:
            self._queue.prepend_request(request)

    def settle(self) -> None:
        if self._removed is None:
            return
        removed, prepended = self._removed, self._prepended
        self._removed, self._prepended = None, []
        move = getattr(self._queue, "move_to_front", None)
        if move is not None:
            move(removed, prepended)
        else:
            self._queue.remove_requests(removed)
            for request in prepended:
                self._queue.prepend_request(request)

    def __len__(self) -> int:
        self.settle()
        return len(self._queue)

    def __bool__(self) -> bool:
        self.settle()
        return bool(self._queue)

    def __iter__(self) -> Any:
        self.settle()
        queue = self._queue
        if self._window >= len(queue) and hasattr(queue, "in_order"):
            return iter(queue.in_order())  # a window over the whole queue reads all of it: at once
        return iter(queue)

    def __contains__(self, request: Any) -> bool:
        self.settle()
        return request in self._queue

    def __getattr__(self, name: str) -> Any:
        self.settle()
        return getattr(self._queue, name)


# --- the schedulers -----------------------------------------------------------------------------



class _SkipNotices(set):
    """vLLM's ``deferred_waiting`` set, telling our queue when a request it just popped is a skip.

    vLLM pops a waiting request it cannot schedule this step (grammar not compiled, remote KV not
    arrived, LoRA slots full), adds it to this set at once, and prepends it at the end of the step.
    Hearing of it at the add keeps the rest of the step exact (SPEC §3.0: a skip is not a dispatch).
    """

    def __init__(self, items: Any, queue: PolicyQueue) -> None:
        super().__init__(items)
        self._queue = queue

    def add(self, request: Any) -> None:
        super().add(request)
        self._queue.skip_request(request)


class _PrefillQueueMixin:
    """Replaces vLLM's waiting queue with a prefillq queue; shared by both scheduler classes."""

    prefill_queue: PolicyQueue
    policy_config: PolicyConfig
    # a class default too: vLLM's own tests build a scheduler with object.__new__ and call its methods
    step_recorder: StepRecorder | None = None

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        route_logs_to_vllm()
        try:
            outside = check_vllm_version(vllm_version(), _missing_methods())
            additional, steps_folder = split_recording(vllm_config.additional_config)
            config, source = self._policy_config(vllm_config, additional)
            config = _check_deployment(vllm_config, config)
            if config.partial_prefills == "ordered" and not hasattr(_VllmScheduler, "_reserve_prefill_lookahead"):
                raise ConfigError("partial_prefills='ordered' needs the per-request chunk hook "
                                  "Scheduler._reserve_prefill_lookahead of vLLM 0.32, which this vLLM "
                                  "lacks; use partial_prefills='first'")
        except ConfigError as exc:
            logger.error("prefillq refuses to start the engine: %s", exc)
            raise ConfigError(f"prefillq refuses to start the engine: {exc}") from None
        super().__init__(vllm_config, *args, **kwargs)
        try:
            self._check_engine(config, outside)
        except ConfigError as exc:
            logger.error("prefillq refuses to start the engine: %s", exc)
            raise ConfigError(f"prefillq refuses to start the engine: {exc}") from None
        self.policy_config = config
        self._cache_probe = self._cached_tokens_probe()
        self.prefill_queue = self._make_prefill_queue(config)
        leftover = list(self.waiting)  # empty at start-up; kept general for subclasses
        self.waiting = self.prefill_queue
        if isinstance(self.deferred_waiting, set):
            self.deferred_waiting = _SkipNotices(self.deferred_waiting, self.prefill_queue)
        for request in leftover:
            self.waiting.add_request(request)
        logger.info("prefillq: waiting queue policy %s (%s) from %s", config.policy,
                    ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "policy"), source)
        logger.info("prefillq: scheduler %s on vLLM %s's %s (async scheduling %s)", type(self).__qualname__,
                    vllm_version(), self._vllm_base().__name__,
                    "on" if self.scheduler_config.async_scheduling else "off")
        self.partial_prefill_counters = PartialPrefillCounters()  # partial_prefills="ordered" adds to these
        self._plan: PartialPlan | None = None
        if config.partial_prefills == "ordered" and self.prefill_queue.ranks_partials:
            self._plan = PartialPlan(self, self.prefill_queue, cache_hit=self._cache_hit,
                                     running_status=RequestStatus.RUNNING,
                                     reserve=self._vllm_base()._reserve_prefill_lookahead.__get__(self),
                                     counters=self.partial_prefill_counters, hash_block_size=self._hash_block_size())
        own_reserve = getattr(self._vllm_base(), "_reserve_prefill_lookahead", None)
        if self._plan is None and own_reserve is not None:
            # no plan to cap chunks: vLLM's per-running-request call goes straight to vLLM's own rule
            self._reserve_prefill_lookahead = own_reserve.__get__(self)
        self.metrics_exporter = _start_metrics(vllm_config, config, self.prefill_queue, self.partial_prefill_counters)
        # step records (off unless asked for): read after vLLM's schedule(), never part of scheduling
        self.step_recorder = StepRecorder(steps_folder) if steps_folder else None
        if self.step_recorder is not None:
            logger.info("prefillq: recording engine steps to %s", self.step_recorder.path)

    def _vllm_base(self) -> type:
        return _VllmAsyncScheduler if isinstance(self, _VllmAsyncScheduler) else _VllmScheduler

    def _check_engine(self, config: PolicyConfig, outside: str | None) -> None:
        """Refusals and warnings that need vLLM's own initialised scheduler (SPEC §4.1)."""
        missing = _missing_attributes(self)
        if missing and outside is not None:
            check_vllm_version(vllm_version(), missing)  # raises, naming the range
        if missing:
            raise ConfigError(f"this vLLM {vllm_version()} lacks {', '.join(missing)}, which the plug-in needs")
        if outside is not None:
            _warn_once(outside)
        window = self.cache_aware_window if vllm_version_tuple() >= (0, 34) else 0  # 0.34 added the window
        if window and config.policy != "default":
            raise ConfigError(
                f"vLLM's cache_aware_admission_window={self.cache_aware_window} reorders the waiting queue by "
                f"cached prefix, which would override the {config.policy!r} policy (and count every moved "
                "request as a preemption); leave --cache-aware-admission-window at 0 (hrrn already costs a "
                "request by its uncached tokens) or use policy 'default'")

    def _reorder_waiting_by_cached_prefix(self) -> None:
        # vLLM 0.34, policy `default` only (other policies refuse the window): vLLM removes the window's
        # requests and prepends them in the new order. The queue takes that as a reordering, not as
        # preempted requests coming back, and keeps their waiting times; the removal and the prepends
        # reach it as one move (_HeadMove), in one pass where it can.
        queue = self.prefill_queue
        move = _HeadMove(queue, self.cache_aware_window)
        with queue.reordering():
            self.waiting = move
            try:
                super()._reorder_waiting_by_cached_prefix()
            finally:
                self.waiting = queue
                move.settle()

    def shutdown(self) -> None:
        super().shutdown()
        if self.metrics_exporter is not None:
            self.metrics_exporter.close()
        if self.step_recorder is not None:
            self.step_recorder.close()

    def _policy_config(self, vllm_config: Any, additional: Any) -> tuple[PolicyConfig, str]:
        """The policy to run and where it came from (``--additional-config``, environment or default);
        ``additional`` is vLLM's additional config without the step-recording key (vllm_steps.py)."""
        return resolve_config(additional)

    def _make_prefill_queue(self, config: PolicyConfig) -> PolicyQueue:
        # Under vLLM's priority scheduling the tiers are the requests' own priorities: trusted (SPEC §4.1).
        trust = config.trust_request_priority or config.priority_tiers

        keys: list[CacheKeys] = []

        def view(request: Request) -> QueuedRequest:
            seen = request_view(request, trust_priority=trust, prefix_hit=self._prefix_hit)
            if keys and request.block_hashes:
                keys[0].seen(request, seen.cached_tokens)
            return seen

        self.prefill_queue_view = view
        # arrival: with tiers, `default` orders each tier as vLLM's priority heap, by the request's arrival time
        queue = make_queue(config, clock=time.monotonic, view=view, arrival=lambda request: request.arrival_time)
        queue.memory_limit = None  # _free_request forgets each finished request (no table limit)
        self.cache_keys: CacheKeys | None = None
        if queue.ranks_by_uncached and self.kv_cache_manager.enable_caching:
            # 0.33 and 0.34 hash prompts in blocks of hash_block_size; 0.32 in the scheduler's block size
            self.cache_keys = CacheKeys(queue, self._hash_block_size())
            keys.append(self.cache_keys)
        return queue

    def _hash_block_size(self) -> int:
        """Tokens per entry of ``Request.block_hashes``: 0.33 and 0.34 hash in blocks of their
        ``hash_block_size``, 0.32 in the scheduler's block size."""
        return self.hash_block_size if vllm_version_tuple() >= (0, 33) else self.block_size

    def _cached_tokens_probe(self) -> Callable[[Request], int]:
        """vLLM's read-only prefix-cache probe: ``KVCacheManager.get_num_cached_tokens`` where the release has
        it (0.34), else the same lookup through the coordinator (0.32, 0.33). Chosen once, at start-up."""
        manager = self.kv_cache_manager
        probe = getattr(type(manager), "get_num_cached_tokens", None)
        if probe is not None:
            return manager.get_num_cached_tokens
        return lambda request: self._cache_hit(request)[0]

    def _cache_hit(self, request: Request) -> tuple[int, int]:
        """(tokens the prefix cache holds for ``request`` now, how many of those blocks nobody holds): a
        read-only probe; vLLM takes unheld hit blocks out of the free pool when it admits the request."""
        manager = self.kv_cache_manager
        if not manager.prefix_cache_lookup_enabled(request) or not request.block_hashes:
            return 0, 0
        blocks, hit, _ = manager.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return int(hit), sum(1 for block in blocks[0] if block.ref_cnt == 0) if blocks else 0

    def _prefix_hit(self, request: Request) -> int:
        """Tokens a prefix-cache lookup would find now (0 when caching is off for the request: both probes
        check that themselves)."""
        return int(self._cache_probe(request)) if request.block_hashes else 0

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        recorder = self.step_recorder
        started = recorder.now() if recorder is not None else 0.0
        plan = self._plan
        if plan is not None:
            plan.begin_step()
        output = super().schedule(*args, **kwargs)
        if plan is not None:
            plan.end_step(output, self.prefill_queue)
        if self.cache_keys is not None:
            self.cache_keys.after_step(output.num_scheduled_tokens, self.requests)
        self.prefill_queue.on_prefill_submitted(self._prefill_tokens_in(output))
        if recorder is not None:
            recorder.scheduled(started, output, self.requests, len(self.waiting))
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, *args, **kwargs)
        if self.step_recorder is not None:
            self.step_recorder.updated(scheduler_output)
        return outputs

    # --- partial prefills in the policy's order (SPEC §3.6; integrations/vllm_plan.py) ------------

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        plan = self._plan
        return num_new_tokens if plan is None else plan.cap(request, num_new_tokens)

    def _make_cached_request_data(self, *args: Any, **kwargs: Any) -> Any:
        # Called after vLLM's waiting loop with the step's own lists and dicts (0.32/0.33 also pass the
        # resumed requests, 0.34 does not): the moment to give back budget.
        plan = self._plan
        if plan is not None and plan.held:
            step = _cached_data_signature().bind(self, *args, **kwargs).arguments
            plan.give_back(step["running_reqs"], step["num_scheduled_tokens"], step["req_to_new_blocks"])
        return super()._make_cached_request_data(*args, **kwargs)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if self._plan is not None:
            self._plan.on_preemption()
        super()._preempt_request(request, *args, **kwargs)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # A finished request never comes back: the queue forgets what it kept for a return (no table limit).
        self.prefill_queue.forget_request(request)
        if self.cache_keys is not None:
            self.cache_keys.forget(request)
        return super()._free_request(request, *args, **kwargs)

    def _prefill_tokens_in(self, output: SchedulerOutput) -> int:
        # schedule() has already advanced num_computed_tokens by the scheduled amount.
        total = 0
        requests = self.requests
        for request_id, scheduled in output.num_scheduled_tokens.items():
            request = requests.get(request_id)
            if request is None:
                continue
            before = request.num_computed_tokens - scheduled
            total += prefill_tokens_scheduled(before, scheduled, request.num_prompt_tokens, request.num_tokens)
        return total


class Scheduler(_PrefillQueueMixin, _VllmScheduler):
    """vLLM's scheduler with a prefillq waiting queue, right in every scheduling mode.

    Built with a config whose ``scheduler_config.async_scheduling`` is on, it is an
    :class:`AsyncModeScheduler` (vLLM's ``AsyncScheduler`` underneath, so the engine keeps overlapping
    scheduling with execution); otherwise vLLM's synchronous ``Scheduler`` underneath.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Scheduler:
        if cls is Scheduler and _async_scheduling(args, kwargs):
            cls = AsyncModeScheduler
        return super().__new__(cls)


class AsyncModeScheduler(Scheduler, _VllmAsyncScheduler):
    """What :class:`Scheduler` builds when async scheduling is on: vLLM's ``AsyncScheduler`` underneath."""


# Older command lines name the async class; it is the same one-for-every-mode class.
AsyncScheduler = Scheduler
