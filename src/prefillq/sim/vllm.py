"""A discrete-event model of vLLM V1's continuous-batching step loop, driven by a prefill-queue policy.

One :class:`VllmNode` is one engine instance. Each ``step``, like ``vllm.v1.core.sched.Scheduler.schedule``:

1. schedules RUNNING requests first, in running order: a decode gets 1 token, an unfinished prefill a
   chunk of ``min(remaining, long_prefill_token_threshold, token budget left)``; a request whose KV
   blocks cannot be allocated preempts the newest running request (which frees its blocks, resets
   its computed tokens and re-enters the waiting queue through ``prepend_request``);
2. if nothing was preempted, admits WAITING requests through the policy queue (peek, check, pop) while
   the token budget, ``max_num_seqs`` and the KV blocks allow; a head that cannot get blocks stops
   the scan;
   With ``partial_prefills="ordered"`` (SPEC §3.6) step 1 gives each unfinished prefill at most the
   cap that the policy's ``plan_step`` leaves it after the waiting requests ranked ahead of it; the
   waiting loop then admits those requests. Decodes are scheduled as before.
3. tells the queue the step's prefill tokens (``on_prefill_submitted``) and advances the simulated
   clock by the cost model's latency of the batch.

A request whose prefill completes in a step samples its first token at the end of that step (TTFT);
a running decode produces one token per step it is scheduled in.

Speed: running decodes are not touched one by one each step. While a decode is scheduled every step
("lockstep", the normal case) its output count, next KV-block boundary, context length and finish
step follow from the step counter; aggregate counters (decodes needing a block this step, the sum
of decode context) replace per-request loops. Only steps where some decode is skipped or preempted
(token budget smaller than the number of decodes, KV exhaustion) take the exact per-request path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefillq import make_queue
from prefillq.config import load_config
from prefillq.policies.base import PolicyQueue
from prefillq.requests import QueuedRequest
from prefillq.sim.costs import CostModel
from prefillq.sim.node import (
    DECODE,
    PREFILL,
    WAITING,
    EngineLimits,
    SimNode,
    SimRequest,
    SimulationError,
    ceil_div,
    check_fits_kv,
    queue_view,
)
from prefillq.sim.prefix_cache import PrefixCache, PrefixState
from prefillq.sim.unqueued import run_unqueued_steps
from prefillq.sim.vllm_paths import PlainPaths, plain_demand
from prefillq.sim.vllm_priority import schedule_running_by_priority

SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy


def _priority_view(view: Callable[[Any], QueuedRequest]) -> Callable[[Any], QueuedRequest]:
    """The view in priority mode: the request's priority class is its priority (the operator trusts it)."""
    def with_priority(r: SimRequest) -> QueuedRequest:
        seen = view(r)
        seen.priority = r.priority
        return seen

    return with_priority


def _arrival(r: SimRequest) -> float:
    return r.arrival_s


Chunks = list[tuple[SimRequest, int]]


class VllmNode(PlainPaths, SimNode):
    """One simulated vLLM V1 engine instance (a "mixed" node: prefill and decode)."""

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 on_finish: Callable[[SimRequest], None] | None = None,
                 view: Callable[[Any], QueuedRequest] = queue_view,
                 hash_block_tokens: int | None = None, queue: Callable[..., Any] | None = None,
                 scheduling_policy: str = "fcfs") -> None:
        super().__init__(cost, limits, record_steps=record_steps, on_finish=on_finish)
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling_policy {scheduling_policy!r}; "
                             f"valid: {', '.join(SCHEDULING_POLICIES)}")
        # vLLM's --scheduling-policy priority (sim/vllm_priority.py): request priorities are honoured
        self.by_priority = scheduling_policy == "priority"
        self.block_size = limits.block_size
        self.threshold = limits.long_prefill_token_threshold
        # vLLM's prefix caching (sim/prefix_cache.py), on when the workload's requests carry block hashes
        self.prefix = (None if hash_block_tokens is None
                       else PrefixCache(limits.kv_blocks, limits.block_size, hash_block_tokens))
        if self.prefix is not None and view is queue_view:
            view = self._prefix_view
        arrival = None
        if self.by_priority:  # strict tiers of the request's priority class, vLLM's arrival-time ties
            view, policy, arrival = _priority_view(view), load_config(policy).with_(priority_tiers=True), _arrival
        # ``queue(clock, view)``: a queue built elsewhere (sim/clairvoyant.py's reference schedules)
        self.waiting = (make_queue(policy, clock=lambda: self.now, view=view, arrival=arrival) if queue is None
                        else queue(lambda: self.now, view))
        self.ordered = self.waiting.config.partial_prefills == "ordered"
        # With nothing waiting, an "ordered" plan gives a lone partial prefill what the engine's rule
        # does (when its blocks fit); it may be skipped where planning leaves no trace in the policy.
        kind = type(self.waiting)
        self._plain_plans = (not self.by_priority and kind._plan_begin is PolicyQueue._plan_begin
                             and kind._on_partial_planned is PolicyQueue._on_partial_planned)
        self.caps: dict[str, int] | None = None      # this step's caps on partial prefills (ordered)
        self.stalled = False                         # the last step ran nothing because of its caps
        self.decoding: dict[str, SimRequest] = {}     # running decodes
        self.block_boundary = [0] * self.block_size  # decodes by (step at which they need a new block)
        self.max_decode_seq = -1                     # upper bound of the decodes' running positions
        self.free_blocks = limits.kv_blocks
        self.prefill_work = 0                         # prompt (and recomputed) tokens prefilled so far
        self.next_seq = 0
        self._next_lane_sample = 0.0
        self.decode_terms: dict[int, tuple[float, float]] = {}  # run_unqueued_steps' cost.decode_step_terms(n), by n
        kind = type(self)
        # step() may admit a lone waiting request beside lockstep decodes without the generic passes (_admit_alone)
        self._lone_admissions = (not self.by_priority and self.prefix is None and not record_steps
                                 and all(getattr(kind, name) is getattr(VllmNode, name) for name in (
                                     "_schedule_running", "_schedule_waiting", "_batch_latency",
                                     "_schedule_prefill_chunk")))
        # every request's end of prefill and last token done inline (_prefill_completed, _end_decodes)
        self._inline_ends = self.prefix is None and all(getattr(kind, name) is getattr(VllmNode, name) for name in (
            "_close_decode_run", "_end_decode", "_leave_decodes", "_finish", "_start_decoding", "_join_decodes",
            "_start_decode_run", "_point", "_prefill_completed", "_sample_lanes"))
        self.lane_interval_s = 0.1

    # --- requests in and out -------------------------------------------------------------------

    def add_request(self, request: SimRequest, now: float) -> None:
        """A request arrives (at ``now``): it joins the waiting queue."""
        self.now = now
        self.waiting.add_request(request)

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.prefilling) or bool(self.decoding)

    def waiting_count(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_decoding(self) -> int:
        return len(self.decoding)

    @property
    def used_blocks(self) -> int:
        return self.limits.kv_blocks - self.free_blocks

    @property
    def policy_name(self) -> str:
        return self.waiting.policy

    # --- one engine step -------------------------------------------------------------------------

    def step(self, now: float) -> float | None:
        """Schedule and run one step starting at ``now``; return its end time (None: nothing to run)."""
        self.now = now
        step = self.step_index
        if self._lone_admissions and not self.prefilling and len(self.waiting) == 1 and self.fast_steps:
            end = self._admit_alone(now, step)
            if end is not None:
                return end
        chunks: Chunks = []
        preempted: list[SimRequest] = []
        # A step that ran nothing (its caps kept budget for waiting requests that a preemption shut
        # out) is followed by one under the engine's own rule, so that some partial prefill progresses.
        self.caps = self._plan_partials(step) if self.ordered and self.prefilling and not self.stalled else None
        self.stalled = False

        # 1. RUNNING requests, in running order: a decode gets one token, a prefill its next chunk.
        decoded, budget, skipped_context = self._schedule_running(step, self.budget, chunks, preempted)

        # 2. WAITING requests through the policy queue, only if nothing was preempted in this step.
        if not preempted:
            budget = self._schedule_waiting(budget, step, chunks)

        prefill_tokens = 0
        for _, chunk in chunks:
            prefill_tokens += chunk
        self.prefill_work += prefill_tokens
        self.waiting.on_prefill_submitted(prefill_tokens)
        if not chunks and not decoded:
            if self.caps is not None:
                # The caps kept budget for waiting requests that could not run after all (a preemption
                # shut them out, or no partial prefill fitted the free KV blocks). vLLM's step comes
                # back empty and the next one, planned without caps, runs at once.
                self.stalled = True
                return self.step(now)
            if preempted and not self._may_idle_after_preemption():
                raise SimulationError("preemption left nothing to run")
            return None

        # 3. Run the batch: the cost model gives the latency; then every scheduled request advances.
        end = now + self._batch_latency(chunks, prefill_tokens, decoded, self.decode_context - skipped_context)
        if self.record_steps:
            self._record_step(step, now, end, chunks, decoded, preempted)
        self._finish_step(step, end, chunks, decoded, prefill_tokens)
        return end

    fast_steps = True  # run_unqueued_steps and step() may take their fast paths (False: every step the generic way)

    # run_unqueued_steps(now, until): the steps from ``now`` that start before ``until`` while nothing waits,
    # run fast and exactly as step() would run them (sim/unqueued.py); the time the last one ends (``now``: none ran)
    run_unqueued_steps = run_unqueued_steps

    def _plan_partials(self, step: int) -> dict[str, int] | None:
        """SPEC §3.6: the policy's caps on this step's partial prefills (what the waiting requests
        ranked ahead of them leave), predicting the waiting loop's budget, seat and KV checks and the
        prefix-cache hits that this step's earlier chunks add (None: no caps, the engine's own rule)."""
        partials = [r for r in self.prefilling if r.status == PREFILL]
        if self.prefix is None:  # no cache hits to predict: one walk
            running = len(self.prefilling) + len(self.decoding)
            caps = self.waiting.plan_step(partials, self.budget - len(self.decoding),
                                          free_seats=self.limits.max_num_seqs - running,
                                          demand=self._plan_demand(step, partials, {}))
            return caps or None
        shared = any(r.hashes is not None for r in partials)
        last: list[dict[str, int]] = [{}]

        def replan(caps: dict[str, int]) -> Any:
            if not shared or caps == last[0]:
                return None
            last[0] = caps
            return self._plan_demand(step, partials, caps)

        caps = self.waiting.plan_step(partials, self.budget - len(self.decoding),
                                      free_seats=self.limits.max_num_seqs - self.num_running,
                                      demand=self._plan_demand(step, partials, {}), replan=replan)
        return caps or None

    def _plan_demand(self, step: int, partials: list[SimRequest], caps: dict[str, int]) -> Any:
        """plan_step's demand for one walk, given the partials' caps of the walk before (their chunks run
        first in the step and cache the blocks they fill, which waiting requests admitted after them hit)."""
        threshold = self.threshold
        free = self.free_blocks - (self.block_boundary[-step % self.block_size] if self.decoding else 0)
        waiting_stopped = False
        if self.prefix is None:  # the same demand without the cache's hits
            return plain_demand(self, free)
        filled: set[Any] = set()  # block keys this step's earlier chunks cache
        if self.prefix is not None:
            for p in partials:
                if p.hashes is not None and caps.get(p.request_id):
                    keys = self._state(p).block_keys
                    filled.update(keys[p.num_computed // self.block_size:
                                       (p.num_computed + caps[p.request_id]) // self.block_size])

        def demand(r: SimRequest, left: int) -> int:
            nonlocal free, waiting_stopped
            hit = taken = 0
            if r.status == WAITING and self.prefix is not None and r.hashes is not None and not r.num_computed:
                hit, taken = self._admission_hit(r)  # its admission will start after its cache hit
                if filled:
                    keys, most = self._state(r).block_keys, (r.target - 1) // self.block_size
                    while hit < min(most, len(keys)) and keys[hit] in filled:
                        hit += 1
            computed = r.num_computed + hit * self.block_size
            chunk = r.target - computed
            if threshold and chunk > threshold:
                chunk = threshold
            chunk = min(chunk, left)
            if r.status != WAITING:  # a partial prefill: no more than its blocks and the free ones hold
                chunk = min(chunk, (r.blocks + max(0, free)) * self.block_size - r.num_computed)
                if chunk <= 0:
                    return 0
            need = ceil_div(computed + chunk, self.block_size) - r.blocks - hit + taken
            if r.status == WAITING and (waiting_stopped or need > free):
                waiting_stopped = True  # vLLM's waiting loop stops at the first request without blocks
                return 0
            free -= max(0, need)
            if r.status == WAITING and r.hashes is not None and self.prefix is not None:
                filled.update(self._state(r).block_keys[hit:(computed + chunk) // self.block_size])
            return chunk

        return demand

    def _schedule_running(self, step: int, budget: int, chunks: Chunks,
                          preempted: list[SimRequest]) -> tuple[int, int, int]:
        """Schedule the running requests; return (decodes scheduled, budget left, context of skipped decodes)."""
        if self.by_priority:
            return schedule_running_by_priority(self, step, budget, chunks, preempted)
        num_decodes = len(self.decoding)
        if num_decodes and self.prefilling and self.max_decode_seq > self.prefilling[0].seq:
            self.max_decode_seq = max(r.seq for r in self.decoding.values())
        decodes_first = not self.prefilling or self.max_decode_seq < self.prefilling[0].seq
        new_decode_blocks = self.block_boundary[-step % self.block_size] if num_decodes else 0
        if num_decodes > budget or not decodes_first or new_decode_blocks > self.free_blocks:
            return self._schedule_running_exactly(step, budget, chunks, preempted)
        # Lockstep: every running decode gets its token; the unfinished prefills follow in order.
        budget -= num_decodes
        self.free_blocks -= new_decode_blocks
        if self.prefix is not None and new_decode_blocks:
            self.prefix.allocate(new_decode_blocks)
        if not self.prefilling:
            return num_decodes, budget, 0
        tail = list(self.prefilling)  # decodes all come first, so preemption victims are prefills
        for r in list(self.prefilling):
            if r.status != PREFILL:
                continue  # preempted earlier in this loop
            budget = self._schedule_prefill_chunk(r, budget, step, chunks, preempted, tail)
        return num_decodes, budget, 0

    def _schedule_prefill_chunk(self, r: SimRequest, budget: int, step: int,
                                chunks: Chunks, preempted: list[SimRequest],
                                running: list[SimRequest]) -> int:
        """Give an unfinished prefill its chunk, preempting from the tail of ``running`` if KV is short."""
        chunk = r.target - r.num_computed
        if self.threshold and chunk > self.threshold:
            chunk = self.threshold
        chunk = min(chunk, budget)
        if self.caps is not None and not preempted:  # after a preemption no waiting request runs
            chunk = min(chunk, self.caps.get(r.request_id, chunk))
        if chunk <= 0:
            return budget
        need = ceil_div(r.num_computed + chunk, self.block_size) - r.blocks
        while need > self.free_blocks:
            victim = running.pop()  # vLLM: self.running.pop(), the newest running request
            self._preempt(victim, step)
            preempted.append(victim)
            if victim is r:
                return budget
        self.free_blocks -= need
        r.blocks += need
        if self.prefix is not None:
            self._cache_chunk(r, need, chunk)
        chunks.append((r, chunk))
        return budget - chunk

    def _schedule_running_exactly(self, step: int, budget: int, chunks: Chunks,
                                  preempted: list[SimRequest]) -> tuple[int, int, int]:
        """The per-request running loop, for steps where some decode is skipped or preempted."""
        running, budget, decoded = self._running_after_head(step, budget)
        skipped_context = 0
        index = 0
        while index < len(running):
            r = running[index]
            index += 1
            if r.status == PREFILL:
                budget = self._schedule_prefill_chunk(r, budget, step, chunks, preempted, running)
                if r.status == WAITING:
                    break  # it preempted itself: everything after it is already gone
                continue
            if budget < 1:
                skipped_context += r.prompt_tokens + r.out_before(step)
                self._skip_decode(r, step)
                continue
            needs_block = (r.prompt_tokens + r.out_before(step) - 1) % self.block_size == 0
            preempted_self = False
            while needs_block and self.free_blocks < 1:
                victim = running.pop()
                self._preempt(victim, step)
                preempted.append(victim)
                if victim is r:
                    preempted_self = True
                    break
            if preempted_self:
                break
            if needs_block:
                self.free_blocks -= 1
                if self.prefix is not None:
                    self.prefix.allocate(1)
            budget -= 1
            decoded += 1
        return decoded, budget, skipped_context

    def _schedule_waiting(self, budget: int, step: int, chunks: Chunks) -> int:
        """vLLM's waiting loop: peek, check budget/seqs/KV, then pop (the pop returns the peeked one)."""
        waiting = self.waiting
        max_seqs = self.limits.max_num_seqs
        prefix = self.prefix
        limits, size, threshold = self.limits, self.block_size, self.threshold
        kv_blocks = limits.kv_blocks
        prefilling, decoding = self.prefilling, self.decoding
        while budget > 0 and waiting and len(prefilling) + len(decoding) < max_seqs:
            r: SimRequest = waiting.peek_request()
            computed = r.num_computed
            if -(-r.target // size) > kv_blocks:
                check_fits_kv(r, limits)  # raises: it could never run
            hit = taken = 0
            if prefix is not None and r.hashes is not None and not computed:
                hit, taken = self._admission_hit(r)
                computed += hit * size
            chunk = r.target - computed
            if threshold and chunk > threshold:
                chunk = threshold
            if chunk > budget:
                chunk = budget
            need = -(-(computed + chunk) // size) - r.blocks - hit
            if need + taken > self.free_blocks:
                break
            popped = waiting.pop_request()
            assert popped is r, "the policy queue must pop the request it peeked"
            if prefix is not None:
                self._admit_with_cache(r, hit, taken)
            self.free_blocks -= need
            r.blocks += need
            if prefix is not None:
                self._cache_chunk(r, need, chunk)
            r.status = PREFILL
            r.seq = self.next_seq
            self.next_seq += 1
            if r.first_scheduled_s is None:
                r.first_scheduled_s = self.now
            prefilling.append(r)
            chunks.append((r, chunk))
            budget -= chunk
        return budget

    # --- lockstep decode bookkeeping -------------------------------------------------------------

    def _boundary_key(self, r: SimRequest) -> int:
        # A decode needs a new block at step t iff its computed tokens (prompt + out - 1) are a
        # multiple of the block size; with out = run_start_out + t - run_start_step that is a fixed
        # residue of t.
        return (r.prompt_tokens + r.run_start_out - r.run_start_step - 1) % self.block_size

    def _start_decode_run(self, r: SimRequest, first_step: int, out_before: int) -> None:
        """(Re)start a lockstep run whose first token comes at ``first_step``."""
        r.run_start_step = first_step
        r.run_start_out = out_before
        r.finish_step = finish = first_step + r.output_tokens - out_before - 1
        self.block_boundary[(r.prompt_tokens + out_before - first_step - 1) % self.block_size] += 1  # _boundary_key
        ending = self.finish_at.get(finish)
        if ending is None:
            self.finish_at[finish] = [r]
        else:
            ending.append(r)

    def _join_decodes(self, r: SimRequest, step: int) -> None:
        """A request whose prefill completed in ``step`` (sampling a token) decodes from step + 1."""
        r.status = DECODE
        self.decoding[r.request_id] = r
        self._start_decode_run(r, step, r.num_output - 1)
        self.decode_context += r.prompt_tokens + r.num_output
        if r.seq > self.max_decode_seq:
            self.max_decode_seq = r.seq

    def _leave_decodes(self, r: SimRequest, out: int, context_in_sum: int) -> None:
        self.block_boundary[self._boundary_key(r)] -= 1
        del self.decoding[r.request_id]
        self.decode_context -= context_in_sum
        r.num_output = out
        if not self.decoding:
            self.max_decode_seq = -1

    def _skip_decode(self, r: SimRequest, step: int) -> None:
        """A decode not scheduled in ``step`` (no token budget left): its run resumes at step + 1."""
        out = r.out_before(step)
        if step - 1 >= r.run_start_step:
            r.token_runs.append((r.run_start_step, step - 1))
        self.block_boundary[self._boundary_key(r)] -= 1
        self._start_decode_run(r, step + 1, out)

    def _preempt(self, r: SimRequest, step: int, extra_blocks: int = 0) -> None:
        """vLLM's preemption: free the blocks, reset computed tokens, back to the waiting queue
        (``extra_blocks``: a block a decode took earlier in this step)."""
        if r.status == DECODE:
            out = r.out_before(step)
            if step - 1 >= r.run_start_step:
                r.token_runs.append((r.run_start_step, step - 1))
            self._free(r, ceil_div(r.prompt_tokens + out - 1, self.block_size) + extra_blocks)
            self._leave_decodes(r, out, r.prompt_tokens + out)
        else:
            self.prefilling.remove(r)
            self._free(r, r.blocks)
        r.blocks = 0
        r.num_computed = 0
        r.target = r.prompt_tokens + r.num_output
        r.status = WAITING
        r.preemptions += 1
        self.preemption_count += 1
        self.waiting.prepend_request(r)

    # --- what the shared step end asks of this node ----------------------------------------------

    def release_kv(self, r: SimRequest) -> None:
        if self.prefix is None:
            self.free_blocks += r.blocks
        else:
            self._free(r, r.blocks)
        r.blocks = 0

    def _start_decoding(self, r: SimRequest, step: int) -> None:
        r.blocks = 0                # from here on the decode's blocks are implicit
        self._join_decodes(r, step)

    def _end_decode(self, r: SimRequest) -> None:
        context = r.prompt_tokens + r.output_tokens
        blocks = -(-(context - 1) // self.block_size)
        if self.prefix is None:
            self.free_blocks += blocks
        else:
            self._free(r, blocks)
        self._leave_decodes(r, r.output_tokens, context)

    def _may_idle_after_preemption(self) -> bool:
        """Whether a step that preempted everything it could run may end empty-handed.

        A mixed node cannot wait for anything else, so that is an error there; disaggregated nodes
        wait for KV blocks that a transfer will free.
        """
        return False

    def _sample_lanes(self, end: float) -> None:
        """Lane sizes over time (``stats()`` is O(queue)): sampled, and only if the policy has lanes."""
        self._next_lane_sample = end + self.lane_interval_s
        lanes = dict(self.waiting.stats().get("lanes", {}))
        if len(lanes) <= 1:
            self._next_lane_sample = float("inf")  # one lane = the waiting count the timeline has
            return
        self.lanes.append((end, lanes))

    # --- prefix caching (sim/prefix_cache.py) -----------------------------------------------------

    def _free(self, r: SimRequest, blocks: int) -> None:
        """``r`` gives back its ``blocks`` KV blocks; its cached ones stay cached (free, LRU), and those
        that other requests still reference stay taken."""
        if self.prefix is None:
            self.free_blocks += blocks
            return
        state = r.prefix
        self.free_blocks += self.prefix.release(blocks - (len(state.keys) if state is not None else 0), state)

    def _state(self, r: SimRequest) -> PrefixState:
        """``r``'s prefix-cache state (its block keys computed once, when first needed)."""
        state = r.prefix
        if state is None:
            prefix = self.prefix
            assert prefix is not None and r.hashes is not None
            state = r.prefix = PrefixState(prefix.block_keys(r.hashes, r.prompt_tokens - r.template_tokens))
        return state

    def _hit_blocks(self, r: SimRequest) -> int:
        """Leading blocks of ``r`` the cache holds now, stopping a token short of its tokens to compute."""
        return self.prefix.lookup(self._state(r).block_keys, (r.target - 1) // self.block_size)  # type: ignore[union-attr]

    def _admission_hit(self, r: SimRequest) -> tuple[int, int]:
        """(blocks hit, free blocks those take) for a waiting request about to be admitted."""
        hit = self._hit_blocks(r)
        return hit, (self.prefix.evictable_among(r.prefix.block_keys, hit) if hit else 0)  # type: ignore[union-attr]

    def _admit_with_cache(self, r: SimRequest, hit: int, taken: int) -> None:
        """Take the hit blocks and count the admission in the hit rate (vLLM counts at admission)."""
        prefix = self.prefix
        assert prefix is not None
        hit_tokens = hit * self.block_size
        prefix.record(r.target, hit_tokens, r.preemptions > 0)
        if r.hashes is None:
            return
        state = self._state(r)
        if state.hit_tokens < 0:
            state.hit_tokens = hit_tokens
        if hit:
            prefix.take_hit(state.block_keys, hit, state)
            self.free_blocks -= taken
            r.blocks += hit
            r.num_computed += hit_tokens

    def _cache_chunk(self, r: SimRequest, new_blocks: int, chunk: int) -> None:
        """Allocate ``new_blocks`` for ``r``'s chunk and cache the blocks the chunk fills."""
        prefix = self.prefix
        assert prefix is not None
        if new_blocks:
            prefix.allocate(new_blocks)
        if r.hashes is None:
            return
        state = self._state(r)
        prefix.cache_full(state.block_keys, (r.num_computed + chunk) // self.block_size, state)

    def prefix_stats(self) -> dict[str, Any]:
        """The prefix cache's figures (empty without one) and the tokens this node prefilled."""
        if self.prefix is None:
            return {}
        return {**self.prefix.stats(), "prefill_tokens": self.prefill_work}

    def _prefix_view(self, r: SimRequest) -> QueuedRequest:
        """The policy's view, whose ``cached_tokens`` for a request not started yet is the hit a lookup
        would find now (as the vLLM integration's view does: HRRN costs it by its uncached tokens)."""
        view = queue_view(r)
        if not r.num_computed and r.hashes is not None:
            prefix = self.prefix
            assert prefix is not None
            state = self._state(r)
            if state.probe_version != prefix.version:
                state.probe_version = prefix.version
                state.probe_hit = self._hit_blocks(r) * self.block_size
            view.cached_tokens = min(state.probe_hit, r.prompt_tokens)
        return view


__all__ = ["VllmNode"]
