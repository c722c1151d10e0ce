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

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.metrics import median_summary, relative_change
from prefillq.policies.base import Entry, LazyHeap, PolicyQueue
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
            return ClairvoyantQueue(key, config, clock=clock, view=view)

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
