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

Configuration, first match wins: ``--additional-config '{"prefillq": {...}}'``; the vLLM Ascend key
``{"scheduler_config": {"short_request_first_config": {...}}}`` in the same JSON; the ``PREFILLQ_CONFIG``
environment variable (JSON text, a policy name or a path to a JSON file); else the default policy (FCFS)
(:func:`prefillq.config.resolve_config`).
The engine refuses to start with vLLM's ``priority`` scheduling policy, with ``short_request_first``
on a decode-only node (``kv_role == "kv_consumer"``), with a vLLM outside the supported range that
lacks a hook the plug-in needs (one that has them all starts with a warning), and with vLLM 0.34's
``cache_aware_admission_window`` under any policy but ``default`` (the window would reorder the queue
behind the policy's back; with ``default`` it works as in stock vLLM). vLLM 0.34's ``async_kv_waiting``
queue (requests about to load KV asynchronously) keeps vLLM's own order, like ``kv_holding_waiting``.
"""

from __future__ import annotations

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

from prefillq.config import ConfigError, PolicyConfig, resolve_config, validate_deployment
from prefillq.integrations.metrics import MetricsError, MetricsExporter, PartialPrefillCounters, start_exporter
from prefillq.policies import PolicyQueue, make_queue
from prefillq.requests import QueuedRequest

logger = logging.getLogger("prefillq")

# Our queues implement RequestQueue's methods; registering makes isinstance checks agree.
RequestQueue.register(PolicyQueue)

# vLLM releases (major, minor) the plug-in is tested against (`make test` runs vLLM's own scheduler tests
# of each with our classes). Keep in step with pyproject.toml's `vllm` extra and docs/vllm.md.
SUPPORTED_VLLM = ((0, 32), (0, 33), (0, 34))
SUPPORTED_RANGE = ">=0.32,<0.35"
# What the plug-in reaches into: methods of vLLM's Scheduler it calls or overrides, and attributes a
# scheduler instance must have after vLLM's own __init__.
NEEDED_METHODS = ("schedule", "_preempt_request", "_reserve_prefill_lookahead", "get_request_counts", "shutdown")
NEEDED_ATTRIBUTES = ("waiting", "running", "requests", "kv_holding_waiting", "deferred_waiting",
                     "kv_cache_manager", "max_num_scheduled_tokens", "scheduler_config")


# --- configuration ------------------------------------------------------------------------------

def _check_deployment(vllm_config: Any, config: PolicyConfig) -> None:
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    kv_role = getattr(kv_transfer, "kv_role", None) if kv_transfer is not None else None
    policy = getattr(vllm_config.scheduler_config, "policy", "fcfs")
    validate_deployment(config, kv_role=kv_role, scheduling_policy=str(getattr(policy, "value", policy)))


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


def version_in_range(version: str) -> bool:
    """Whether a vLLM version string falls in ``SUPPORTED_VLLM`` (any patch release, pre-releases too)."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) in SUPPORTED_VLLM
    except (IndexError, ValueError):
        return False


def check_vllm_version(version: str, missing: list[str]) -> str | None:
    """SPEC §4.1: None inside the range; outside it a warning when no hook is ``missing``, else ConfigError."""
    if version_in_range(version):
        return None
    supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_VLLM)
    if missing:
        raise ConfigError(f"vLLM {version} is outside the range prefillq supports ({SUPPORTED_RANGE}: {supported}) "
                          f"and lacks what the plug-in needs ({', '.join(missing)}); install a supported vLLM, "
                          "e.g. pip install 'prefillq[vllm]'")
    return (f"vLLM {version} is outside the range prefillq is tested with ({SUPPORTED_RANGE}: {supported}); every "
            "hook the plug-in needs is present, so it runs, but check the results")


def _missing_methods() -> list[str]:
    return [f"Scheduler.{name}" for name in NEEDED_METHODS if not hasattr(_VllmScheduler, name)]


def _missing_attributes(scheduler: Any) -> list[str]:
    return [f"Scheduler.{name}" for name in NEEDED_ATTRIBUTES if not hasattr(scheduler, name)]


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
    prefix-cache hit it would get right now.
    """
    prompt = request.num_prompt_tokens
    computed = request.num_computed_tokens
    output = request.num_output_tokens
    preempted = request.status == RequestStatus.PREEMPTED or request.num_preemptions > 0
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


def prefill_tokens_scheduled(before: int, scheduled: int, num_prompt_tokens: int, num_tokens: int) -> int:
    """How many of ``scheduled`` tokens, starting at computed position ``before``, are prefill work.

    A fresh request prefills its prompt; a preempted one recomputes its prompt and its earlier output
    (all but the last token, whose step is the next decode). Decode steps contribute 0.
    """
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    return max(0, min(before + scheduled, prefill_end) - before)


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

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        route_logs_to_vllm()
        try:
            outside = check_vllm_version(vllm_version(), _missing_methods())
            config, source = self._policy_config(vllm_config)
            _check_deployment(vllm_config, config)
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
        self._ordered = config.partial_prefills == "ordered"
        self._partial_caps: dict[str, int] | None = None
        self._stalled = False
        self.prefill_queue = self._make_prefill_queue(config)
        leftover = list(self.waiting)  # empty at start-up; kept general for subclasses
        self.waiting = self.prefill_queue
        if isinstance(getattr(self, "deferred_waiting", None), set):
            self.deferred_waiting = _SkipNotices(self.deferred_waiting, self.prefill_queue)
        for request in leftover:
            self.waiting.add_request(request)
        logger.info("prefillq: waiting queue policy %s (%s) from %s", config.policy,
                    ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if k != "policy"), source)
        logger.info("prefillq: scheduler %s on vLLM %s's %s (async scheduling %s)", type(self).__qualname__,
                    vllm_version(), self._vllm_base().__name__,
                    "on" if getattr(self.scheduler_config, "async_scheduling", False) else "off")
        self.partial_prefill_counters = PartialPrefillCounters()  # partial_prefills="ordered" adds to these
        self.metrics_exporter = _start_metrics(vllm_config, config, self.prefill_queue, self.partial_prefill_counters)

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
        if getattr(self, "cache_aware_window", 0) and config.policy != "default":
            raise ConfigError(
                f"vLLM's cache_aware_admission_window={self.cache_aware_window} reorders the waiting queue by "
                f"cached prefix, which would override the {config.policy!r} policy (and count every moved "
                "request as a preemption); leave --cache-aware-admission-window at 0 (hrrn already costs a "
                "request by its uncached tokens) or use policy 'default'")

    def _reorder_waiting_by_cached_prefix(self) -> None:
        # vLLM 0.34, policy `default` only (other policies refuse the window): vLLM removes the window's
        # requests and prepends them in the new order. The queue takes that as a reordering, not as
        # preempted requests coming back, and keeps their waiting times.
        with self.prefill_queue.reordering():
            super()._reorder_waiting_by_cached_prefix()

    def shutdown(self) -> None:
        super().shutdown()
        if self.metrics_exporter is not None:
            self.metrics_exporter.close()

    def _policy_config(self, vllm_config: Any) -> tuple[PolicyConfig, str]:
        """The policy to run and where it came from (``--additional-config``, environment or default)."""
        return resolve_config(vllm_config.additional_config)

    def _make_prefill_queue(self, config: PolicyConfig) -> PolicyQueue:
        trust = config.trust_request_priority

        def view(request: Request) -> QueuedRequest:
            return request_view(request, trust_priority=trust, prefix_hit=self._prefix_hit)

        self.prefill_queue_view = view
        return make_queue(config, clock=time.monotonic, view=view)

    def _prefix_hit(self, request: Request) -> int:
        """Tokens a prefix-cache lookup would find now (0 when caching is off or the lookup fails).

        A read-only probe of the block pool, so HRRN can cost a request by its uncached tokens; the
        scheduler does its own lookup again at admission, when blocks are actually taken.
        """
        try:
            manager = self.kv_cache_manager
            if not manager.prefix_cache_lookup_enabled(request) or not request.block_hashes:
                return 0
            _, hit, _ = manager.coordinator.find_longest_cache_hit(request.block_hashes,
                                                                   request.num_tokens - 1)
            return int(hit)
        except Exception:  # an internal API moved: cost the request by its full prompt instead
            return 0

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self._partial_caps = self._plan_partials() if self._ordered and not self._stalled else None
        planned = self._partial_caps is not None
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._partial_caps = None
        # A step that the caps left empty (they kept budget for waiting requests that could not run
        # after all) is followed by one under vLLM's own rule, so that some partial prefill progresses.
        self._stalled = planned and output.total_num_scheduled_tokens == 0
        self.prefill_queue.on_prefill_submitted(self._prefill_tokens_in(output))
        return output

    # --- partial prefills in the policy's order (SPEC §3.6) ------------------------------------

    def _plan_partials(self) -> dict[str, int] | None:
        """This step's caps on the running partial prefills, or None (no partials, or ``default``)."""
        partials = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        if not partials:
            return None
        ids = {r.request_id for r in partials}
        threshold = self._chunk_ceiling()
        budget = self.max_num_scheduled_tokens
        decode_blocks = 0
        for request in self.running:  # decodes (and other running work) are scheduled as before
            if request.request_id in ids or self._skips_running(request):
                continue
            need = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            need = min(max(0, need), threshold or need, max(0, budget))
            budget -= need
            if need:  # the blocks its tokens take before any waiting request is admitted
                decode_blocks += max(0, -(-(request.num_computed_tokens + need) // self.block_size)
                                     - -(-request.num_computed_tokens // self.block_size))
        seats = getattr(self, "max_num_active_reqs", self.max_num_running_reqs)
        free_seats = seats - len(self.running) - getattr(self, "num_waiting_for_streaming_input", 0)
        last: list[dict[str, int]] = [{}]

        def replan(caps: dict[str, int]) -> Callable[[Request, int], int] | None:
            if caps == last[0] or not any(r.block_hashes for r in partials):
                return None
            last[0] = caps
            return self._demand_predictor(ids, threshold, decode_blocks, self._filled_blocks(partials, caps))

        caps = self.prefill_queue.plan_step(partials, max(0, budget), free_seats=free_seats,
                                            demand=self._demand_predictor(ids, threshold, decode_blocks, set()),
                                            replan=replan)
        return caps or None

    def _skips_running(self, request: Request) -> bool:
        """Whether vLLM's running loop passes ``request`` over this step (async scheduling: its last decode
        is already in flight; pipeline cadence)."""
        placeholders = request.num_output_placeholders
        if placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
            return True
        return getattr(self, "current_step", 0) + 1 < getattr(request, "next_decode_eligible_step", 0)

    def _filled_blocks(self, partials: list[Request], caps: dict[str, int]) -> set[Any]:
        """Hashes of the blocks the partials' capped chunks fill this step: vLLM caches them when it
        allocates, before the waiting loop, so a waiting request sharing them hits them in the same step."""
        filled: set[Any] = set()
        for request in partials:
            start = request.num_computed_tokens // self.block_size
            filled.update(request.block_hashes[start:(request.num_computed_tokens + caps.get(request.request_id, 0))
                                               // self.block_size])
        return filled

    def _chunk_ceiling(self) -> int:
        """vLLM's effective ``long_prefill_token_threshold`` for this step (0: none), as schedule() sets it."""
        config = self.scheduler_config
        threshold = config.long_prefill_token_threshold
        running, waiting = self.get_request_counts()
        if running + waiting <= 1:
            return 0
        if threshold > 0 and getattr(self, "adaptive_long_prefill_threshold", False):
            threshold = max(threshold, config.max_num_batched_tokens // (running + waiting))
        return threshold

    def _demand_predictor(self, partial_ids: set[str], threshold: int, decode_blocks: int,
                          filled: set[Any]) -> Callable[[Request, int], int]:
        """What vLLM will schedule for a request given the budget left: the chunk, within the free KV
        blocks less those the running decodes take first (a partial prefill is capped to what fits, so the
        plan never causes a preemption). A waiting request starts after its prefix-cache hit, extended by
        the ``filled`` blocks that chunks scheduled before it cache in the same step; it is admitted only
        if its chunk fits, and its whole prompt too with ``scheduler_reserve_full_isl``, above the
        watermark; the waiting loop stops at the first request that is not."""
        block_size = self.block_size
        try:
            free = self.kv_cache_manager.block_pool.get_num_free_blocks() - decode_blocks
        except AttributeError:  # an internal API moved: plan without the KV check
            free = None
        full_isl = bool(getattr(self, "scheduler_reserve_full_isl", False))
        watermark = int(getattr(self.kv_cache_manager, "watermark_blocks", 0) or 0)
        filled = set(filled)
        stopped = False

        def demand(request: Request, left: int) -> int:
            nonlocal free, stopped
            partial = request.request_id in partial_ids
            if partial:
                start = request.num_computed_tokens
            else:  # a waiting request starts after its prefix-cache hit (what the queue's view sees)
                start = self.prefill_queue_view(request).cached_tokens
                hashes = request.block_hashes
                if filled and start % block_size == 0:
                    most = min(len(hashes), (request.num_tokens - 1) // block_size)
                    while start // block_size < most and hashes[start // block_size] in filled:
                        start += block_size
            chunk = min(request.num_tokens - start, left)
            if threshold:
                chunk = min(chunk, threshold)
            chunk = max(chunk, 0 if partial else 1)
            if free is None:
                return chunk
            held = -(-start // block_size) if partial else start // block_size
            if partial:
                chunk = min(chunk, (held + free) * block_size - start)
                if chunk <= 0:
                    return 0
            need = -(-(start + chunk) // block_size) - held
            if not partial:
                whole = -(-request.num_tokens // block_size) - held if full_isl else need
                if stopped or max(need, whole) + watermark > free:
                    stopped = True
                    return 0
                filled.update(request.block_hashes[held:(start + chunk) // block_size])
            free -= max(0, need)
            return chunk

        return demand

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        caps = self._partial_caps
        if caps is not None and request.status == RequestStatus.RUNNING:
            cap = caps.get(request.request_id)
            if cap is not None and cap < num_new_tokens:
                self.partial_prefill_counters.record(1, num_new_tokens - cap)  # for the metrics endpoint
                return cap  # 0: vLLM skips this running request for the step (it keeps its blocks)
        return num_new_tokens

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # After a preemption vLLM admits no waiting request this step: the budget kept for them
        # goes back to the partial prefills still to be scheduled.
        self._partial_caps = None
        super()._preempt_request(request, *args, **kwargs)

    def _prefill_tokens_in(self, output: SchedulerOutput) -> int:
        # schedule() has already advanced num_computed_tokens by the scheduled amount.
        total = 0
        for request_id, scheduled in output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
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
