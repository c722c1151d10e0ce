"""A differential driver: one request stream through stock vLLM's scheduler and through prefillq's.

No model runs. A stream says when each request arrives and, maybe, when it is aborted (in scheduling
steps); the driver calls ``schedule()`` once per step and answers each batch with made-up model output in
which the token sampled at position ``p`` of request ``r`` depends on ``r`` and ``p`` only. So every
schedule that computes a request's tokens in any order, with any preemptions, yields the same tokens,
and a request's output is known before the run (:func:`expected_tokens`).

Under async scheduling the driver pipelines as vLLM's engine core does with two batches in flight: the
next ``schedule()`` runs before the previous batch's output is applied.

What a run records (:class:`Run`): every step's scheduled tokens per request and the new requests in
admission order, the tokens each request produced, how it finished, the free KV blocks at the end, and
each time a partial-prefill cap of the ``"ordered"`` plan left a running prefill below the chunk vLLM would
have scheduled while budget went unused (SPEC §4.1: never worse than stock's own rule).
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE = 16
VOCAB = 2048


@dataclass(frozen=True)
class StreamRequest:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrive_step: int
    abort_step: int | None = None
    lora: int = 0  # LoRA adapter id (0: the base model)
    priority: int = 0  # vLLM's request priority (lower first; honoured with scheduling_policy "priority")


@dataclass(frozen=True)
class Stream:
    requests: tuple[StreamRequest, ...]
    budget: int
    max_num_seqs: int
    num_blocks: int
    prefix_caching: bool
    async_scheduling: bool
    long_prefill_token_threshold: int = 0
    max_loras: int = 0  # > 0: LoRA on, at most this many adapters per step
    throttle_every: int = 0  # > 0: every such step is a throttled one (schedule(throttle_prefills=True))
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: fcfs or priority

    @property
    def max_model_len(self) -> int:
        longest = max(len(r.prompt) + r.max_tokens for r in self.requests) + BLOCK_SIZE
        return max(longest, self.long_prefill_token_threshold)  # vLLM refuses a chunk cap over the model length


@dataclass
class Step:
    scheduled: dict[str, int]
    new: list[str]
    preempted: list[str]


@dataclass
class IdleCap:
    """A step that left ``idle`` budget unused while the ordered plan held ``request_id`` to ``given`` of the
    ``wanted`` tokens vLLM would have scheduled, with ``free_blocks`` free KV blocks after the step."""

    step: int
    request_id: str
    wanted: int
    given: int
    idle: int
    blocks_needed: int
    free_blocks: int


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, list[str]] = field(default_factory=dict)  # request -> finish reasons seen
    scheduled_after_abort: list[tuple[int, str]] = field(default_factory=list)
    over_budget: list[int] = field(default_factory=list)
    over_seats: list[int] = field(default_factory=list)
    idle_caps: list[IdleCap] = field(default_factory=list)
    free_blocks_at_end: int = 0
    total_blocks: int = 0
    unfinished_at_end: int = 0
    livelock: bool = False


def token_at(request_id: str, position: int) -> int:
    """The token the made-up model samples at ``position`` of ``request_id``."""
    return 3 + (7 * position + 13 * int(request_id)) % (VOCAB - 3)


def expected_tokens(request: StreamRequest) -> list[int]:
    start = len(request.prompt)
    return [token_at(request.request_id, start + i) for i in range(request.max_tokens)]


def model_config(model: str) -> Any:
    """vLLM's model configuration of a local model folder (slow: build it once, it is copied per run)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=model, max_model_len=8192, seed=0, dtype="float32")


def build_scheduler(base_model_config: Any, stream: Stream, prefillq: dict[str, Any] | None) -> Any:
    """A scheduler for ``stream``: stock vLLM's (``prefillq`` None) or prefillq's with that configuration."""
    import torch
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = copy.deepcopy(base_model_config)
    model.max_model_len = stream.max_model_len
    scheduler_config = SchedulerConfig(
        max_num_seqs=stream.max_num_seqs, max_num_batched_tokens=stream.budget, max_model_len=stream.max_model_len,
        enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=stream.async_scheduling,
        long_prefill_token_threshold=stream.long_prefill_token_threshold, policy=stream.scheduling_policy)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=stream.prefix_caching)
    cache_config.num_gpu_blocks = stream.num_blocks
    additional = {"prefillq": {**prefillq, "stats_interval_s": 0}} if prefillq is not None else {}
    lora = {}
    if stream.max_loras:
        from vllm.config import LoRAConfig

        lora = {"lora_config": LoRAConfig(max_loras=stream.max_loras, max_lora_rank=8)}
    vllm_config = VllmConfig(model_config=model, scheduler_config=scheduler_config, cache_config=cache_config,
                             additional_config=additional, **lora)
    vllm_config.scheduler_config.async_scheduling = stream.async_scheduling  # CPU builds turn it off
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=stream.num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    if prefillq is None:
        cls = VllmAsyncScheduler if stream.async_scheduling else VllmScheduler
    else:
        from prefillq.integrations.vllm import Scheduler as cls
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK_SIZE,
               log_stats=False)


def _vllm_request(request: StreamRequest, block_hasher: Any) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True, temperature=0.0)
    lora = None
    if request.lora:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(f"adapter-{request.lora}", request.lora, "/nonexistent")
    return Request(request.request_id, list(request.prompt), params, None, arrival_time=float(request.arrive_step),
                   block_hasher=block_hasher, lora_request=lora, priority=request.priority)


def _model_output(scheduler: Any, output: Any, placeholders: dict[str, int]) -> Any:
    """The made-up model's answer to a batch, decided when it is scheduled: a token for each request that
    samples in this step, at the position after its computed tokens. A request samples when the step
    computes all its known tokens (a chunk of a prompt, or of a preempted request's recomputation, does
    not); under async scheduling vLLM marks exactly those with one more output placeholder."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests[request_id]
        position = request.num_computed_tokens  # schedule() has advanced it past this step's tokens
        if request.num_output_placeholders or placeholders.get(request_id):
            samples = request.num_output_placeholders > placeholders.get(request_id, 0)
        else:
            samples = position >= request.num_tokens
        sampled.append([token_at(request_id, position)] if samples else [])
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    extra = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if "req_id_to_index" in fields else {}  # < 0.34
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **extra)


def _watch_caps(scheduler: Any) -> list[tuple[str, int, int, int]]:
    """Record (request, wanted, given, computed) each time the ordered plan caps a running prefill's chunk."""
    applied: list[tuple[str, int, int, int]] = []
    reserve = getattr(scheduler, "_reserve_prefill_lookahead", None)
    if reserve is None or not hasattr(scheduler, "_partial_caps"):
        return applied
    # what vLLM alone would schedule: the method of the first vLLM class in the MRO (not prefillq's mixin)
    vllm_class = next(c for c in type(scheduler).__mro__ if c.__module__.startswith("vllm."))
    base = vllm_class._reserve_prefill_lookahead

    def watched(request: Any, num_computed_tokens: int, num_new_tokens: int) -> int:
        wanted = base(scheduler, request, num_computed_tokens, num_new_tokens)
        given = reserve(request, num_computed_tokens, num_new_tokens)
        if given < wanted:
            applied.append((request.request_id, wanted, given, num_computed_tokens))
        return given

    scheduler._reserve_prefill_lookahead = watched
    return applied


def run_stream(base_model_config: Any, stream: Stream, prefillq: dict[str, Any] | None,
               setup: Callable[[Any], None] | None = None) -> Run:
    """Drive ``stream`` through one scheduler to the end; what happened (see :class:`Run`). ``setup`` gets
    the scheduler before the first step (a test that changes one of its parts)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import RequestStatus

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256) if stream.prefix_caching else None
    scheduler = build_scheduler(base_model_config, stream, prefillq)
    if setup is not None:
        setup(scheduler)
    caps = _watch_caps(scheduler)
    pool = scheduler.kv_cache_manager.block_pool
    run = Run(total_blocks=pool.get_num_free_blocks())
    arrivals: dict[int, list[StreamRequest]] = {}
    aborts: dict[int, list[str]] = {}
    for request in stream.requests:
        arrivals.setdefault(request.arrive_step, []).append(request)
        if request.abort_step is not None:
            aborts.setdefault(request.abort_step, []).append(request.request_id)
    aborted_at = {r.request_id: r.abort_step for r in stream.requests if r.abort_step is not None}
    last_event = max([*arrivals, *aborts, 0])
    total_tokens = sum(len(r.prompt) + r.max_tokens for r in stream.requests)
    step_limit = last_event + 8 * total_tokens // max(1, stream.budget) + 400
    depth = 2 if stream.async_scheduling else 1
    in_flight: deque = deque()
    step = 0
    while True:
        for request in arrivals.get(step, []):
            scheduler.add_request(_vllm_request(request, hasher))
        if aborts.get(step):
            scheduler.finish_requests(aborts[step], RequestStatus.FINISHED_ABORTED)
        placeholders = {rid: r.num_output_placeholders for rid, r in scheduler.requests.items()
                        if r.num_output_placeholders}
        throttled = bool(stream.throttle_every) and step % stream.throttle_every == stream.throttle_every - 1
        output = scheduler.schedule(throttle_prefills=True) if throttled else scheduler.schedule()
        run.steps.append(Step(dict(output.num_scheduled_tokens),
                              [r.req_id for r in output.scheduled_new_reqs],
                              sorted(getattr(output, "preempted_req_ids", None) or ())))
        _check_step(run, stream, scheduler, output, step, aborted_at, caps)
        caps.clear()
        in_flight.append((output, _model_output(scheduler, output, placeholders)))
        while in_flight and (len(in_flight) >= depth or output.total_num_scheduled_tokens == 0):
            _apply(run, scheduler, *in_flight.popleft())
        step += 1
        if step > last_event and not scheduler.has_requests() and not in_flight:
            break
        if step > step_limit:
            run.livelock = True
            break
    run.free_blocks_at_end = pool.get_num_free_blocks()
    run.unfinished_at_end = scheduler.get_num_unfinished_requests()
    return run


def _apply(run: Run, scheduler: Any, output: Any, model_output: Any) -> None:
    for engine_outputs in scheduler.update_from_output(output, model_output).values():
        for out in engine_outputs.outputs:
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finish_reason is not None:
                run.finished.setdefault(out.request_id, []).append(str(out.finish_reason))


def _check_step(run: Run, stream: Stream, scheduler: Any, output: Any, step: int, aborted_at: dict[str, int],
                caps: list[tuple[str, int, int, int]]) -> None:
    if output.total_num_scheduled_tokens > stream.budget:
        run.over_budget.append(step)
    if len(output.num_scheduled_tokens) > stream.max_num_seqs:
        run.over_seats.append(step)
    for request_id in output.num_scheduled_tokens:
        if request_id in aborted_at and aborted_at[request_id] <= step:
            run.scheduled_after_abort.append((step, request_id))
    idle = stream.budget - output.total_num_scheduled_tokens
    if idle <= 0 or not caps:
        return
    free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    for request_id, wanted, _, computed in caps:
        given = output.num_scheduled_tokens.get(request_id, 0)  # the cap, plus what was given back after it
        extra = min(idle, wanted - given)
        held_after = -(-(computed + given) // BLOCK_SIZE)
        needed = -(-(computed + given + extra) // BLOCK_SIZE) - held_after
        if extra > 0 and needed <= free:
            run.idle_caps.append(IdleCap(step, request_id, wanted, given, idle, needed, free))


def random_stream(seed: int, async_scheduling: bool) -> Stream:
    """A random stream from a seed (benchmarks/engine_matrix.py; a stream it once broke is a regression test)."""
    rng = random.Random(seed)
    max_loras = rng.choice([0, 0, 1, 2])
    prefixes = [[rng.randrange(3, 2000) for _ in range(BLOCK_SIZE * rng.randint(1, 12))] for _ in range(3)]
    requests = []
    for index in range(rng.randint(2, 14)):
        length = rng.randint(300, 3000) if rng.random() < 0.25 else rng.randint(1, 200)
        shared = rng.choice([None, 0, 1, 2])
        prompt = (prefixes[shared] if shared is not None else []) + [rng.randrange(3, 2000) for _ in range(length)]
        arrive = rng.randint(0, 30)
        abort = arrive + rng.randint(0, 20) if rng.randint(0, 6) == 0 else None
        requests.append(StreamRequest(str(index), tuple(prompt), rng.randint(1, 24), arrive, abort,
                                      rng.randint(0, 3) if max_loras else 0))
    biggest = max(-(-(len(r.prompt) + r.max_tokens) // BLOCK_SIZE) for r in requests)
    return Stream(tuple(requests), budget=rng.choice([64, 96, 128, 256, 512]), max_num_seqs=rng.randint(2, 16),
                  num_blocks=rng.randint(biggest + 2, 3 * biggest + 16), prefix_caching=rng.random() < 0.6,
                  async_scheduling=async_scheduling, long_prefill_token_threshold=rng.choice([0, 0, 48, 256]),
                  max_loras=max_loras, throttle_every=rng.choice([0, 0, 3]))
