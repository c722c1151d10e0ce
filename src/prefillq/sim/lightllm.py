"""A LightLLM-like engine: a router admission queue plus a backend that re-ranks its ready list each step.

This is the engine behind the published figures (../shared/calibration/published-h100.md), modelled
so they can be compared like for like. It differs from vLLM V1 (``vllm.py``) in two ways that
matter for prefill-queue policies:

* **Router admission.** Requests wait in the router's FCFS queue until the backend can hold them: the
  router admits from the head while the running-request limit (``running_max_req_size``) and the KV
  pool (every admitted request reserved at its prompt plus full output) allow, stopping at the first
  request that does not fit. Admission runs between steps.
* **Backend re-ranking with skip-on-overflow.** Every step the backend takes its ready list
  (admitted requests), puts decodes first and orders the prefill requests with the policy
  (``Ranker.rank``, LightLLM's ``_get_classed_reqs``), then walks that order giving each prefill
  request a chunk of ``min(remaining, chunk size)`` tokens; a request whose chunk does not fit what
  is left of the step's token budget is *skipped* and the walk goes on (LightLLM ``continue``s
  where vLLM's waiting loop would stop or shrink the chunk).

Why ``default`` short requests waited ~1.6 s, not ~20 s, in the published long-first run: with
chunk size = budget = 1024, a long prompt's chunks fill whole steps, so FCFS order serves the 48 long
prompts one after another. But whenever a long prompt is not a multiple of 1024 tokens (the chat
template adds a few tokens to every prompt), the step carrying its *last* chunk has most of its
budget left; the next long prompt's full 1024-token chunk does not fit that remainder, so the walk
skips it and fills the remainder with short prompts further down the FCFS list (up to 7 of 128+
tokens). Short requests are therefore served a handful at a time, once per long-prompt completion
(every ~16 steps, ~0.4 s): the 48 shorts of long-first need ~7 completions (median ~1.6 s, P95
~2.7 s), the 144 shorts of the interleaved run ~20 (median ~4 s, P95 ~8 s) — the published default
rows. A vLLM-style engine gives the leftover to the next long prompt instead (``vllm.py``), so its
short requests do wait behind the whole backlog. Model this with ``template_tokens`` (tokens the
server adds to each prompt; the published reproduction uses a dozen).
Sources read (not copied): LightLLM ``server/router/model_infer/mode_backend/base_backend.py``
(``_get_classed_reqs``: prefill token check ``continue``s), ``server/router/req_queue/chunked_prefill/
impl.py`` (router admission by estimated KV peak and request count, FCFS with ``break``) and its
prefill-queue strategy documentation. LightLLM's router additionally bounds each admitted batch's
first-chunk tokens by ``batch_max_tokens``; as read, that rule would admit long prompts one at a time
and could not produce the published default figures, so the model leaves it out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefillq import Ranker, load_config
from prefillq.requests import QueuedRequest
from prefillq.sim.costs import CostModel
from prefillq.sim.node import DECODE, PREFILL, EngineLimits, SimNode, SimRequest, ceil_div, kv_overflow, queue_view


class LightLLMNode(SimNode):
    """One LightLLM-like engine instance (router + backend), mixed prefill and decode.

    ``prefilling`` is the backend's ready list: admitted requests whose prefill has not completed.
    """

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 chunk_size: int | None = None, view: Callable[[Any], QueuedRequest] = queue_view,
                 on_finish: Callable[[SimRequest], None] | None = None) -> None:
        super().__init__(cost, limits, record_steps=record_steps, on_finish=on_finish)
        self.chunk_size = min(chunk_size or limits.long_prefill_token_threshold or self.budget, self.budget)
        self.kv_capacity_tokens = limits.kv_capacity_tokens
        config = load_config(policy)
        self.policy_name = config.policy
        self.ranker = Ranker(config, clock=lambda: self.now, view=view)
        self.router_queue: list[SimRequest] = []   # FCFS admission queue
        self.router_head = 0
        self.decoding_count = 0
        self.reserved_tokens = 0                   # KV reserved by admitted requests (prompt + output)

    def add_request(self, request: SimRequest, now: float) -> None:
        self.now = now
        self.router_queue.append(request)

    def has_work(self) -> bool:
        return self.router_head < len(self.router_queue) or bool(self.prefilling) or self.decoding_count > 0

    def waiting_count(self) -> int:
        """Requests whose prefill has not completed (router queue + ready list): the set the policy orders.

        (vLLM mode's waiting count is the same set minus the partial prefills.)
        """
        return len(self.router_queue) - self.router_head + len(self.prefilling)

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + self.decoding_count

    @property
    def num_decoding(self) -> int:
        return self.decoding_count

    @property
    def used_blocks(self) -> int:
        return ceil_div(self.reserved_tokens, self.limits.block_size)

    def step(self, now: float) -> float | None:
        """Admit from the router, walk the re-ranked ready list, run the batch; None: nothing to run."""
        self.now = now
        self._admit()
        step = self.step_index
        decoded = self.decoding_count
        chunks: list[tuple[SimRequest, int]] = []
        used = 0
        budget = self.budget
        # Ranked every step, a lone request too: the policy binds its arrival state when it first sees it.
        for r in self.ranker.rank(self.prefilling):
            if used >= budget:
                break
            chunk = min(r.target - r.num_computed, self.chunk_size)
            if used + chunk > budget:
                continue  # LightLLM skips a request that does not fit and keeps walking
            chunks.append((r, chunk))
            used += chunk
            if r.first_scheduled_s is None:
                r.first_scheduled_s = now
        self.ranker.on_prefill_submitted(used)
        if not chunks and not decoded:
            return None
        end = now + self._batch_latency(chunks, used, decoded, self.decode_context)
        self._record_step(step, now, end, chunks, decoded, [])
        self._finish_step(step, end, chunks, decoded, used)
        return end

    def _admit(self) -> None:
        """Router: admit from the head of the FCFS queue while seats and KV reservation allow."""
        queue = self.router_queue
        while self.router_head < len(queue) and self.num_running < self.limits.max_num_seqs:
            r = queue[self.router_head]
            need = self._reservation(r)
            if self.reserved_tokens + need > self.kv_capacity_tokens:
                if need > self.kv_capacity_tokens:  # it would hold the FCFS head forever
                    raise kv_overflow(r, f"{need} KV tokens", f"the KV cache holds {self.kv_capacity_tokens} tokens",
                                      need - r.prompt_tokens)
                break
            self.router_head += 1
            self.reserved_tokens += need
            r.status = PREFILL
            self.prefilling.append(r)
        if self.router_head > 4096 and self.router_head * 2 > len(queue):
            del queue[:self.router_head]
            self.router_head = 0

    def _reservation(self, r: SimRequest) -> int:
        """KV tokens the router reserves when it admits ``r``: its peak, prompt plus full output."""
        return r.prompt_tokens + r.output_tokens

    # --- what the shared step end asks of this node ----------------------------------------------

    def release_kv(self, r: SimRequest) -> None:
        self.reserved_tokens -= self._reservation(r)

    def _start_decoding(self, r: SimRequest, step: int) -> None:
        r.status = DECODE
        r.run_start_step = step
        r.run_start_out = 0
        r.finish_step = step + r.output_tokens - 1
        self.finish_at.setdefault(r.finish_step, []).append(r)
        self.decoding_count += 1
        self.decode_context += r.prompt_tokens + 1

    def _end_decode(self, r: SimRequest) -> None:
        self.decoding_count -= 1
        self.decode_context -= r.prompt_tokens + r.output_tokens
        self.release_kv(r)


__all__ = ["LightLLMNode"]
