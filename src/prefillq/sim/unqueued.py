"""Runs of engine steps while nothing waits: the vLLM node's fast path (``VllmNode.run_unqueued_steps``).

Between arrivals most steps of an engine that keeps up are alike: the running decodes each take a
token, and at most one unfinished prefill takes its next chunk beside them. Nothing is admitted, so
the scheduling passes of :meth:`VllmNode.step <prefillq.sim.vllm.VllmNode.step>` (the running
loop, the waiting loop, the plan of ``"ordered"``) decide nothing; :func:`run_unqueued_steps` runs
such steps in one loop that moves only the clock, the context, the blocks and the chunk, and hands
every step with anything else (a preemption, a decode after the prefill in running order, an
arrival) back to ``step()``. Each step comes out as ``step()`` makes it, to the bit: the same latency
sums, timeline points, block accounting, and decodes finishing and prefills completing at the step's
end (``tests/test_sim_fast_decodes.py`` checks that against stepping one by one).
"""

from __future__ import annotations

from array import array
from typing import Any

from prefillq.sim.node import PREFILL


def run_unqueued_steps(node: Any, now: float, until: float) -> float:
    """Run on ``node`` (a :class:`~prefillq.sim.vllm.VllmNode`), one after another from ``now``, the
    steps that start before ``until`` while nothing waits: the running decodes and at most one
    unfinished prefill, with KV blocks enough for all of them (under ``"ordered"``, only for policies
    whose plans leave no trace: a lone partial's cap is then its own chunk); return the time the last
    step ends (``now`` when none ran).

    Each step is what ``VllmNode.step`` would do, to the bit (the same latency sums, timeline points,
    block accounting, decodes finishing and the prefill completing at the step's end), without the
    per-step scheduling passes. ``run_node`` calls this between arrivals, where most steps of an engine
    that keeps up are such steps: decode-only, or the next chunk of a long prompt beside the decodes.
    """
    decoding, prefilling = node.decoding, node.prefilling
    if prefilling:
        if (len(prefilling) > 1 or (node.ordered and not node._plain_plans)
                or (decoding and node.max_decode_seq > prefilling[0].seq)):
            return now  # (the last: maybe a decode after the prefill in running order; step() sorts that out)
    elif not decoding:
        return now
    if node.waiting or not node.fast_steps or node.record_steps or node.prefix is not None:
        return now
    step = first = node.step_index
    cost, finish_at, boundary, size = node.cost, node.finish_at, node.block_boundary, node.block_size
    step_latency, attention_work = cost.step_latency, cost.attention_work
    free, context = node.free_blocks, node.decode_context
    counts = node.timeline.counts  # the timeline's times are the step end times (one array)
    budget, threshold = node.budget, node.threshold
    lane_at = node._next_lane_sample
    stop = until if until < lane_at else lane_at
    n = len(decoding)
    terms = node.decode_terms  # the cost model's (a, b) of decode-only steps, by the number of decodes
    base, per_token = terms[n] if n in terms else terms.setdefault(n, cost.decode_step_terms(n))
    uniform = 0   # decode-only steps since the last timeline flush: each (0, n, n, n)
    empty = 0     # steps without prefill tokens
    tokens = 0    # prefill tokens of the steps with a chunk ...
    chunk_steps = 0  # ... and how many: the queue (empty throughout) and prefill_work hear of them at the end
    batch = node._step_batch  # sequences in the last step run
    ends_append, counts_extend, finish_pop = node.step_end_s.append, counts.extend, finish_at.pop
    while now < until:
        if n > budget:
            break
        if not prefilling:
            # Decode-only steps until one where a decode finishes (or the next arrival, a block
            # shortage, a lane sample): nothing moves but the clock, the context and the blocks.
            start = step
            ending = None
            while True:
                need = boundary[-step % size]
                if need > free:
                    break
                free -= need
                now = now + (base + per_token * context)
                context += n
                ends_append(now)
                ending = finish_pop(step, None)
                step += 1
                if ending is not None or now >= stop:
                    break
            if ending is None:
                uniform += step - start
                empty += step - start
                if step > start:
                    batch = n
                break  # an arrival, a lane sample or a block shortage is next: done here
            uniform += step - start - 1  # the last one finishes decodes: its point comes below
            empty += step - start
            chunk = 0
        else:
            # The partial prefill's chunks beside the decodes, until a step where a decode finishes, the
            # prefill completes or the next arrival (or lane sample) comes; each step's point as it runs.
            r = prefilling[0]
            if n and node.max_decode_seq > r.seq:
                break  # maybe a decode after it in running order (one that just joined): step() sorts that out
            computed, target, held = r.num_computed, r.target, r.blocks
            room = budget - n
            ending = None
            event = False  # the last step run ends the stretch here (a decode or the prefill finishes, ...)
            while True:
                need = boundary[-step % size] if n else 0
                if need > free:
                    break  # a decode would preempt: step() takes that one
                chunk = target - computed
                if threshold and chunk > threshold:
                    chunk = threshold
                if chunk > room:
                    chunk = room
                if chunk <= 0:
                    break
                blocks = -(-(computed + chunk) // size) - held
                if blocks > free - need:
                    break  # the prefill would preempt
                free -= blocks + need
                held += blocks
                tokens += chunk
                chunk_steps += 1
                now = now + step_latency(chunk, attention_work(chunk, computed), n, context)
                context += n
                ends_append(now)
                ending = finish_pop(step, None)
                step += 1
                computed += chunk
                if ending is not None or computed >= target or now >= stop:
                    event = True
                    break
                counts_extend((0, n + 1, n, chunk + n))
                batch = n + 1
            r.num_computed, r.blocks = computed, held
            if not event:  # step() takes the next step
                break
        # as _finish_step: decodes whose last token came in this step finish, then the chunk lands
        if uniform:
            counts_extend(array("i", (0, n, n, n)) * uniform)
            uniform = 0
        node.free_blocks, node.decode_context, node.step_index, node.now = free, context, step, now
        node._step_batch = batch = n + (1 if chunk else 0)
        if ending is not None:
            node._end_decodes(ending, step - 1, now)
        if chunk and computed >= target:
            r.num_output += 1
            if r.first_token_s is None:
                r.first_token_s = now
                r.first_batch = batch
            node._prefill_completed(r, step - 1, now)
            node.prefilling = prefilling = [p for p in prefilling if p.status == PREFILL]
        free, context = node.free_blocks, node.decode_context
        counts_extend((0, len(prefilling) + len(decoding), len(decoding), chunk + n))
        if len(decoding) != n:
            n = len(decoding)
            base, per_token = terms[n] if n in terms else terms.setdefault(n, cost.decode_step_terms(n))
        if now >= lane_at:
            break
        if not (decoding or prefilling):
            break
    if step == first:
        return now
    if uniform:
        counts_extend(array("i", (0, n, n, n)) * uniform)
    node.free_blocks, node.decode_context, node.step_index, node.now = free, context, step, now
    node._step_batch = batch
    node.prefill_work += tokens
    waiting = node.waiting
    if tokens:  # as one call per step would leave the queue (empty throughout): the counter, the steps
        waiting.on_prefill_submitted(tokens)
        empty += chunk_steps - 1
    if empty:
        waiting.on_prefill_submitted(0, steps=empty)
    if now >= lane_at:
        node._sample_lanes(now)
    return now


__all__ = ["run_unqueued_steps"]
