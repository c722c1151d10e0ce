"""vLLM's ``--scheduling-policy priority`` in the simulated engine (``VllmNode(scheduling_policy="priority")``).

Two things change, as in ``vllm.v1.core.sched.Scheduler.schedule`` (0.34):

* the waiting queue serves strict tiers of the request priority (lower first), the configured policy inside
  each tier (``policies/tiers.py``; ``default`` is vLLM's own priority heap, by arrival time);
* when a running request cannot get its KV blocks, the victim is the running request with the *worst*
  ``(priority, arrival time)`` (the first such in running order), wherever it sits in the running order, not
  the newest one. A victim already scheduled in this step gives its tokens back to the step's budget. A
  request that preempted itself is skipped and the scan goes on with the next one (vLLM 0.34).

The running loop here is the node's per-request one, with that victim rule; it runs every step of a node in
priority mode (the lockstep fast path assumes victims come from the tail).
"""

from __future__ import annotations

from typing import Any

from prefillq.sim.node import PREFILL, ceil_div


def victim_key(r: Any) -> tuple[int, float]:
    """vLLM's preemption key in priority mode: the running request with the largest one goes first."""
    return (r.priority, r.arrival_s)


def schedule_running_by_priority(node: Any, step: int, budget: int, chunks: list,
                                 preempted: list) -> tuple[int, int, int]:
    """The running requests of one step under priority scheduling; (decodes scheduled, budget left, context
    of skipped decodes), as the node's own running loop returns."""
    running = sorted([*node.decoding.values(), *node.prefilling], key=lambda r: r.seq)
    block_size = node.block_size
    decoded = skipped_context = 0
    took_block: dict[str, bool] = {}  # decodes scheduled in this step -> whether they took a new block
    index = 0
    while index < len(running):
        r = running[index]
        if r.status == PREFILL:
            chunk = r.target - r.num_computed
            if node.threshold and chunk > node.threshold:
                chunk = node.threshold
            chunk = min(chunk, budget)
            if node.caps is not None and not preempted:
                chunk = min(chunk, node.caps.get(r.request_id, chunk))
            if chunk <= 0:
                index += 1
                continue
            need = ceil_div(r.num_computed + chunk, block_size) - r.blocks
        else:
            if budget < 1:
                skipped_context += r.prompt_tokens + r.out_before(step)
                node._skip_decode(r, step)
                index += 1
                continue
            need = 1 if (r.prompt_tokens + r.out_before(step) - 1) % block_size == 0 else 0
        preempted_self = False
        while need > node.free_blocks:
            victim = max(running, key=victim_key)
            at = running.index(victim)
            del running[at]
            if at < index:
                index -= 1
            extra = 0
            if victim.request_id in took_block:  # scheduled in this step: its token goes back
                extra = int(took_block.pop(victim.request_id))
                decoded -= 1
                budget += 1
            else:
                for position, (chunked, tokens) in enumerate(chunks):
                    if chunked is victim:
                        del chunks[position]
                        budget += tokens
                        break
            node._preempt(victim, step, extra_blocks=extra)
            preempted.append(victim)
            if victim is r:
                preempted_self = True
                break
        if preempted_self:
            continue  # vLLM 0.34: the requests after it may still fit; ``index`` already points at the next
        node.free_blocks -= need
        if r.status == PREFILL:
            r.blocks += need
            if node.prefix is not None:
                node._cache_chunk(r, need, chunk)
            chunks.append((r, chunk))
            budget -= chunk
        else:
            if need and node.prefix is not None:
                node.prefix.allocate(1)
            took_block[r.request_id] = bool(need)
            budget -= 1
            decoded += 1
        index += 1
    return decoded, budget, skipped_context
