"""Proven lower bounds on short-request TTFT: mean, P50 and P95 (SPEC §7; the argument: docs/bounds.md).

Each figure holds for every schedule the simulated engine can run on the workload (either mode,
any policy, any use of the token budget, preemption included), because it uses only what every
step of that engine obeys: a step carries at most ``budget`` prefill tokens, starts no earlier than
the arrival of any request it carries, and lasts at least ``c0 + c1 * tokens + c2 * attention``
(the decode terms are non-negative and dropped). Three arguments:

* isolated service (every statistic): request i cannot finish its prefill sooner than alone on an
  idle engine in full-budget chunks, ``L_i = ceil(n_i / B) * c0 + c1 * n_i + c2 * n_i**2 / 2``.
  ``TTFT_i >= L_i`` for each i, so sorted TTFTs dominate sorted ``L`` element by element, and the
  linearly interpolated percentile (monotone in every element) and the mean keep the inequality.
* fluid SRPT (the mean): share each step's time among its prefill chunks, ``c0`` pro rata to tokens;
  request i then receives at least ``w_i = n_i * (c0 / B + c1) + c2 * n_i**2 / 2`` seconds of a
  unit-speed processor between its arrival and its first token. That is a processor-sharing
  schedule of the short jobs alone, and preemptive shortest-remaining-work-first minimises their
  sum of completion times over all of those; its mean flow time bounds the mean TTFT.
* window capacity (percentiles): with the same shares, if k requests all have TTFT <= f then, for
  any block of them arriving between ``a_first`` and ``a_last``, their works fit in
  ``a_last - a_first + f`` seconds of the processor. Summing over a partition of the requests into
  blocks bounds how many can finish within f; the least f that lets k of them do so bounds the k-th
  smallest TTFT.

Each figure is the larger of the bounds that apply to it. Every value is lowered by one part in 10^9
and 1 ns so that floating-point summation in the simulator cannot put a schedule a rounding error
below it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefillq.sim.costs import CostModel, Profile, default_profile, load_profile
from prefillq.sim.prefix_cache import best_case_uncached
from prefillq.sim.simulator import MODES, prefix_cache_setting
from prefillq.workload import Workload

METHOD = ("mean: max(isolated service time, fluid SRPT on these requests alone at best-case step cost); "
          "P50/P95: max(isolated service time, window capacity of the fluid processor) per order statistic")
PARTITION_OFFSETS = (0, 3, 5, 7)  # tree offsets tried: block boundaries at size // d for each d > 0
BISECTION_STEPS = 60
BISECTION_RELATIVE = 1e-7
ROUNDING_RELATIVE = 1e-9
ROUNDING_ABSOLUTE_S = 1e-9
NARROW_BLOCKS = 16  # block widths up to this sum their sorted works column by column (faster, same values)


def isolated_seconds(cost: CostModel, tokens: Any, budget: int) -> Any:
    """Least time from arrival to first token of a ``tokens``-token prompt: alone, full-budget chunks.

    Any chunking of a prompt into pieces x_1..x_k has attention work sum x_j (before_j + x_j / 2)
    = n**2 / 2, so only the step count (at least ceil(n / B)) depends on the chunking. ``tokens`` may be a
    numpy integer array (every prompt's time at once, each the value an int gives).
    """
    steps = -(-tokens // budget)
    return steps * cost.step_overhead_s + cost.prefill_token_s * tokens + cost.attention_token2_s * tokens * tokens / 2


def work_seconds(cost: CostModel, tokens: Any, budget: int) -> Any:
    """Processor time a prompt receives in any schedule: the step overhead shared pro rata to tokens
    (``tokens``: an int, or a numpy integer array)."""
    per_token = cost.step_overhead_s / budget + cost.prefill_token_s
    return tokens * per_token + cost.attention_token2_s * tokens * tokens / 2


def srpt_completions(jobs: list[tuple[float, float]], speed: float = 1.0) -> list[float]:
    """Completion times of jobs ``(release_s, work_s)`` under preemptive SRPT on one processor of ``speed``."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    return _srpt([jobs[i][0] for i in order], [jobs[i][1] for i in order], order, speed)


def _srpt(releases: Sequence[float], works: Sequence[float], ids: Sequence[int], speed: float) -> list[float]:
    """:func:`srpt_completions` of jobs given by release (sorted); ``ids[k]`` is job k's place in the result
    (and what breaks a tie of remaining work, smaller first)."""
    count = len(releases)
    done = [0.0] * count
    heap: list[tuple[float, int]] = []  # (remaining work, job id)
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    now = 0.0
    position = 0
    next_release = releases[0] if count else math.inf
    while position < count or heap:
        if not heap:
            now = max(now, next_release)
        while next_release <= now:
            push(heap, (works[position], ids[position]))
            position += 1
            next_release = releases[position] if position < count else math.inf
        remaining, index = heap[0]
        finish = now + remaining / speed
        if finish <= next_release:
            pop(heap)
            done[index] = finish
            now = finish
        else:
            replace(heap, (remaining - (next_release - now) * speed, index))
            now = next_release
    return done


def most_within(arrivals: Sequence[float], works: Sequence[float], isolated: Sequence[float], flow_s: float,
                speed: float = 1.0) -> int:
    """An upper bound on how many jobs can all finish within ``flow_s`` of their arrival.

    ``arrivals`` sorted. Job j may count only if ``isolated[j] <= flow_s``; in a block of jobs
    arriving in ``[a_first, a_last]`` the counted ones share ``speed * (a_last - a_first + flow_s)``
    seconds, so at most that block's smallest works that fit count. The bound is the least total
    over the partitions into aligned dyadic blocks (``PARTITION_OFFSETS`` shift the grid).
    """
    import numpy as np

    if len(arrivals) == 0:
        return 0
    a = np.asarray(arrivals, dtype=float)
    w = np.where(np.asarray(isolated, dtype=float) <= flow_s, np.asarray(works, dtype=float), np.inf)
    best = len(a)
    for divisor in PARTITION_OFFSETS:
        best = min(best, _dyadic_count(a, w, flow_s, speed, _offset(len(a), divisor)))
    return best


def _offset(count: int, divisor: int) -> int:
    if divisor == 0:
        return 0
    return max(1, (1 << max(0, count.bit_length() - 1)) // divisor)


def _dyadic_count(a: Any, w: Any, flow_s: float, speed: float, offset: int) -> int:
    """``most_within`` over one grid of dyadic blocks, bottom-up: min(block fits, children's sum)."""
    import numpy as np

    size = 1 << (len(a) + offset - 1).bit_length()
    # Padding: never counted (infinite work); its arrival only widens a block's window (still sound).
    arrivals = np.concatenate([np.full(offset, a[0]), a, np.full(size - offset - len(a), a[-1])])
    blocks = np.concatenate([np.full(offset, np.inf), w, np.full(size - offset - len(a), np.inf)])
    counts = (blocks <= speed * flow_s).astype(np.int64)
    width = 1
    while width < size:
        width *= 2
        if width == 2:  # pairs: sorting and summing two values elementwise is the same arithmetic, faster
            room = speed * (arrivals[1::2] - arrivals[0::2] + flow_s)
            low, high = np.minimum(blocks[0::2], blocks[1::2]), np.maximum(blocks[0::2], blocks[1::2])
            fits = (low <= room).astype(np.int64) + (low + high <= room)
            counts = np.minimum(fits, counts.reshape(-1, 2).sum(axis=1))
            blocks = np.stack([low, high], axis=1)
            continue
        # Each row is two sorted halves (the children's rows): a stable sort (timsort) merges those runs in
        # linear time where the default quicksort starts over; the sorted values are the same either way.
        blocks = np.sort(blocks.reshape(-1, width), axis=1, kind="stable")
        room = speed * (arrivals[width - 1::width] - arrivals[0::width] + flow_s)
        if width <= NARROW_BLOCKS:  # many short rows: the running sum column by column (the same additions)
            running = blocks[:, 0].copy()
            fits = (running <= room).astype(np.int64)
            for column in range(1, width):
                running += blocks[:, column]
                fits += running <= room
        else:
            fits = (np.cumsum(blocks, axis=1) <= room[:, None]).sum(axis=1)
        counts = np.minimum(fits, counts.reshape(-1, 2).sum(axis=1))
    return int(counts[0])


def _dyadic_thresholds(a: Any, w: Any, iso: Any, speed: float, offset: int) -> Any:
    """The flow times at which ``_dyadic_count`` over one grid steps up, all at once: a sorted array T
    with ``_dyadic_count(a, where(iso <= f, w, inf), f, speed, offset) == count(T <= f)`` for every f.

    Needs ``iso`` to be in the order of ``w`` (sorting by work sorts the isolated times; the bound's jobs
    are: both grow with the prompt), so that the jobs that may count at any f are a block's smallest
    works and a block's count is ``count(U <= f)`` with ``U[k] = max(P[k] / speed - span, iso[k])``, P the
    prefix sums of its sorted works and span its arrival spread. A sum of counts is the count of the
    merged thresholds; the least of two counts steps up at the larger of their k-th thresholds. One
    pass bottom-up, no flow time tried: every order statistic of the grid is read off T.
    """
    import numpy as np

    size = 1 << (len(a) + offset - 1).bit_length()
    tail = size - offset - len(a)
    arrivals = np.concatenate([np.full(offset, a[0]), a, np.full(tail, a[-1])])
    works = np.concatenate([np.full(offset, np.inf), w, np.full(tail, np.inf)])
    isolated = np.concatenate([np.full(offset, np.inf), iso, np.full(tail, np.inf)])
    thresholds = np.maximum(works / speed, isolated)  # blocks of one job
    width = 1
    while width < size:
        width *= 2
        works = np.sort(works.reshape(-1, width), axis=1, kind="stable")  # two sorted runs a row: merged
        isolated = np.sort(isolated.reshape(-1, width), axis=1, kind="stable")
        merged = np.sort(thresholds.reshape(-1, width), axis=1, kind="stable")  # the children's sum
        span = arrivals[width - 1::width] - arrivals[0::width]
        own = np.maximum(np.cumsum(works, axis=1) / speed - span[:, None], isolated)  # the block as one
        thresholds = np.maximum(own, merged).reshape(-1)
        works, isolated = works.reshape(-1), isolated.reshape(-1)
    return thresholds


def _order_thresholds(arrivals: Sequence[float], works: Sequence[float], isolated: Sequence[float],
                      speed: float) -> Any:
    """Sorted T with ``most_within(arrivals, works, isolated, f, speed) == count(T <= f)`` for every f (the
    least over the grids steps up at the largest of their k-th thresholds); None when sorting by work
    does not sort the isolated times (then only ``most_within`` answers)."""
    import numpy as np

    a, w, iso = (np.asarray(values, dtype=float) for values in (arrivals, works, isolated))
    order = np.lexsort((iso, w))
    if len(a) == 0 or np.any(np.diff(iso[order]) < 0):
        return None
    result = None
    for divisor in PARTITION_OFFSETS:
        grid = _dyadic_thresholds(a, w, iso, speed, _offset(len(a), divisor))[:len(a)]  # the rest: padding
        result = grid if result is None else np.maximum(result, grid)
    return result


def order_statistic_bound(arrivals: Sequence[float], works: Sequence[float], isolated: Sequence[float],
                          rank: int, speed: float = 1.0, *,
                          at_least: Callable[[float, int], bool] | None = None) -> float:
    """A lower bound (s) on the ``rank``-th smallest flow time (1-based): a flow time f at which
    ``most_within`` says fewer than ``rank`` jobs can finish, found by bisection. ``at_least(f, rank)``
    (optional) answers ``most_within(..., f) >= rank`` for these jobs (e.g. :func:`_remembered_at_least`)."""
    if at_least is None:
        def at_least(flow_s: float, wanted: int) -> bool:
            return most_within(arrivals, works, isolated, flow_s, speed) >= wanted

    low = 0.0
    high = max(max(isolated, default=0.0), 1e-6)
    while not at_least(high, rank):
        low, high = high, high * 2
    for _ in range(BISECTION_STEPS):
        if high - low <= BISECTION_RELATIVE * high:
            break
        middle = (low + high) / 2
        if at_least(middle, rank):
            high = middle
        else:
            low = middle  # fewer than `rank` can finish within `middle`: the rank-th flow exceeds it
    return low


def _remembered_at_least(arrivals: Sequence[float], works: Sequence[float], isolated: Sequence[float],
                         speed: float) -> Callable[[float, int], bool]:
    """``most_within(..., f) >= rank`` for these jobs, on arrays made once, computing no more grids than
    the answer needs (``most_within`` is the least count over its grids, so one grid under ``rank``
    settles a no) and remembering what it computed for each f (the bisections of neighbouring ranks and
    of both percentiles ask about many of the same flow times)."""
    import numpy as np

    a, w, i = (np.asarray(values, dtype=float) for values in (arrivals, works, isolated))
    known: dict[float, tuple[int, int]] = {}  # f -> (least count so far, grids done)

    def at_least(flow_s: float, rank: int) -> bool:
        if len(a) == 0:
            return rank <= 0
        least, done = known.get(flow_s, (len(a), 0))
        if least >= rank and done < len(PARTITION_OFFSETS):
            fits = np.where(i <= flow_s, w, np.inf)
            while least >= rank and done < len(PARTITION_OFFSETS):
                least = min(least, _dyadic_count(a, fits, flow_s, speed, _offset(len(a), PARTITION_OFFSETS[done])))
                done += 1
            known[flow_s] = (least, done)
        return least >= rank

    return at_least


def percentile_bound(order_bound: Any, count: int, q: float) -> float:
    """The q-th percentile (linear interpolation, as ``prefillq.metrics.percentile``) of order statistics
    whose 1-based ``rank``-th is bounded below by ``order_bound(rank)``."""
    position = (count - 1) * q / 100.0
    below = math.floor(position)
    fraction = position - below
    value = order_bound(below + 1)
    if fraction > 0:
        value += fraction * (order_bound(below + 2) - value)
    return value


def engine_cost(profile: Profile, mode: str) -> CostModel:
    """The step cost ``mode`` runs on: the profile's, or in LightLLM mode its ``lightllm`` overrides."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if mode == "lightllm":
        from prefillq.sim.lightllm import lightllm_cost

        return lightllm_cost(profile)
    return profile.cost


def _lowered(seconds: float) -> float:
    return max(0.0, seconds * (1.0 - ROUNDING_RELATIVE) - ROUNDING_ABSOLUTE_S)


def _check_cost(cost: CostModel) -> None:
    # The whole argument drops terms as non-negative; a negative coefficient would break it.
    for name in ("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s", "decode_context_token_s"):
        value = getattr(cost, name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"cost model {name} must be a finite number >= 0 for a lower bound, got {value!r}")


def _class_jobs(workload: Workload, klass: str, template_tokens: int) -> tuple[Any, Any]:
    """(arrivals, prompt tokens the engine computes) of the ``klass`` requests, by arrival (stably), as numpy
    arrays. A trace's columns are read as they are: a million requests need no RequestSpec each."""
    import numpy as np

    requests = workload.requests
    columns = getattr(requests, "columns", None)
    if callable(columns) and klass in ("short", "long"):
        arrival, prompt, _, codes = (np.asarray(column) for column in columns())
        chosen = np.flatnonzero((codes == 2) if klass == "long" else (codes != 2))  # code 0: counted as short
        chosen = chosen[np.argsort(arrival[chosen], kind="stable")]
        return arrival[chosen].astype(float), prompt[chosen].astype(np.int64) + template_tokens
    jobs = [(r.arrival_s, r.prompt_tokens + template_tokens) for r in requests if r.klass == klass]
    jobs.sort(key=lambda job: job[0])
    return (np.array([arrival for arrival, _ in jobs], dtype=float),
            np.array([tokens for _, tokens in jobs], dtype=np.int64))


def lower_bounds(workload: Workload, profile: str | Path | Profile | None = None, *,
                 budget: int | None = None, template_tokens: int = 0, klass: str = "short",
                 engines: int = 1, mode: str = "vllm", topology: str = "mixed",
                 prefix_cache: bool | None = None) -> dict[str, Any]:
    """Lower bounds (ms) on the mean, P50 and P95 TTFT of ``klass`` requests, for every schedule.

    ``budget`` is the per-step prefill token budget (the profile's default when None) and
    ``template_tokens`` the tokens added to each prompt, as in ``simulate``. ``engines`` is the
    number of engines that prefill in parallel (prefill nodes of a disaggregated topology): the
    SRPT processor then runs ``engines`` times as fast; the per-request bound does not change.
    ``ttft_s`` lists the per-request bounds (seconds, sorted): any schedule's TTFT CDF lies at or
    right of theirs. The profile's ``frontend_s`` (time outside the steps, in every simulated TTFT)
    is added to every figure.

    ``mode``, ``topology`` and ``prefix_cache`` are ``simulate``'s: the bound is on the cost the mode
    runs on (LightLLM mode: the profile's ``lightllm`` overrides) and, when ``simulate`` would cache
    prefixes, on each prompt less the most a prefix cache could give it (``best_case_uncached``).
    """
    import numpy as np

    prof = load_profile(default_profile(mode) if profile is None else profile)  # None: simulate's default
    budget = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if template_tokens < 0:
        raise ValueError(f"template_tokens must be >= 0, got {template_tokens}")
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise ValueError(f"engines must be an int >= 1, got {engines!r}")
    cost = engine_cost(prof, mode)
    _check_cost(cost)
    frontend = prof.frontend_s  # every TTFT the simulator reports includes it
    hash_block_tokens, _ = prefix_cache_setting(workload, mode, topology, prefix_cache)
    if hash_block_tokens is not None:
        workload = best_case_uncached(workload, prof.limit("block_size"), hash_block_tokens, template_tokens)
    arrival_array, tokens = _class_jobs(workload, klass, template_tokens)
    # every job's times at once (numpy runs the same operations in the same order: the same values to the bit)
    isolated_array, works_array = isolated_seconds(cost, tokens, budget), work_seconds(cost, tokens, budget)
    arrivals, isolated, works = arrival_array.tolist(), isolated_array.tolist(), works_array.tolist()
    count = len(arrivals)
    finish = _srpt(arrivals, works, range(count), float(engines))
    ordered = np.sort(isolated_array).tolist()
    # both grow with the prompt, so the window bound's steps come out in one pass (_order_thresholds)
    thresholds = _order_thresholds(arrival_array, works_array, isolated_array, float(engines))
    at_least = None if thresholds is not None else _remembered_at_least(arrivals, works, isolated, float(engines))

    def order_bound(rank: int) -> float:
        if thresholds is not None:  # fewer than `rank` can finish within any f below its rank-th step
            return max(ordered[rank - 1], float(thresholds[rank - 1]))
        return max(ordered[rank - 1],
                   order_statistic_bound(arrivals, works, isolated, rank, float(engines), at_least=at_least))

    mean_isolated = sum(isolated) / count if count else None
    mean_srpt = sum((np.array(finish) - arrival_array).tolist()) / count if count else None
    mean = None if mean_isolated is None or mean_srpt is None else max(mean_isolated, mean_srpt)

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else _lowered(seconds + frontend) * 1000.0

    lowered = (isolated_array + frontend) * (1.0 - ROUNDING_RELATIVE) - ROUNDING_ABSOLUTE_S  # _lowered, all at once
    return {
        f"{klass}_ttft_mean_ms": ms(mean),
        f"{klass}_ttft_p50_ms": ms(percentile_bound(order_bound, count, 50) if count else None),
        f"{klass}_ttft_p95_ms": ms(percentile_bound(order_bound, count, 95) if count else None),
        "method": METHOD,
        "count": count,
        "ttft_s": np.sort(np.where(lowered > 0.0, lowered, 0.0)).tolist(),
    }
