"""``partial_prefills="ordered"`` inside vLLM's scheduler (SPEC §3.6, §4.1), step by step.

Each step has three moments, all inside vLLM's own ``schedule()``:

1. **plan** (before it): the queue's ``plan_step`` walks the policy's order over the running partial
   prefills and the waiting requests, asking :meth:`PartialPlan.demand` what vLLM would schedule for
   each; a partial ranked behind waiting requests is capped at what they leave.
2. **cap** (vLLM's running loop, in ``_reserve_prefill_lookahead``): the cap is applied to the chunk vLLM
   sizes for the partial; what it would have scheduled is remembered.
3. **give back** (after vLLM's waiting loop, in ``_make_cached_request_data``): budget the caps held for
   waiting requests that vLLM then did not admit (a LoRA slot, a grammar, KV pressure the prediction did
   not see) goes back to the capped partials in the same step, up to what vLLM would have scheduled for
   them, through vLLM's own ``allocate_slots``. So no step schedules fewer prefill tokens for a running
   request than stock vLLM would while budget is left idle, unless the tokens held back went to waiting
   requests in that step (SPEC §4.1).

Two cases cannot be given back in the same step, and each costs at most that step: a step in which
vLLM scheduled nothing at all (its step counters are already settled when the give-back could run; the
next step then runs vLLM's own rule), and a give-back whose KV blocks are not free (vLLM would preempt a
running request for them; the plan never does). A waiting request the plan counted on that vLLM did not
admit is left out of later plans until the set of running requests changes, so a misprediction is not
repeated step after step.

This module does not import vLLM: it works on the scheduler object it is given (the plug-in's
:mod:`prefillq.integrations.vllm` checks at start-up that every attribute used here exists).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefillq.integrations.metrics import PartialPrefillCounters
from prefillq.policies import PolicyQueue

# Scheduler attributes the plan reads (checked by the plug-in at start-up, per release).
PLAN_ATTRIBUTES = ("running", "requests", "block_size", "max_num_scheduled_tokens", "max_num_active_reqs",
                   "num_waiting_for_streaming_input", "scheduler_config", "kv_cache_manager", "lora_config",
                   "num_lookahead_tokens", "current_step", "adaptive_long_prefill_threshold",
                   "scheduler_reserve_full_isl")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PartialPlan:
    """The plan, caps and give-back of one scheduler (see the module docstring)."""

    def __init__(self, scheduler: Any, queue: PolicyQueue, *, cache_hit: Callable[[Any], tuple[int, int]],
                 running_status: Any, reserve: Callable[[Any, int, int], int],
                 counters: PartialPrefillCounters, hash_block_size: int) -> None:
        self.scheduler = scheduler
        self.hash_block_size = hash_block_size  # tokens per entry of request.block_hashes
        self.queue = queue
        self.cache_hit = cache_hit          # (hit tokens, hit blocks nobody holds: they count as free blocks)
        self.running_status = running_status
        self.reserve = reserve              # vLLM's own _reserve_prefill_lookahead (the chunk-end rule)
        self.counters = counters
        self.caps: dict[str, int] | None = None
        self.held: dict[str, tuple[Any, int]] = {}  # capped partial -> (request, what vLLM would schedule)
        self.counted: dict[str, Any] = {}           # waiting requests the plan expected vLLM to admit
        self.excluded: set[str] = set()             # ... that it then did not, while the running set is unchanged
        self.excluded_while: tuple[str, ...] = ()
        self.stalled = False                        # the last planned step scheduled nothing: plan none now

    # --- 1. plan -----------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Plan this step's caps (none after an empty planned step: vLLM's own rule runs then)."""
        self.held = {}
        self.counted = {}
        stalled, self.stalled = self.stalled, False
        self.caps = None if stalled else self._plan()

    def _plan(self) -> dict[str, int] | None:
        s = self.scheduler
        partials = [r for r in s.running if r.num_computed_tokens < r.num_prompt_tokens]
        if not partials:
            return None
        running_ids = tuple(r.request_id for r in s.running)
        if running_ids != self.excluded_while:
            self.excluded, self.excluded_while = set(), running_ids
        ids = {r.request_id for r in partials}
        threshold = self._chunk_ceiling()
        budget = s.max_num_scheduled_tokens
        decode_blocks = 0
        loras: set[int] = set()
        for request in s.running:  # decodes (and other running work) are scheduled as before
            lora = request.lora_request
            if lora is not None and lora.lora_int_id > 0:
                loras.add(lora.lora_int_id)
            if request.request_id in ids or self._skips_running(request):
                continue
            need = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            need = min(max(0, need), threshold or need, max(0, budget))
            budget -= need
            if need:  # the blocks its tokens take before any waiting request is admitted
                decode_blocks += max(0, _ceil_div(request.num_computed_tokens + need, s.block_size)
                                     - _ceil_div(request.num_computed_tokens, s.block_size))
        free_seats = s.max_num_active_reqs - len(s.running) - s.num_waiting_for_streaming_input
        last: list[dict[str, int]] = [{}]

        def replan(caps: dict[str, int]) -> Callable[[Any, int], int] | None:
            if caps == last[0] or not any(r.block_hashes for r in partials):
                return None
            last[0] = caps
            return self.demand(ids, threshold, decode_blocks, set(loras), self._filled_blocks(partials, caps))

        caps = self.queue.plan_step(partials, max(0, budget), free_seats=free_seats,
                                    demand=self.demand(ids, threshold, decode_blocks, set(loras), set()),
                                    replan=replan)
        return caps or None

    def _skips_running(self, request: Any) -> bool:
        """Whether vLLM's running loop passes ``request`` over this step (async scheduling: its last decode
        is already in flight; pipeline cadence)."""
        placeholders = request.num_output_placeholders
        if placeholders > 0 and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
            return True
        return self.scheduler.current_step + 1 < request.next_decode_eligible_step

    def _filled_blocks(self, partials: list[Any], caps: dict[str, int]) -> set[Any]:
        """Hashes of the blocks the partials' capped chunks fill this step: vLLM caches them when it
        allocates, before the waiting loop, so a waiting request sharing them hits them in the same step."""
        size = self.scheduler.block_size
        filled: set[Any] = set()
        for request in partials:
            first = request.num_computed_tokens // size
            last = min((request.num_computed_tokens + caps.get(request.request_id, 0)) // size,
                       self._hashed_blocks(request))
            filled.update(self._block_hash(request, block) for block in range(first, last))
        return filled

    def _hashed_blocks(self, request: Any) -> int:
        """How many whole KV blocks of ``request`` have a hash (none without prefix caching)."""
        return len(request.block_hashes) * self.hash_block_size // self.scheduler.block_size

    def _block_hash(self, request: Any, block: int) -> Any:
        """The hash that stands for KV block ``block`` of ``request``: its last hash entry (0.33+ hash in
        blocks of ``hash_block_size``, which divides the KV block size)."""
        return request.block_hashes[((block + 1) * self.scheduler.block_size) // self.hash_block_size - 1]

    def _chunk_ceiling(self) -> int:
        """vLLM's effective ``long_prefill_token_threshold`` for this step (0: none), as schedule() sets it."""
        s = self.scheduler
        config = s.scheduler_config
        threshold = config.long_prefill_token_threshold
        running, waiting = s.get_request_counts()
        if running + waiting <= 1:
            return 0
        if threshold > 0 and s.adaptive_long_prefill_threshold:
            threshold = max(threshold, config.max_num_batched_tokens // (running + waiting))
        return threshold

    def demand(self, partial_ids: set[str], threshold: int, decode_blocks: int, loras: set[int],
               filled: set[Any]) -> Callable[[Any, int], int]:
        """What vLLM will schedule for a request given the budget left: the chunk, within the free KV
        blocks less those the running decodes take first (a partial prefill is capped to what fits, so the
        plan never causes a preemption). A waiting request starts after its prefix-cache hit, extended by
        the ``filled`` blocks that chunks scheduled before it cache in the same step; the hit blocks nobody
        holds come out of the free pool when vLLM takes them, so they count as blocks it needs. It is
        admitted only if its chunk fits, and its whole prompt too with ``scheduler_reserve_full_isl``,
        above the watermark (else vLLM's waiting loop stops there), and if a LoRA slot is left for its
        adapter (else vLLM skips it and goes on)."""
        s = self.scheduler
        block_size = s.block_size
        free = s.kv_cache_manager.block_pool.get_num_free_blocks() - decode_blocks
        full_isl = bool(s.scheduler_reserve_full_isl)
        watermark = int(s.kv_cache_manager.watermark_blocks)
        max_loras = s.lora_config.max_loras if s.lora_config else 0
        filled = set(filled)
        stopped = False

        def chunk_of(request: Any, start: int, left: int, partial: bool) -> int:
            chunk = min(request.num_tokens - start, left)
            if threshold:
                chunk = min(chunk, threshold)
            return max(chunk, 0 if partial else 1)

        def demand(request: Any, left: int) -> int:
            nonlocal free, stopped
            if request.request_id in partial_ids:
                start = request.num_computed_tokens
                held = _ceil_div(start, block_size)
                chunk = min(chunk_of(request, start, left, True), (held + free) * block_size - start)
                if chunk <= 0:
                    return 0
                free -= max(0, _ceil_div(start + chunk, block_size) - held)
                return chunk
            if stopped or request.request_id in self.excluded:
                return 0
            lora = request.lora_request
            lora_id = lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else 0
            if lora_id and lora_id not in loras and len(loras) >= max_loras:
                return 0  # vLLM skips it this step (no LoRA slot) and looks at the next request
            start, unowned = self.cache_hit(request)
            if filled and start % block_size == 0:
                most = min(self._hashed_blocks(request), (request.num_tokens - 1) // block_size)
                while start // block_size < most and self._block_hash(request, start // block_size) in filled:
                    start += block_size
            chunk = chunk_of(request, start, left, False)
            held = start // block_size
            need = _ceil_div(start + chunk, block_size) - held + unowned
            whole = _ceil_div(request.num_tokens, block_size) - held + unowned if full_isl else need
            if max(need, whole) + watermark > free:
                stopped = True  # vLLM's waiting loop stops at a request whose blocks do not fit
                return 0
            last = min((start + chunk) // block_size, self._hashed_blocks(request))
            filled.update(self._block_hash(request, block) for block in range(held, last))
            free -= max(0, need)
            if lora_id:
                loras.add(lora_id)
            self.counted[request.request_id] = request
            return chunk

        return demand

    # --- 2. cap ------------------------------------------------------------------------------------

    def cap(self, request: Any, num_new_tokens: int) -> int:
        """The chunk of a running request after this step's cap (``num_new_tokens``: vLLM's own chunk)."""
        caps = self.caps
        if caps is None or request.status != self.running_status:
            return num_new_tokens
        cap = caps.get(request.request_id)
        if cap is None or cap >= num_new_tokens:
            return num_new_tokens
        self.held[request.request_id] = (request, num_new_tokens)
        lora = request.lora_request
        if cap == 0 and lora is not None and lora.lora_int_id > 0:
            # A running request vLLM skips does not count among the step's LoRA adapters, and vLLM would
            # then admit a waiting request of another adapter: more adapters running than max_loras. One
            # token keeps its adapter counted.
            return 1
        return cap  # 0: vLLM skips this running request for the step (it keeps its blocks)

    def on_preemption(self) -> None:
        # After a preemption vLLM admits no waiting request this step: the partials still to be scheduled
        # run uncapped, and the ones already capped get their budget back at the give-back.
        self.caps = None

    # --- 3. give back ------------------------------------------------------------------------------

    def give_back(self, scheduled_running: list[Any], num_scheduled_tokens: dict[str, int],
                  req_to_new_blocks: dict[str, Any]) -> None:
        """Hand budget the caps held but nobody used back to the capped partials, in running order."""
        if not self.held:
            return
        s = self.scheduler
        used = sum(num_scheduled_tokens.values())
        left = s.max_num_scheduled_tokens - used
        if left <= 0 or used == 0:
            return  # used == 0: an empty step (see the module docstring); the next one runs vLLM's rule
        for request_id, (request, wanted) in self.held.items():
            if left <= 0:
                break
            if request.status != self.running_status:
                continue  # preempted later in the same step
            given = num_scheduled_tokens.get(request_id, 0)
            target = self.reserve(request, request.num_computed_tokens, given + min(wanted - given, left))
            if target <= given:
                continue
            blocks = s.kv_cache_manager.allocate_slots(request, target, num_lookahead_tokens=s.num_lookahead_tokens)
            if blocks is None:
                continue  # not enough free blocks without preempting anyone
            if request_id in num_scheduled_tokens:
                req_to_new_blocks[request_id] = req_to_new_blocks[request_id] + blocks
            else:
                scheduled_running.append(request)
                req_to_new_blocks[request_id] = blocks
            num_scheduled_tokens[request_id] = target
            left -= target - given

    def end_step(self, output: Any, waiting: PolicyQueue) -> None:
        """After ``schedule()``: fix the output's total, count what stayed held, learn from mispredictions."""
        planned = self.caps is not None or bool(self.held)
        total = sum(output.num_scheduled_tokens.values())
        output.total_num_scheduled_tokens = total
        held_back = 0
        for request_id, (_, wanted) in self.held.items():
            short = wanted - output.num_scheduled_tokens.get(request_id, 0)
            if short > 0:
                held_back += short
                self.counters.record(1, short)  # for the metrics endpoint
        if held_back and self.counted:
            self.excluded.update(rid for rid, request in self.counted.items() if request in waiting)
        self.stalled = planned and total == 0
        self.caps = None
        self.held = {}
