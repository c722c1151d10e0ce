"""The plain vLLM node's fast paths: the same steps as the generic passes of ``vllm.py``, with less Python.

:class:`PlainPaths` is a mixin of :class:`~prefillq.sim.vllm.VllmNode` (before :class:`~prefillq.sim.node.SimNode`
in its bases). Each method takes its short way only on a node where nothing it skips can matter (no prefix
cache, no priority scheduling, no recorded steps, no subclass that changes a step it inlines: the flags
``_lone_admissions`` and ``_inline_ends`` that ``VllmNode.__init__`` sets), and otherwise does what the
generic code does. ``tests/test_sim_fast_decodes.py`` (``fast_steps=False`` runs everything the generic way)
and ``tests/test_sim_speed_identity.py`` hold the results to the bit.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from prefillq.sim.node import DECODE, FINISHED, PREFILL, WAITING, SimNode, SimRequest, check_fits_kv

Chunks = list[tuple[SimRequest, int]]


_seq = attrgetter("seq")  # a request's place in the running order


class PlainPaths(SimNode):
    """VllmNode's fast paths (see the module docstring); the attributes they read are VllmNode's."""

    decoding: dict[str, SimRequest]
    block_boundary: list[int]
    block_size: int
    threshold: int
    max_decode_seq: int
    next_seq: int
    prefill_work: int
    waiting: Any
    prefix: Any
    caps: dict[str, int] | None
    stalled: bool
    _inline_ends: bool

    def _finish(self, r: SimRequest, end: float) -> None:
        """``r`` is done: as the vLLM plug-in, tell the queue, which then forgets what a prepend of it would
        restore (it never comes back). Without it the queue keeps its 65,536 latest pops: megabytes of a
        big trace's run, and a request running through as many admissions would lose its place."""
        super()._finish(r, end)
        self.waiting.forget_request(r)

    def _admit_alone(self, now: float, step: int) -> float | None:
        """step() where only decodes run, each gets its token and its block, and the one waiting request is
        admitted beside them (budget, a seat and its blocks left): the same step, scheduled without the
        generic passes; None (nothing changed) where that is not so."""
        decoding, size = self.decoding, self.block_size
        n = len(decoding)
        budget = self.budget - n
        free = self.free_blocks - (self.block_boundary[-step % size] if n else 0)
        if budget <= 0 or n >= self.limits.max_num_seqs or free < 0:
            return None
        waiting = self.waiting
        r: SimRequest = waiting.peek_request()
        computed = r.num_computed
        if -(-r.target // size) > self.limits.kv_blocks:
            check_fits_kv(r, self.limits)  # raises: it could never run
        chunk = r.target - computed
        if self.threshold and chunk > self.threshold:
            chunk = self.threshold
        if chunk > budget:
            chunk = budget
        need = -(-(computed + chunk) // size) - r.blocks
        if need > free:
            return None  # it waits: the generic step runs the decodes
        self.caps = None
        self.stalled = False
        popped = waiting.pop_request()
        assert popped is r, "the policy queue must pop the request it peeked"
        self.free_blocks = free - need  # (the decodes' blocks first, then the prefill's: none preempts)
        r.blocks += need
        r.status = PREFILL
        r.seq = self.next_seq
        self.next_seq += 1
        if r.first_scheduled_s is None:
            r.first_scheduled_s = now
        self.prefilling.append(r)
        self.prefill_work += chunk
        waiting.on_prefill_submitted(chunk)
        cost = self.cost
        attention = 0  # as _batch_latency sums it
        attention += cost.attention_work(chunk, computed)
        end = now + cost.step_latency(chunk, attention, n, self.decode_context)
        self._finish_step(step, end, [(r, chunk)], n, chunk)
        return end

    def _running_after_head(self, step: int, budget: int) -> tuple[list[SimRequest], int, int]:
        """(the running requests the per-request loop walks, in running order; the budget left; the decodes
        scheduled). The decodes ahead of the first unfinished prefill in running order are scheduled at once
        when each gets its token and its block without a preemption (as the loop would: one token and, at a
        block boundary, one block each); the loop walks the rest. Otherwise it walks them all."""
        prefilling, decoding = self.prefilling, self.decoding
        if not prefilling or self.prefix is not None:
            return sorted([*decoding.values(), *prefilling], key=_seq), budget, 0
        first, size = prefilling[0].seq, self.block_size  # (prefilling is in running order)
        behind = [d for d in decoding.values() if d.seq > first]
        ahead = len(decoding) - len(behind)
        blocks = self.block_boundary[-step % size] if decoding else 0  # decodes at a block boundary ...
        for d in behind:  # ... less those behind the prefill
            if (d.prompt_tokens + d.out_before(step) - 1) % size == 0:
                blocks -= 1
        if ahead > budget or blocks > self.free_blocks:
            return sorted([*decoding.values(), *prefilling], key=_seq), budget, 0
        self.free_blocks -= blocks
        return sorted([*behind, *prefilling], key=_seq), budget - ahead, ahead

    def _finish_step(self, step: int, end: float, chunks: Chunks, decoded: int, prefill_tokens: int) -> None:
        """SimNode's, with the timeline's point counted inline (where no subclass changes what it reads)."""
        if not self._inline_ends:
            super()._finish_step(step, end, chunks, decoded, prefill_tokens)
            return
        self.step_end_s.append(end)
        self.step_index = step + 1
        self.now = end
        self.decode_context += decoded
        self._step_batch = batch = len(chunks) + decoded
        ending = self.finish_at.pop(step, None)
        if ending is not None:
            self._end_decodes(ending, step, end)
        completed = False
        for r, chunk in chunks:
            r.num_computed = computed = r.num_computed + chunk
            if computed < r.target:
                continue
            completed = True
            r.num_output += 1  # the step that completes a prefill samples a token
            if r.first_token_s is None:
                r.first_token_s = end
                r.first_batch = batch
            self._prefill_completed(r, step, end)
        prefilling = self.prefilling
        if completed:
            self.prefilling = prefilling = [r for r in prefilling if r.status == PREFILL]
        decodes = len(self.decoding)
        self.timeline.counts.extend((len(self.waiting), len(prefilling) + decodes, decodes, prefill_tokens + decoded))
        if end >= self._next_lane_sample:
            self._sample_lanes(end)

    def _point(self, tokens: int) -> tuple[int, int, int, int]:
        decodes = len(self.decoding)
        return len(self.waiting), len(self.prefilling) + decodes, decodes, tokens

    def _end_decodes(self, ending: list[SimRequest], step: int, end: float) -> None:
        """SimNode's, with _close_decode_run, _end_decode and _finish done inline (where no subclass changes them
        and no prefix cache holds blocks): every request's last step runs through here."""
        if not self._inline_ends:
            super()._end_decodes(ending, step, end)
            return
        size, boundary, decoding, waiting = self.block_size, self.block_boundary, self.decoding, self.waiting
        batch, on_finish = self._step_batch, self.on_finish
        for r in ending:
            if r.status != DECODE or r.finish_step != step:
                continue  # an entry of a run that a skip or a preemption moved
            r.token_runs.append((r.run_start_step, step))  # _close_decode_run
            prompt, output = r.prompt_tokens, r.output_tokens
            self.free_blocks += -(-(prompt + output - 1) // size)  # _end_decode, _leave_decodes
            boundary[(prompt + r.run_start_out - r.run_start_step - 1) % size] -= 1
            del decoding[r.request_id]
            self.decode_context -= prompt + output
            if not decoding:
                self.max_decode_seq = -1
            r.status = FINISHED  # _finish
            r.finish_s = end
            r.finish_batch = batch
            r.num_output = output
            self.finished_count += 1
            if self.record_steps:
                self.finished.append(r)
            if on_finish is not None:
                on_finish(r)
            waiting.forget_request(r)

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        """SimNode's, with a request that goes on decoding joined inline (_start_decoding, _join_decodes,
        _start_decode_run), where no subclass changes them."""
        if not self._inline_ends or r.num_output >= r.output_tokens:
            super()._prefill_completed(r, step, end)
            return
        r.blocks = 0
        r.status = DECODE
        self.decoding[r.request_id] = r
        out_before = r.num_output - 1
        r.run_start_step = step
        r.run_start_out = out_before
        r.finish_step = finish = step + r.output_tokens - out_before - 1
        self.block_boundary[(r.prompt_tokens + out_before - step - 1) % self.block_size] += 1
        ending = self.finish_at.get(finish)
        if ending is None:
            self.finish_at[finish] = [r]
        else:
            ending.append(r)
        self.decode_context += r.prompt_tokens + r.num_output
        if r.seq > self.max_decode_seq:
            self.max_decode_seq = r.seq


def plain_demand(node: Any, free: int) -> Any:
    """The plan's demand on a node without a prefix cache (``VllmNode._plan_demand`` with no hits to predict):
    ``free`` KV blocks left once this step's decodes have theirs."""
    threshold, size = node.threshold, node.block_size
    waiting_stopped = False

    def plain(r: SimRequest, left: int) -> int:
        nonlocal free, waiting_stopped
        computed = r.num_computed
        chunk = r.target - computed
        if threshold and chunk > threshold:
            chunk = threshold
        if chunk > left:
            chunk = left
        waiting = r.status == WAITING
        if not waiting:  # a partial prefill: no more than its blocks and the free ones hold
            room = (r.blocks + (free if free > 0 else 0)) * size - computed
            if room < chunk:
                chunk = room
            if chunk <= 0:
                return 0
        need = -(-(computed + chunk) // size) - r.blocks
        if waiting and (waiting_stopped or need > free):
            waiting_stopped = True  # vLLM's waiting loop stops at the first request without blocks
            return 0
        if need > 0:
            free -= need
        return chunk

    return plain


__all__ = ["PlainPaths", "plain_demand"]
