"""A LightLLM-like engine: a router admission queue plus a backend that re-ranks its ready list each step.

This is the engine behind the published figures (../shared/calibration/published-h100.md), modelled
so they can be compared like for like. It differs from vLLM V1 (``engine.py``) in two ways that
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
rows. A vLLM-style engine gives the leftover to the next long prompt instead (``engine.py``), so its
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
from prefillq.sim.engine import DECODE, FINISHED, PREFILL, WAITING, EngineLimits, SimRequest, StepRecord, queue_view


class LightLLMNode:
    """One LightLLM-like engine instance (router + backend), mixed prefill and decode."""

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 chunk_size: int | None = None, view: Callable[[Any], QueuedRequest] = queue_view) -> None:
        self.cost = cost
        self.limits = limits
        self.budget = limits.max_num_batched_tokens
        self.chunk_size = min(chunk_size or limits.long_prefill_token_threshold or self.budget, self.budget)
        self.kv_capacity_tokens = limits.kv_blocks * limits.block_size
        self.now = 0.0
        config = load_config(policy)
        self.policy_name = config.policy
        self.ranker = Ranker(config, clock=lambda: self.now, view=view)
        self.router_queue: list[SimRequest] = []   # FCFS admission queue
        self.router_head = 0
        self.ready: list[SimRequest] = []          # admitted requests still prefilling, admission order
        self.num_decoding = 0
        self.finish_at: dict[int, list[SimRequest]] = {}
        self.decode_context = 0
        self.reserved_tokens = 0                   # KV reserved by admitted requests (prompt + output)
        self.step_index = 0
        self.step_end_s: list[float] = []
        self.finished: list[SimRequest] = []
        self.record_steps = record_steps
        self.steps: list[StepRecord] = []
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.lanes: list[tuple[float, dict[str, int]]] = []
        self.preemption_count = 0
        self.on_finish: Callable[[SimRequest], None] | None = None

    def add_request(self, request: SimRequest, now: float) -> None:
        self.now = now
        self.router_queue.append(request)

    def has_work(self) -> bool:
        return self.router_head < len(self.router_queue) or bool(self.ready) or self.num_decoding > 0

    @property
    def num_running(self) -> int:
        return len(self.ready) + self.num_decoding

    def _admit(self) -> None:
        """Router: admit from the head of the FCFS queue while seats and KV reservation allow."""
        queue = self.router_queue
        while self.router_head < len(queue) and self.num_running < self.limits.max_num_seqs:
            r = queue[self.router_head]
            need = self._reservation(r)
            if self.reserved_tokens + need > self.kv_capacity_tokens:
                if self.reserved_tokens == 0:
                    raise ValueError(f"request {r.request_id} needs {need} KV tokens; capacity is "
                                     f"{self.kv_capacity_tokens}")
                break
            self.router_head += 1
            self.reserved_tokens += need
            r.status = PREFILL
            self.ready.append(r)
        if self.router_head > 4096 and self.router_head * 2 > len(queue):
            del queue[:self.router_head]
            self.router_head = 0

    def step(self, now: float) -> float | None:
        self.now = now
        self._admit()
        step = self.step_index
        decoded = self.num_decoding
        chunks: list[tuple[SimRequest, int]] = []
        used = 0
        budget = self.budget
        ranked = self.ranker.rank(self.ready) if len(self.ready) > 1 else self.ready
        for r in ranked:
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
        attention = sum(self.cost.attention_work(chunk, r.num_computed) for r, chunk in chunks)
        end = now + self.cost.step_latency(used, attention, decoded, self.decode_context)
        if self.record_steps:
            self.steps.append(StepRecord(step, now, end, [(r.request_id, c) for r, c in chunks], decoded,
                                         self.num_running, _ceil_blocks(self.reserved_tokens, self.limits), []))
        self._finish_step(step, end, chunks, decoded, used)
        return end

    def _finish_step(self, step: int, end: float, chunks: list[tuple[SimRequest, int]], decoded: int,
                     prefill_tokens: int) -> None:
        self.step_end_s.append(end)
        self.step_index = step + 1
        self.now = end
        self.decode_context += decoded
        for r in self.finish_at.pop(step, ()):
            r.token_runs.append((r.run_start_step, step))
            self.num_decoding -= 1
            self.decode_context -= r.prompt_tokens + r.output_tokens
            self._finish(r, end)
        completed = False
        for r, chunk in chunks:
            r.num_computed += chunk
            if r.num_computed < r.target:
                continue
            completed = True
            r.num_output = 1
            r.first_token_s = end
            self._prefill_completed(r, step, end)
        if completed:
            self.ready = [r for r in self.ready if r.status == PREFILL]
        # "waiting" = requests whose prefill has not completed (router queue + ready prefills), the set
        # the policy orders; vLLM mode's waiting queue is the same set minus the partial prefills.
        self.timeline.append((end, len(self.router_queue) - self.router_head + len(self.ready), self.num_running,
                              self.num_decoding, prefill_tokens + decoded))

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        """A prompt finished in ``step`` and sampled its first token: done, or it decodes from step + 1.

        (A disaggregated prefill node overrides this: it hands the request's KV to a decode node.)
        """
        if r.output_tokens <= 1:
            r.token_runs.append((step, step))
            self._finish(r, end)
            return
        r.status = DECODE
        r.run_start_step = step
        r.run_start_out = 0
        r.finish_step = step + r.output_tokens - 1
        self.finish_at.setdefault(r.finish_step, []).append(r)
        self.num_decoding += 1
        self.decode_context += r.prompt_tokens + 1

    def _reservation(self, r: SimRequest) -> int:
        """KV tokens the router reserves when it admits ``r``: its peak, prompt plus full output."""
        return r.prompt_tokens + r.output_tokens

    def _finish(self, r: SimRequest, end: float) -> None:
        r.status = FINISHED
        r.finish_s = end
        r.num_output = r.output_tokens
        self.reserved_tokens -= self._reservation(r)
        self.finished.append(r)
        if self.on_finish is not None:
            self.on_finish(r)


def _ceil_blocks(tokens: int, limits: EngineLimits) -> int:
    return -(-tokens // limits.block_size)


__all__ = ["WAITING", "LightLLMNode"]
