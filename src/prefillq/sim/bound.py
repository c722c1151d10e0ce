"""Proven lower bounds on short-request TTFT: mean, P50 and P95 (SPEC §7; the argument: docs/bounds.md).

Each figure holds for every schedule the simulated engine can run on the workload (either mode,
any policy, any use of the token budget, preemption included), because it uses only what every
step of that engine obeys: a step carries at most ``budget`` prefill tokens, starts no earlier than
the arrival of any request it carries, and lasts at least ``c0 + c1 * tokens + c2 * attention``
(the decode terms are non-negative and dropped). Two arguments:

* isolated service (every statistic): request i cannot finish its prefill sooner than alone on an
  idle engine in full-budget chunks, ``L_i = ceil(n_i / B) * c0 + c1 * n_i + c2 * n_i**2 / 2``.
  ``TTFT_i >= L_i`` for each i, so sorted TTFTs dominate sorted ``L`` element by element, and the
  linearly interpolated percentile (monotone in every element) and the mean keep the inequality.
* fluid SRPT (the mean): share each step's time among its prefill chunks, ``c0`` pro rata to tokens;
  request i then receives at least ``w_i = n_i * (c0 / B + c1) + c2 * n_i**2 / 2`` seconds of a
  unit-speed processor between its arrival and its first token. That is a processor-sharing
  schedule of the short jobs alone, and preemptive shortest-remaining-work-first minimises their
  sum of completion times over all of those; its mean flow time bounds the mean TTFT.

The mean printed is the larger of the two. Every value is lowered by one part in 10^9 and 1 ns so
that floating-point summation in the simulator cannot put a schedule a rounding error below it.
"""

from __future__ import annotations

import heapq
import math
from pathlib import Path
from typing import Any

from prefillq.metrics import percentile
from prefillq.sim.costs import CostModel, Profile, load_profile
from prefillq.workload import Workload

METHOD = ("mean: max(isolated service time, fluid SRPT on these requests alone at best-case step cost); "
          "P50/P95: isolated service time per request, order statistics")
ROUNDING_RELATIVE = 1e-9
ROUNDING_ABSOLUTE_S = 1e-9


def isolated_seconds(cost: CostModel, tokens: int, budget: int) -> float:
    """Least time from arrival to first token of a ``tokens``-token prompt: alone, full-budget chunks.

    Any chunking of a prompt into pieces x_1..x_k has attention work sum x_j (before_j + x_j / 2)
    = n**2 / 2, so only the step count (at least ceil(n / B)) depends on the chunking.
    """
    steps = -(-tokens // budget)
    return steps * cost.step_overhead_s + cost.prefill_token_s * tokens + cost.attention_token2_s * tokens * tokens / 2


def work_seconds(cost: CostModel, tokens: int, budget: int) -> float:
    """Processor time a prompt receives in any schedule: the step overhead shared pro rata to tokens."""
    per_token = cost.step_overhead_s / budget + cost.prefill_token_s
    return tokens * per_token + cost.attention_token2_s * tokens * tokens / 2


def srpt_completions(jobs: list[tuple[float, float]], speed: float = 1.0) -> list[float]:
    """Completion times of jobs ``(release_s, work_s)`` under preemptive SRPT on one processor of ``speed``."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    done = [0.0] * len(jobs)
    heap: list[tuple[float, int]] = []  # (remaining work, job)
    now = 0.0
    position = 0
    while position < len(order) or heap:
        if not heap:
            now = max(now, jobs[order[position]][0])
        while position < len(order) and jobs[order[position]][0] <= now:
            index = order[position]
            heapq.heappush(heap, (jobs[index][1], index))
            position += 1
        remaining, index = heap[0]
        finish = now + remaining / speed
        next_release = jobs[order[position]][0] if position < len(order) else math.inf
        if finish <= next_release:
            heapq.heappop(heap)
            done[index] = finish
            now = finish
        else:
            heapq.heapreplace(heap, (remaining - (next_release - now) * speed, index))
            now = next_release
    return done


def _lowered(seconds: float) -> float:
    return max(0.0, seconds * (1.0 - ROUNDING_RELATIVE) - ROUNDING_ABSOLUTE_S)


def _check_cost(cost: CostModel) -> None:
    # The whole argument drops terms as non-negative; a negative coefficient would break it.
    for name in ("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s", "decode_context_token_s"):
        value = getattr(cost, name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"cost model {name} must be a finite number >= 0 for a lower bound, got {value!r}")


def lower_bounds(workload: Workload, profile: str | Path | Profile = "h100-qwen3.5-0.8b", *,
                 budget: int | None = None, template_tokens: int = 0, klass: str = "short",
                 engines: int = 1) -> dict[str, Any]:
    """Lower bounds (ms) on the mean, P50 and P95 TTFT of ``klass`` requests, for every schedule.

    ``budget`` is the per-step prefill token budget (the profile's default when None) and
    ``template_tokens`` the tokens added to each prompt, as in ``simulate``. ``engines`` is the
    number of engines that prefill in parallel (prefill nodes of a disaggregated topology): the
    SRPT processor then runs ``engines`` times as fast; the per-request bound does not change.
    ``ttft_s`` lists the per-request bounds (seconds, sorted): any schedule's TTFT CDF lies at or
    right of theirs.
    """
    prof = load_profile(profile)
    budget = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if template_tokens < 0:
        raise ValueError(f"template_tokens must be >= 0, got {template_tokens}")
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise ValueError(f"engines must be an int >= 1, got {engines!r}")
    cost = prof.cost
    _check_cost(cost)
    jobs = [(r.arrival_s, r.prompt_tokens + template_tokens) for r in workload.requests if r.klass == klass]
    isolated = [isolated_seconds(cost, tokens, budget) for _, tokens in jobs]
    finish = srpt_completions([(arrival, work_seconds(cost, tokens, budget)) for arrival, tokens in jobs],
                              speed=float(engines))
    count = len(jobs)
    mean_isolated = sum(isolated) / count if count else None
    mean_srpt = sum(done - arrival for done, (arrival, _) in zip(finish, jobs, strict=True)) / count if count else None
    mean = None if mean_isolated is None or mean_srpt is None else max(mean_isolated, mean_srpt)

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else _lowered(seconds) * 1000.0

    return {
        f"{klass}_ttft_mean_ms": ms(mean),
        f"{klass}_ttft_p50_ms": ms(percentile(isolated, 50)),
        f"{klass}_ttft_p95_ms": ms(percentile(isolated, 95)),
        "method": METHOD,
        "count": count,
        "ttft_s": sorted(_lowered(value) for value in isolated),
    }
