"""An achievable reference beside the lower bound: clairvoyant schedules run on the same engine model.

SPEC §7 brackets the optimum: the lower bound (``sim/bound.py``) from below, and from above the best
of a few schedules that know what no policy may read (each request's class, its remaining prefill
work, its output length), each *run through the same simulated engine* as the policies: the same
cost model, budget, KV pool, seats, chunking, prefix cache, mode, router and replicas. Every figure is
what a real schedule of that engine reached on this workload, so the optimum of each statistic is at
most the least of them (each statistic may come from a different schedule: the optimum of each alone
is still at most that figure).

A schedule orders requests by a key, smallest first, ties in arrival order, under the engine's own
rules (decodes first, the step budget, KV and seats, preemption). In vLLM mode it is a queue
(:class:`ClairvoyantQueue`) that reads the key off the simulated request each time it compares it:
a waiting request's key is fixed while it waits, a partial prefill's falls as its chunks run, and
with ``partial_prefills="ordered"`` the key orders partial prefills and waiting requests alike
(SPEC §3.6), which makes a remaining-work key preemptive at chunk granularity. In LightLLM mode the
key is the ``priority`` of the view the ``default`` ranker orders the ready list by, every step.
Keys:

* ``short-first-srpt``: short requests before long ones, each by remaining prefill tokens;
* ``short-first-fcfs``: short requests before long ones, each in arrival order (what tail
  percentiles favour: no short request is overtaken by a later one);
* ``srpt-known-output``: remaining prefill tokens plus the output tokens still to decode, blind to
  the class (shortest remaining work, the outputs known).

Not run on the 1p1d topology (its prefill and decode nodes are built apart): no reference there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from heapq import heappush
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.metrics import median_summary, relative_change
from prefillq.policies.base import MAX_WALKS, Demand, Entry, LazyHeap, PolicyQueue
from prefillq.policies.entry import returning
from prefillq.requests import QueuedRequest
from prefillq.sim.background import Background
from prefillq.sim.node import SimRequest, queue_view

CLASS_SHIFT = 40  # a long request's key is offset by 2**40 tokens: every short one runs first
STATS = ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms")


def _remaining_prefill(r: SimRequest) -> int:
    return max(0, r.target - r.num_computed)


def _long(r: SimRequest) -> int:
    return 0 if r.klass == "short" else 1 << CLASS_SHIFT


KEYS: dict[str, Callable[[SimRequest], int]] = {
    "short-first-srpt": lambda r: _long(r) + _remaining_prefill(r),
    "short-first-fcfs": _long,
    "srpt-known-output": lambda r: _remaining_prefill(r) + max(0, r.output_tokens - r.num_output),
}


class ClairvoyantQueue(PolicyQueue):
    """The waiting queue of a clairvoyant schedule: smallest key first, then arrival (``seq``)."""

    policy = "clairvoyant"

    def __init__(self, key: Callable[[SimRequest], int], config: PolicyConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._key = key
        self._heap = LazyHeap()  # (key when queued, seq): a waiting request's key does not change

    def _rank(self, entry: Entry) -> tuple[int, int]:
        return self._key(entry.obj), entry.seq

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._heap.push((*self._rank(entry), entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._heap.discard()

    def _choose_rest(self) -> Entry | None:
        return self._heap.top()

    def _rest_order(self) -> list[Entry]:
        return sorted((e for e in self._entries.values() if e.lane == "queue"), key=self._rank)

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return self._rank(a) < self._rank(b)

    def _rest_in_order(self) -> Iterator[Entry]:
        return self._heap.ordered()


class PlainClairvoyantQueue(ClairvoyantQueue):
    """:class:`ClairvoyantQueue` for a vLLM node whose view is the plain :func:`queue_view` (no prefix cache, no
    priority classes): the same order, plans and memory, with the hot operations (add, peek, pop, the end of a
    step, a plan whose walk meets only plain requests) done without the generic bookkeeping's calls. What
    they skip does nothing for this queue: it logs no warning, dispatching leaves no trace, a step changes
    no order. Anything else (a request back from a preemption mid-stream, a plan with one) takes the
    generic path. ``tests/test_clairvoyant_plain.py`` runs both on the same workloads, preemptions included."""

    def __init__(self, key: Callable[[SimRequest], int], config: PolicyConfig, **kwargs: Any) -> None:
        super().__init__(key, config, **kwargs)
        self._logs = config.stats_interval_s > 0  # the periodic statistics line (off for compare's references)

    def add_request(self, request: Any) -> None:
        key = request.request_id
        if key in self._entries or self._pending_warning is not None:
            super().add_request(request)  # (raises: already queued)
            return
        self._memory.pop(key, None)
        now = self._clock()
        seq = self._next_seq
        self._next_seq = seq + 1
        view = self._view(request)
        entry = Entry(request, key, view, seq, seq, now, self.processed_tokens, None)
        if view.is_decode or view.priority < 0 or returning(view):
            self._insert(entry)
        else:  # _insert -> _insert_rest
            self._entries[key] = entry
            entry.lane = "queue"
            heap = self._heap
            heappush(heap._items, (self._key(request), seq, entry))
            heap.live += 1
        self._pinned = None
        if self._logs:
            self._maybe_log_stats(now)

    def peek_request(self) -> Any:
        pinned = self._pinned
        if pinned is None or self._pending_warning is not None:
            return super().peek_request()
        return pinned.obj

    def pop_request(self) -> Any:
        entry = self._pinned
        if entry is None or self._pending_warning is not None:
            return super().pop_request()
        self._pinned = None
        key, lane = entry.key, entry.lane
        self._step_pops[key] = (lane, None)  # (ClairvoyantQueue's _on_dispatch gives None)
        dispatched = self._dispatched
        dispatched[lane] = dispatched.get(lane, 0) + 1
        self._delete(entry)
        memory = self._memory
        memory[key] = (entry.enqueued_at, entry.p_arrival, entry.cost, entry.arrival)
        if self.memory_limit is not None and len(memory) > self.memory_limit:
            memory.popitem(last=False)
        if self._logs:
            self._maybe_log_stats()
        return entry.obj

    def on_prefill_submitted(self, num_tokens: int, steps: int = 1) -> None:
        if type(num_tokens) is not int or num_tokens < 0 or steps != 1 or self._pending_warning is not None:
            super().on_prefill_submitted(num_tokens, steps)
            return
        self.processed_tokens += num_tokens
        self._steps += 1
        self._pinned = None
        if self._step_pops:
            self._step_pops.clear()
        if self._logs:
            self._maybe_log_stats()


    def plan_step(self, partials: Sequence[Any], budget: int, *, free_seats: int,
                  demand: Demand | None = None,
                  replan: Callable[[dict[str, int]], Demand | None] | None = None) -> dict[str, int]:
        """Planner.plan_step, its first walk without entries for the partials when they and every waiting
        request ranked ahead of the last of them are plain (the rest group); otherwise the generic plan."""
        views = [self._view(obj) for obj in partials]
        if (demand is None or self._pending_warning is not None or self._decodes.live or self._elevated.live
                or any(returning(v) or v.priority < 0 or v.request_id in self._entries for v in views)):
            return super().plan_step(partials, budget, free_seats=free_seats, demand=demand, replan=replan)
        memory, key_of = self._memory, self._key
        start_budget, start_seats = budget, free_seats
        ranked = []
        for obj, view in zip(partials, views, strict=True):  # Planner._partial_entry's memory, without the entry
            key = view.request_id
            known = memory.get(key)
            if known is None:  # started before this queue saw it (or forgotten): it enters now
                known = (self._clock(), self.processed_tokens, None, self._next_seq)
                self._next_seq += 1
            memory[key] = known
            memory.move_to_end(key)
            ranked.append((key_of(obj), known[3], key, obj))  # _rank: (key, arrival as its seq)
        ranked.sort(key=_rank_of)  # (ranks are unique: the arrival breaks ties)
        caps: dict[str, int] = {}
        position, count = 0, len(ranked)
        heap = self._heap  # Planner._walk over the rest group (the one waiting request: the heap's top)
        for waiting in (heap.ordered() if heap.live > 1 else (heap.top(),) if heap.live else ()):
            if position == count or free_seats <= 0 or budget <= 0:
                break
            rank = (key_of(waiting.obj), waiting.seq)
            while position < count and ranked[position][:2] < rank:
                partial = ranked[position]
                take = min(max(0, demand(partial[3], budget)), budget) if budget > 0 else 0
                caps[partial[2]] = take
                budget -= take
                position += 1
            take = min(max(0, demand(waiting.obj, budget)), budget) if budget > 0 else 0
            if take:
                budget -= take
                free_seats -= 1
        for partial in ranked[position:]:
            take = min(max(0, demand(partial[3], budget)), budget) if budget > 0 else 0
            caps[partial[2]] = take
            budget -= take
        again = replan(dict(caps)) if replan is not None else None
        if again is None:
            return caps
        # later walks (a demand that prefix-cache hits revise): the generic plan's, on the entries it builds (the
        # memory they read is what the first walk left, as in the generic plan)
        entries = sorted((self._partial_entry(obj) for obj in partials), key=self._rank)
        for walk in range(MAX_WALKS - 1):
            if walk:
                again = replan(dict(caps))
                if again is None:
                    break
            revised = self._walk(entries, start_budget, start_seats, again)
            if revised == caps:
                break
            caps = revised
        for entry in entries:
            if caps.get(entry.key):
                self._on_partial_planned(entry)
        return caps


def _rank_of(partial: tuple[int, int, str, Any]) -> tuple[int, int]:
    return partial[0], partial[1]


@dataclass(frozen=True)
class Schedule:
    """One clairvoyant schedule: a key and the partial-prefill mode it runs with."""

    key: str
    partial_prefills: str = "ordered"

    @property
    def name(self) -> str:
        return f"{self.key} ({self.partial_prefills})"

    def config(self) -> PolicyConfig:
        # no periodic statistics line: a reference schedule is no queue an operator watches (and its queue
        # reads no clock for one at every operation)
        return PolicyConfig(policy="default", partial_prefills=self.partial_prefills, stats_interval_s=0.0)

    def engine_options(self, mode: str) -> dict[str, Any]:
        """What ``simulate`` needs to run this schedule in ``mode`` (with :meth:`config` as the policy)."""
        key, config = KEYS[self.key], self.config()
        if mode == "lightllm":
            def view(r: SimRequest) -> QueuedRequest:
                seen = queue_view(r)
                seen.priority = key(r)  # the default ranker orders by priority, then arrival
                return seen

            return {"view": view}

        def queue(clock: Callable[[], float], view: Callable[[Any], QueuedRequest]) -> ClairvoyantQueue:
            kind = PlainClairvoyantQueue if view is queue_view else ClairvoyantQueue
            return kind(key, config, clock=clock, view=view)

        return {"queue": queue}


SCHEDULES = (Schedule("short-first-srpt"), Schedule("short-first-fcfs"))
"""The schedules ``compare`` runs (each one more simulation per repeat). Over the packaged scenarios
(two seeds, both modes, three engine settings) and the Azure code trace, ``short-first-srpt`` reached
the least figure in most cases and ``short-first-fcfs`` the rest (tail percentiles of multi-turn, by up
to 37% in LightLLM mode); ``srpt-known-output`` and the ``"first"`` variants were lower only by under
0.1%, or tied, so they are not run by default."""
METHOD = ("the best of clairvoyant schedules run on the same engine model (" + ", ".join(s.name for s in SCHEDULES)
          + "), each figure reached by one of them")


def _figures(simulate_with: Callable[[PolicyConfig, dict[str, Any]], Mapping[str, Any]], schedule: Schedule,
             mode: str) -> dict[str, Any]:
    summary = simulate_with(schedule.config(), schedule.engine_options(mode))
    return {key: summary.get(key) for key in STATS}


def start_schedules(simulate_with: Callable[[PolicyConfig, dict[str, Any]], Mapping[str, Any]], mode: str,
                    schedules: tuple[Schedule, ...] = SCHEDULES, *, workers: int = 0,
                    on_done: Callable[[], None] | None = None) -> Background:
    """Start the schedules' runs (in up to ``workers`` forked processes; 0: here, when their results are
    asked); ``schedule_figures(schedules, started.results())`` then gives each schedule's figures and the
    least of them. ``simulate_with(config, engine_options)`` runs the engine and returns its summary."""
    return Background([partial(_figures, simulate_with, schedule, mode) for schedule in schedules], workers, on_done)


def schedule_figures(schedules: tuple[Schedule, ...], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The schedules' figures (``runs``, in the order of ``schedules``) and, per statistic, the least of
    them and the schedule that reached it."""
    figures = {schedule.name: run for schedule, run in zip(schedules, runs, strict=True)}
    result: dict[str, Any] = {}
    best: dict[str, str | None] = {}
    for key in STATS:
        reached = [(value, name) for name, summary in figures.items() if (value := summary.get(key)) is not None]
        result[key], best[key] = min(reached) if reached else (None, None)
    return {**result, "best": best, "schedules": figures}


def achievable_summary(per_repeat: list[dict[str, Any]], rows: Mapping[str, Mapping[str, Any]],
                       bound: Mapping[str, Any]) -> dict[str, Any]:
    """The reference over repeats, as the policies' figures are: each statistic the median of the
    repeats' least figures (each reached by a real schedule in its repeat, so the median optimum is at
    most that), each schedule's medians, and how far each row is above it (``row / achievable - 1``).
    ``optimum`` brackets each statistic: at least the bound, at most the reference or the best row."""
    result: dict[str, Any] = median_summary([{key: run[key] for key in STATS} for run in per_repeat])
    names = list(per_repeat[0]["schedules"])
    schedules = {name: median_summary([run["schedules"][name] for run in per_repeat]) for name in names}
    result["best"] = {key: min(((figures[key], name) for name, figures in schedules.items()
                                if figures.get(key) is not None), default=(None, None))[1] for key in STATS}
    result["schedules"] = schedules
    result["rows_vs_achievable"] = {label: {key: relative_change(row.get(key), result[key]) for key in STATS}
                                    for label, row in rows.items()}
    optimum: dict[str, Any] = {}
    for key in STATS:
        reached = [value for value in (result[key], *(row.get(key) for row in rows.values())) if value is not None]
        optimum[key] = {"at_least": bound.get(key), "at_most": min(reached) if reached else None}
    result["optimum"] = optimum
    result["method"] = METHOD
    return result


__all__ = ["KEYS", "METHOD", "SCHEDULES", "ClairvoyantQueue", "Schedule", "achievable_summary", "schedule_figures",
           "start_schedules"]
