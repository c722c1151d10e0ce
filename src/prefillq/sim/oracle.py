"""A lower bound on short-request TTFT: what a clairvoyant scheduler could at best achieve.

The bound serves the short requests alone (long requests and all decoding are assumed away) with a
clairvoyant, preemptive shortest-remaining-prefill-first schedule, as a fluid at the engine's best
prefill rate: full-budget steps whose cost counts only the step overhead and the per-token term
(``budget / (c0 + c1 * budget)`` tokens/s; attention and decode terms are non-negative and left out).
No request can be faster than prefilling its own prompt alone, so each TTFT is also at least the
latency of its own chunks on an idle engine. Every real schedule under the same cost model and
budget does at least this much work for the short requests, so its short-TTFT figures sit at or
above the oracle's.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

from prefillq.metrics import percentile
from prefillq.sim.costs import Profile, load_profile
from prefillq.workload import Workload


def _fluid_srpt(jobs: list[tuple[float, int]], rate: float) -> list[float]:
    """Completion times of jobs (arrival_s, tokens) on a preemptive SRPT fluid server."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    done = [0.0] * len(jobs)
    heap: list[tuple[float, int]] = []  # (remaining tokens, job index)
    now = 0.0
    position = 0
    while position < len(order) or heap:
        if not heap:
            index = order[position]
            now = max(now, jobs[index][0])
        while position < len(order) and jobs[order[position]][0] <= now:
            index = order[position]
            heapq.heappush(heap, (float(jobs[index][1]), index))
            position += 1
        remaining, index = heap[0]
        finish = now + remaining / rate
        next_arrival = jobs[order[position]][0] if position < len(order) else float("inf")
        if finish <= next_arrival:
            heapq.heappop(heap)
            done[index] = finish
            now = finish
        else:
            heapq.heapreplace(heap, (remaining - (next_arrival - now) * rate, index))
            now = next_arrival
    return done


def oracle(workload: Workload, *, profile: str | Path | Profile = "h100-qwen3.5-0.8b", budget: int | None = None,
           template_tokens: int = 0, klass: str = "short") -> dict[str, Any]:
    """Lower bound on the TTFT of ``klass`` requests (ms), same cost model and budget as ``simulate``."""
    prof = load_profile(profile)
    budget = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    cost = prof.cost
    rate = budget / cost.step_latency(budget, 0.0, 0, 0)
    jobs = [(r.arrival_s, r.prompt_tokens + template_tokens) for r in workload.requests if r.klass == klass]
    done = _fluid_srpt(jobs, rate)
    own: dict[int, float] = {}
    ttfts = []
    for (arrival, tokens), finish in zip(jobs, done, strict=True):
        if tokens not in own:
            own[tokens] = cost.prefill_latency(tokens, budget)
        ttfts.append(max(finish - arrival, own[tokens]))
    ms = [t * 1000.0 for t in ttfts]
    return {
        f"{klass}_ttft_p50_ms": percentile(ms, 50),
        f"{klass}_ttft_p95_ms": percentile(ms, 95),
        f"{klass}_ttft_mean_ms": sum(ms) / len(ms) if ms else None,
        "count": len(ms),
        "prefill_rate_tokens_per_s": rate,
        "ttft_s": ttfts,
    }
