"""A LightLLM engine model: a timer-driven router queue plus a backend that re-ranks its ready list each step.

This is the engine behind the published figures (../shared/calibration/published-h100.md). Every rule
below is read (not copied) from LightLLM at commit 87881ae7 (github:ModelTC/LightLLM), plus the
``prefill_queue_strategy`` package of the prefill-queue change (5122d21e); the function each rule comes
from is named with it.

**Router** (``server/router/manager.py``, ``server/router/req_queue/chunked_prefill/impl.py``)

* *Timer* (``RouterManager.loop_for_fwd``): the router forms a new batch every
  ``schedule_time_interval`` (0.03 s) of wall time, whatever the backend is doing; the backend picks
  the batch up at the start of its next iteration (``ChunkedPrefillBackend.infer_loop`` →
  ``_try_read_new_reqs``). Modelled: ticks at ``k * router_tick_s``; at a step start the router
  admits the requests that reached it by the latest tick not after that time (``router_tick_s=0``:
  every step start, instantly). An idle backend waits for the next tick.
* *FCFS with break* (``ChunkedPrefillQueue.generate_new_batch``): the waiting list in arrival order is
  walked from its head while ``_can_add_new_req`` accepts, stopping at the first refusal; no
  prefill-queue strategy applies here.
* ``_can_add_new_req``, all of:
  1. *KV peak estimate*: every running/admitted request and the candidate contribute
     (a, b) from ``ChunkedPrefillReq.get_tuple_tokens``: a = prompt + output so far + 1,
     b = ⌈uncomputed prompt / chunk⌉·(``router_max_wait_tokens``+1) + output left − 1 + 16
     (``ADDED_OUTPUT_LEN``). With b sorted descending the peak is max_k(b_k·k + Σ_{i≤k} a_i); it must
     be below the KV capacity. The output estimate is ``max_new_tokens`` (the simulated request's
     output length), which is what LightLLM uses under ``ignore_eos`` or when busy; the EMA path
     for free-running generation is left out.
  2. *Request count*: running + admitted + the candidate ≤ ``running_max_req_size``.
  3. *Prefill tokens* (``ok_prefill``; ``prefill_token_gate=True``, **off by default**): the in-flight
     next-chunk needs (``Batch.get_batch_decode_need_tokens`` / ``ChunkedPrefillReq.
     get_decode_need_tokens``: min(uncomputed, chunk) for a prefill, 1 for a decode) plus each
     candidate's ``get_first_router_need_tokens`` = min(prompt, chunk) must stay ≤ 2·budget
     (``ChunkedPrefillQueue.__init__`` doubles ``batch_max_tokens``).

  Why the gate is off by default: with it, in the long-first burst two long prompts are admitted and
  each further one only when the one before is on its last chunk; because the walk stops at the first
  refusal, every short request behind a waiting long prompt stays in the router, out of reach of the
  backend's strategy. All three strategies then give the shorts ~18 s TTFT (tests pin this), which
  contradicts the published −78…−93 % rows. The published server therefore did not apply the rule as
  read at 87881ae7 (its build is not stated); the option predicts LightLLM HEAD as shipped. LightLLM
  itself later drops the rule in one mode: at 06a44f86 ``_can_add_new_req`` accepts whenever
  ``--short_prefill_token_threshold`` is set (the backend then caps prefill tokens per step itself).

**Backend** (``server/router/model_infer/mode_backend/``)

* *Ready list and strategy* (``ModeBackend._get_classed_reqs`` in ``base_backend.py`` after
  ``PrefillQueueStrategy.reorder``): admitted requests, decodes first, the unfinished prefills
  ordered by the policy (``Ranker.rank``, every iteration).
* *Selection walk* (``_get_classed_reqs``): a prefill needs ``min(remaining, chunked_prefill_size)``
  tokens (``InferReq.get_chuncked_input_token_len``); when that exceeds what is left of
  ``batch_max_tokens`` the request is skipped (``continue``) and the walk goes on; chunks are never
  shrunk. ``chunk_size`` is ``chunked_prefill_size``, ``budget`` is ``batch_max_tokens``.
* *Step type* (``ControlState.select_run_way`` in ``chunked_prefill/control_state.py``),
  ``schedule``:

  - ``prefill-first`` (``_agressive_way``, LightLLM's default): if any prefill chunk was selected the
    step runs only those chunks; otherwise it is a decode step over all decodes. Decodes wait while
    prefills can run — why the published short TPOT *rises* when the strategy serves shorts early.
  - ``alternate`` (``_normal_way``, ``--disable_aggressive_schedule``): up to
    max(1, ``router_max_wait_tokens``) decode steps, then one prefill step.
  - ``mixed`` (``--enable_prefill_decode_mixed``): as ``prefill-first``, but the decodes join the
    prefill step when prefill tokens + decodes ≤ ``batch_max_tokens``.
    Such a mixed batch advances the policy's processed-token counter (``hrrn``'s aging) by all its
    tokens, the merged decodes included (100 prefill + 1 decode: 101), as LightLLM counts it (SPEC §3.3);
    ``always-mixed`` counts its mixed steps the same way.
  - ``always-mixed``: every step runs its chunks and every decode (not a LightLLM mode; this model's
    behaviour before the step types were read from the code, kept for comparison).

Left out: the upstream shared-memory request pool (waiting + running ≤ ``running_max_req_size``,
``HttpServerManager.generate``), KV pause/recover (``wait_pause``; the published KV never fills), the
20 ms idle sleep (``RunWay.PASS``) and CPU/GPU overlap.

**Why ``default`` short requests waited ~1.6 s, not ~20 s, in the published long-first run.** With
chunk = budget = 1024 a long prompt's chunks fill whole steps, so FCFS serves the 48 long prompts one
after another. But the chat template adds a few tokens to every prompt, so the step carrying a long
prompt's *last* chunk has most of its budget left; the next long prompt's 1024-token chunk does not
fit, the walk skips it and fills the remainder with short prompts further down the list (up to 7 of
128+ tokens). Shorts are served a handful at a time, once per long-prompt completion (~0.4 s): the 48
shorts of long-first need ~7 completions (median ~1.6 s), the 144 of the interleaved run ~20 (~4 s).
Model this with ``template_tokens`` (the published reproduction uses a dozen).

The step-cost profile may carry a ``lightllm`` object whose fields replace cost coefficients for this
engine (``lightllm_cost``): the packaged H100 profile's prefill-only steps were refitted there, so the
vLLM mode's numbers are untouched.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from array import array
from collections.abc import Callable
from typing import Any

from prefillq import Ranker, load_config
from prefillq.requests import QueuedRequest
from prefillq.sim.costs import COEFFICIENTS, CostModel, Profile, ProfileError
from prefillq.sim.node import DECODE, PREFILL, EngineLimits, SimNode, SimRequest, ceil_div, kv_overflow, queue_view
from prefillq.validation import check_int, check_number

SCHEDULES = ("prefill-first", "alternate", "mixed", "always-mixed")
ADDED_OUTPUT_LEN = 16       # LightLLM's ADDED_OUTPUT_LEN: slack added to every request's remaining length
ROUTER_TICK_S = 0.03        # schedule_time_interval


def lightllm_cost(profile: Profile) -> CostModel:
    """The profile's cost model with the coefficients its ``lightllm`` object overrides (if any)."""
    overrides = profile.extra.get("lightllm") or {}
    if not isinstance(overrides, dict):
        raise ProfileError(f"profile {profile.name!r}: lightllm must be an object")
    fields = {}
    for key, value in overrides.items():
        if key in COEFFICIENTS:
            fields[key] = check_number(f"profile {profile.name!r}: lightllm.{key}", value, error=ProfileError)
        elif key not in ("source", "description"):
            raise ProfileError(f"profile {profile.name!r}: lightllm.{key} is not a cost coefficient; valid keys: "
                               f"{', '.join(COEFFICIENTS)}, source")
    return dataclasses.replace(profile.cost, **fields)  # keeps the profile's cost_form (and its knee)


class LightLLMNode(SimNode):
    """One LightLLM engine instance (router + backend).

    ``prefilling`` is the backend's ready list: admitted requests whose prefill has not completed.
    Decodes advance together on decode-carrying steps: ``decode_steps`` maps each such step's ordinal
    to its step index, and a decoding request keeps the ordinal of its first decode token in
    ``run_start_out``.
    """

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 chunk_size: int | None = None, view: Callable[[Any], QueuedRequest] = queue_view,
                 on_finish: Callable[[SimRequest], None] | None = None, schedule: str = "prefill-first",
                 router_tick_s: float = ROUTER_TICK_S, prefill_token_gate: bool = False,
                 router_max_wait_tokens: int = 1) -> None:
        super().__init__(cost, limits, record_steps=record_steps, on_finish=on_finish)
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown LightLLM schedule {schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
        self.chunk_size = min(chunk_size or limits.long_prefill_token_threshold or self.budget, self.budget)
        check_int("chunk_size", self.chunk_size, minimum=1)
        self.router_tick_s = check_number("router_tick_s", router_tick_s)
        self.wait_tokens = check_int("router_max_wait_tokens", router_max_wait_tokens)
        self.schedule = schedule
        self.prefill_token_gate = bool(prefill_token_gate)
        self.kv_capacity_tokens = limits.kv_capacity_tokens
        config = load_config(policy)
        self.policy_name = config.policy
        self.ranker = Ranker(config, clock=lambda: self.now, view=view)
        self.router_queue: list[SimRequest] = []   # FCFS admission queue
        self.router_added = array("d")             # when each queued request reached the router
        self.router_head = 0
        self.next_tick = 0.0
        self.decoding: dict[SimRequest, None] = {}  # running decodes, in start order
        self.decoding_count = 0
        self.reserved_tokens = 0                   # prompt + output of admitted requests (used_blocks)
        self.kv_bound = 0                          # sum of a + b over admitted requests (bounds the peak)
        self.decode_steps = array("q")             # step index of each decode-carrying step
        self.decode_finish: dict[int, list[SimRequest]] = {}  # decodes by the ordinal of their last token
        self.left_decode_num = max(1, self.wait_tokens)   # ControlState's counter (schedule "alternate")

    def add_request(self, request: SimRequest, now: float) -> None:
        self.now = now
        self.router_queue.append(request)
        self.router_added.append(now)

    def has_work(self) -> bool:
        return self.router_head < len(self.router_queue) or bool(self.prefilling) or self.decoding_count > 0

    def waiting_count(self) -> int:
        """Requests whose prefill has not completed (router queue + ready list): the set the policy orders."""
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

    # --- the step ------------------------------------------------------------------------------------

    def step(self, now: float) -> float | None:
        """Router tick(s), the backend's walk over the re-ranked ready list, one step; None: idle."""
        self.now = now
        self._tick(now)
        step = self.step_index
        chunks, used = self._select_chunks()
        decodes = self.decoding_count
        run_decodes = self._run_decodes(bool(chunks), decodes, used)
        if run_decodes and self.schedule in ("prefill-first", "alternate"):
            chunks, used = [], 0
        if not chunks and not run_decodes:
            if self.router_head < len(self.router_queue):
                return self._next_tick_after(now)  # the backend waits for the router's next batch
            return None
        for r, _ in chunks:
            if r.first_scheduled_s is None:
                r.first_scheduled_s = now
        decoded = decodes if run_decodes else 0
        # SPEC §3.3: LightLLM advances the counter by every token of a mixed batch, merged decodes included;
        # a decode-only step submits no prefill and advances nothing.
        self.ranker.on_prefill_submitted(used + decoded if chunks else 0)
        if run_decodes:
            self._decode_step(step)
        end = now + self._batch_latency(chunks, used, decoded, self.decode_context if decoded else 0)
        self._record_step(step, now, end, chunks, decoded, [])
        self._finish_step(step, end, chunks, decoded, used)
        for r, _ in chunks:
            if r.status != PREFILL:  # its prefill completed: it left the ready list for good (SPEC §3.0)
                self.ranker.forget(r)
        return end

    def _select_chunks(self) -> tuple[list[tuple[SimRequest, int]], int]:
        """``_get_classed_reqs``' prefill walk: the policy's order, skip a chunk that does not fit."""
        chunks: list[tuple[SimRequest, int]] = []
        used = 0
        budget = self.budget
        # Ranked every iteration, a lone request too: the policy binds its arrival state when it first sees it.
        for r in self.ranker.rank(self.prefilling):
            if used >= budget:
                break
            chunk = min(r.target - r.num_computed, self.chunk_size)
            if used + chunk > budget:
                continue  # LightLLM skips a request that does not fit and keeps walking
            chunks.append((r, chunk))
            used += chunk
        return chunks, used

    def _run_decodes(self, has_prefill: bool, decodes: int, used: int) -> bool:
        """``ControlState.select_run_way`` (and the mixed-step check): does this step run the decodes?"""
        if not decodes:
            return False
        schedule = self.schedule
        if schedule == "always-mixed" or not has_prefill:
            return True
        if schedule == "mixed":
            return used + decodes <= self.budget
        if schedule == "alternate":
            if self.left_decode_num > 0:
                self.left_decode_num -= 1
                return True
            self.left_decode_num = max(1, self.wait_tokens)
        return False

    def _decode_step(self, step: int) -> None:
        """This step carries the decodes: give it the next ordinal and schedule the decodes ending in it."""
        ordinal = len(self.decode_steps)
        self.decode_steps.append(step)
        ending = self.decode_finish.pop(ordinal, None)
        if ending is not None:
            for r in ending:
                r.finish_step = step
            self.finish_at.setdefault(step, []).extend(ending)

    # --- the router ------------------------------------------------------------------------------------

    def _next_tick_after(self, now: float) -> float:
        tick = self.router_tick_s
        if tick <= 0:
            return now
        return max(self.next_tick, (math.floor(now / tick + 1e-9) + 1) * tick)

    def _tick(self, now: float) -> None:
        """Run the router if a tick came since the last one: admit what reached it by that tick."""
        if self.router_head >= len(self.router_queue):
            return
        tick = self.router_tick_s
        if tick <= 0:
            self._admit(now)
            return
        if now + 1e-12 < self.next_tick:
            return
        latest = math.floor(now / tick + 1e-9) * tick
        self.next_tick = latest + tick
        self._admit(latest)

    def _admit(self, until: float) -> None:
        """``generate_new_batch``: admit from the head of the FCFS queue while ``_can_add_new_req`` accepts."""
        queue = self.router_queue
        added = self.router_added
        need = self._in_flight_need() if self.prefill_token_gate else 0
        limit = 2 * self.budget
        while self.router_head < len(queue) and added[self.router_head] <= until + 1e-12:
            if self.num_running + 1 > self.limits.max_num_seqs:
                break
            r = queue[self.router_head]
            if self.prefill_token_gate:
                first = min(r.prompt_tokens, self.chunk_size)
                if need + first > limit:
                    break
                need += first
            if not self._kv_admits(r):
                break
            self.router_head += 1
            self._reserve(r)
            r.status = PREFILL
            self.prefilling.append(r)
        if self.router_head > 4096 and self.router_head * 2 > len(queue):
            del queue[:self.router_head]
            del added[:self.router_head]
            self.router_head = 0

    def _in_flight_need(self) -> int:
        """``get_batch_decode_need_tokens``: next chunk of each unfinished prefill, 1 per decode."""
        chunk = self.chunk_size
        return self.decoding_count + sum(min(r.target - r.num_computed, chunk) for r in self.prefilling)

    # --- KV admission ------------------------------------------------------------------------------

    def _remaining_steps(self, r: SimRequest) -> int:
        """The chunk term of ``get_tuple_tokens``' b: ⌈uncomputed / chunk⌉·(router_max_wait_tokens + 1)."""
        return ceil_div(r.prompt_tokens - r.num_computed, self.chunk_size) * (self.wait_tokens + 1)

    def _bound(self, r: SimRequest) -> int:
        """a + b of ``r`` before its prefill starts; a + b only shrinks after that, so the sum over the
        running requests bounds the peak (max_k b_k·k + Σ_{i≤k} a_i ≤ Σ_{i≤k} (a_i + b_i))."""
        steps = ceil_div(r.prompt_tokens, self.chunk_size) * (self.wait_tokens + 1)
        return r.prompt_tokens + 1 + max(0, steps + r.output_tokens - 1) + ADDED_OUTPUT_LEN

    def outputs_before(self, r: SimRequest, step: int) -> int:
        """Output tokens a decoding ``r`` has before ``step``: its first, then one per decode-carrying step."""
        return 1 + bisect.bisect_left(self.decode_steps, step, lo=r.run_start_out) - r.run_start_out

    def _kv_tuple(self, r: SimRequest) -> tuple[int, int]:
        """``ChunkedPrefillReq.get_tuple_tokens`` (output estimate: the full output length)."""
        if r.status == DECODE:
            out = 1 + len(self.decode_steps) - r.run_start_out  # tokens sampled so far
            return r.prompt_tokens + out + 1, max(0, r.output_tokens - out - 1) + ADDED_OUTPUT_LEN
        out = r.num_output
        return (r.prompt_tokens + out + 1,
                max(0, self._remaining_steps(r) + r.output_tokens - out - 1) + ADDED_OUTPUT_LEN)

    def kv_peak(self, candidate: SimRequest | None = None) -> int:
        """The router's estimated KV peak of the running requests (and ``candidate``)."""
        pairs = [self._kv_tuple(r) for r in self.prefilling]
        pairs.extend(self._kv_tuple(r) for r in self.decoding)
        if candidate is not None:
            pairs.append(self._kv_tuple(candidate))
        pairs.sort(key=lambda pair: -pair[1])
        peak = 0
        total = 0
        for k, (a, b) in enumerate(pairs, start=1):
            total += a
            peak = max(peak, b * k + total)
        return peak

    def _kv_admits(self, r: SimRequest) -> bool:
        """The KV condition of ``_can_add_new_req`` (exact only when the cheap bound cannot decide)."""
        capacity = self.kv_capacity_tokens
        if self.kv_bound + self._bound(r) < capacity:
            return True
        if self.kv_peak(r) < capacity:
            return True
        if not self.num_running:  # it would hold the FCFS head forever
            raise kv_overflow(r, f"an estimated KV peak of {self.kv_peak(r)} tokens",
                              f"the KV cache holds {capacity} tokens", r.output_tokens)
        return False

    def _reserve(self, r: SimRequest) -> None:
        self.reserved_tokens += r.prompt_tokens + r.output_tokens
        self.kv_bound += self._bound(r)

    # --- what the shared step end asks of this node ----------------------------------------------

    def release_kv(self, r: SimRequest) -> None:
        self.reserved_tokens -= r.prompt_tokens + r.output_tokens
        self.kv_bound -= self._bound(r)

    def _start_decoding(self, r: SimRequest, step: int) -> None:
        r.status = DECODE
        r.run_start_step = step                 # the step of its first token
        r.run_start_out = len(self.decode_steps)  # the ordinal of the decode step of its second token
        self.decode_finish.setdefault(r.run_start_out + r.output_tokens - 2, []).append(r)
        self.decoding[r] = None
        self.decoding_count += 1
        self.decode_context += r.prompt_tokens + 1

    def _close_decode_run(self, r: SimRequest, step: int) -> None:
        """Its tokens came in its prefill step and in the decode steps since: record them as step ranges."""
        runs = r.token_runs
        start = prev = r.run_start_step
        for index in self.decode_steps[r.run_start_out:]:
            if index != prev + 1:
                runs.append((start, prev))
                start = index
            prev = index
        runs.append((start, prev))

    def _end_decode(self, r: SimRequest) -> None:
        del self.decoding[r]
        self.decoding_count -= 1
        self.decode_context -= r.prompt_tokens + r.output_tokens
        self.release_kv(r)


__all__ = ["SCHEDULES", "LightLLMNode", "lightllm_cost"]
