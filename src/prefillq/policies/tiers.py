"""Strict priority tiers (vLLM's ``--scheduling-policy priority``), the configured policy inside each tier.

A request's tier is its view's ``priority`` when it enters the queue (vLLM's meaning: lower first; any
int). Every tier is served before any request of a higher value; inside a tier the configured policy
orders the requests, exactly as it would order a queue holding that tier alone. Requests in the decode
phase (re-ranking engines) stay in front of every tier, in their relative order.

With ``default`` a tier is vLLM's own priority heap: requests by arrival, and a request that comes back
(skipped, preempted) returns to the place its arrival gives it, not to the front; ties by request id.
Arrival is the order requests were first added (kept across pop and prepend), or the engine's own
arrival time where the adapter gives ``arrival`` (vLLM's ``Request.arrival_time``).

Shape: one :class:`PolicyQueue` per tier, made lazily, all advanced by the same processed-token counter
(every tier hears every ``on_prefill_submitted``: aging counts all the engine's prefill work), and a
small heap of the tier values that hold requests. Each operation is O(log n) plus O(number of tiers)
where it must reach every tier (the end of a step, forgetting a request).

Strict tiers can starve a lower tier by design (docs/auto.md states ``auto``'s bound per tier).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cmp_to_key
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.policies.base import MAX_WALKS, MEMORY_LIMIT, Clock, Demand, Entry, PolicyQueue, View, format_stats_line
from prefillq.policies.base import logger as _logger
from prefillq.policies.entry import identity_view
from prefillq.policies.fcfs import FCFSQueue
from prefillq.requests import QueuedRequest

DECODE_TIER = -math.inf  # decode-phase requests: in front of every tier
Arrival = Callable[[Any], float]


class PriorityHeapQueue(FCFSQueue):
    """``default`` inside a tier: vLLM's priority heap within one priority value (by arrival, then id)."""

    def __init__(self, config: PolicyConfig, clock: Clock | None = None, view: View | None = None,
                 arrival: Arrival | None = None) -> None:
        super().__init__(config, clock=clock, view=view)
        self._arrival_of = arrival

    def _arrival_key(self, entry: Entry) -> tuple:
        if self._arrival_of is None:
            return (entry.arrival, "")
        return (self._arrival_of(entry.obj), entry.key)

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._heap.push((*self._arrival_key(entry), entry.seq, entry))

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        rest.sort(key=lambda e: (*self._arrival_key(e), e.seq))
        return rest

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return (*self._arrival_key(a), a.seq) < (*self._arrival_key(b), b.seq)


class TiersQueue:
    """The queue contract (as :class:`PolicyQueue`) over strict priority tiers; see the module docstring."""

    def __init__(self, config: PolicyConfig, kind: type[PolicyQueue], clock: Clock | None = None,
                 view: View | None = None, arrival: Arrival | None = None) -> None:
        self.config = config
        self._inner_config = config.with_(priority_tiers=False, stats_interval_s=0.0)
        self._kind = kind  # the configured policy's queue class, one instance per tier
        self._arrival = arrival
        self._view = view if view is not None else identity_view
        self._clock = clock
        self.policy = self._kind.policy
        self.ranks_partials = self._kind.ranks_partials
        self.ranks_by_uncached = self._kind.ranks_by_uncached
        self._tiers: dict[float, PolicyQueue] = {}
        self._heap: list[float] = []          # tier values that may hold requests (checked lazily)
        self._in_heap: set[float] = set()
        self._where: dict[str, float] = {}    # waiting request id -> its tier
        self._popped: dict[str, float] = {}   # this step's pops -> the tier they left
        self._pinned_tier: float | None = None
        self._seen: tuple[Any, QueuedRequest] | None = None  # the outer view just read, for the tier's view
        self._memory_limit: int | None = None
        self._reordering = False
        self.processed_tokens = 0
        self._steps = 0
        self._last_stats_at: float | None = None
        self.memory_limit = MEMORY_LIMIT

    # --- tiers -----------------------------------------------------------------------------------

    @property
    def memory_limit(self) -> int | None:
        return self._memory_limit

    @memory_limit.setter
    def memory_limit(self, value: int | None) -> None:
        self._memory_limit = value
        for queue in self._tiers.values():
            queue.memory_limit = value

    def _tier_view(self, obj: Any) -> QueuedRequest:
        """What a tier's queue sees: the request at priority 0 (the tier is the priority)."""
        seen = self._seen
        if seen is not None and seen[0] is obj:
            view = seen[1]
            self._seen = None
        else:
            view = self._view(obj)
        if view.priority:
            view = _at_priority_zero(view)
        return view

    def _tier_of(self, obj: Any) -> float:
        view = self._view(obj)
        self._seen = (obj, view)
        return DECODE_TIER if view.is_decode else view.priority

    def _queue(self, tier: float) -> PolicyQueue:
        queue = self._tiers.get(tier)
        if queue is None:
            if self._kind is FCFSQueue:
                queue = PriorityHeapQueue(self._inner_config, clock=self._clock, view=self._tier_view,
                                          arrival=self._arrival)
            else:
                queue = self._kind(self._inner_config, clock=self._clock, view=self._tier_view)
            queue.memory_limit = self._memory_limit
            queue.processed_tokens = self.processed_tokens
            queue._on_step()  # aging structures start at the shared counter
            self._tiers[tier] = queue
        return queue

    def _mark(self, tier: float) -> None:
        if tier not in self._in_heap and self._tiers[tier]:
            self._in_heap.add(tier)
            heapq.heappush(self._heap, tier)

    def _top(self) -> float | None:
        heap = self._heap
        while heap and not self._tiers[heap[0]]:
            self._in_heap.discard(heapq.heappop(heap))
        return heap[0] if heap else None

    def _changed(self, tier: float) -> None:
        """A mutation in ``tier``: a pin held in another tier is no longer valid (SPEC §3.4)."""
        pinned = self._pinned_tier
        if pinned is not None and pinned != tier:
            self._tiers[pinned]._pinned = None
        self._pinned_tier = None
        self._maybe_log_stats()

    @contextlib.contextmanager
    def _as_reordering(self, queue: PolicyQueue) -> Iterator[None]:
        if self._reordering:
            with queue.reordering():
                yield
        else:
            yield

    def tiers(self) -> list[float]:
        """The tier values that hold waiting requests, in service order."""
        return sorted(t for t, q in self._tiers.items() if q)

    # --- the contract -----------------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        """Enqueue a newly arrived request at the back of its tier."""
        key = request.request_id
        if key in self._where:
            raise ValueError(f"request {key!r} is already queued")
        tier = self._tier_of(request)
        self._queue(tier).add_request(request)
        self._where[key] = tier
        self._mark(tier)
        self._changed(tier)

    def pop_request(self) -> Any:
        """Remove and return the next request: the first of the lowest tier (the peeked one, if pinned)."""
        tier = self._pinned_tier if self._pinned_tier is not None else self._top()
        if tier is None:
            raise IndexError("pop from an empty prefill queue")
        request = self._tiers[tier].pop_request()
        del self._where[request.request_id]
        self._popped[request.request_id] = tier
        self._pinned_tier = None
        return request

    def peek_request(self) -> Any:
        """The next request without removing it; pinned until a change or the end of the step."""
        tier = self._pinned_tier if self._pinned_tier is not None else self._top()
        if tier is None:
            raise IndexError("peek from an empty prefill queue")
        self._pinned_tier = tier
        return self._tiers[tier].peek_request()

    def prepend_request(self, request: Any) -> None:
        """Re-insert a popped (skipped or preempted) request into its tier, as that tier's policy does."""
        key = request.request_id
        if key in self._where:
            raise ValueError(f"request {key!r} is already queued")
        tier = self._tier_of(request)
        queue = self._queue(tier)
        with self._as_reordering(queue):
            queue.prepend_request(request)
        self._popped.pop(key, None)
        self._where[key] = tier
        self._mark(tier)
        self._changed(tier)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Prepend several requests one after the other, as vLLM's deque ``extendleft`` does."""
        for request in list(requests):
            self.prepend_request(request)

    def skip_request(self, request: Any) -> None:
        """The engine popped ``request`` this step only to skip it: not a dispatch (SPEC §3.0)."""
        tier = self._popped.get(request.request_id)
        if tier is not None:
            self._tiers[tier].skip_request(request)

    def refresh_request(self, request: Any) -> None:
        """Re-read a queued request's view, keeping its place, its history and its tier."""
        tier = self._where.get(request.request_id)
        if tier is None:
            raise KeyError(f"request {request.request_id!r} is not queued")
        self._tiers[tier].refresh_request(request)
        self._changed(tier)

    def remove_request(self, request: Any) -> None:
        """Remove a request if queued (abort/finish); requests not in the queue are ignored."""
        tier = self._where.pop(request.request_id, None)
        if tier is None:
            for queue in self._tiers.values():  # drop what a prepend would restore, wherever it is
                queue.forget_request(request)
            return
        queue = self._tiers[tier]
        with self._as_reordering(queue):
            queue.remove_request(request)
        self._changed(tier)

    def remove_requests(self, requests: Iterable[Any]) -> None:
        """Remove each request that is queued; others are ignored."""
        for request in requests:
            self.remove_request(request)

    def forget_request(self, request: Any) -> None:
        """The engine is done with ``request``: drop what a prepend would restore (O(number of tiers))."""
        for queue in self._tiers.values():
            queue.forget_request(request)

    @contextlib.contextmanager
    def reordering(self) -> Iterator[None]:
        """The engine removes and prepends queued requests in an order of its own (see PolicyQueue)."""
        self._reordering = True
        try:
            yield
        finally:
            self._reordering = False

    def on_prefill_submitted(self, num_tokens: int, steps: int = 1) -> None:
        """End of a scheduling step; every tier hears it (one counter of all the engine's prefill work)."""
        if ((isinstance(num_tokens, bool) or not isinstance(num_tokens, int)) or num_tokens < 0
                or (steps != 1 and (num_tokens or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1))):
            raise ValueError(f"num_tokens must be a non-negative int (0 over several steps), got {num_tokens!r}, "
                             f"steps={steps!r}")
        self.processed_tokens += num_tokens
        self._steps += steps
        for queue in self._tiers.values():
            queue.on_prefill_submitted(num_tokens, steps)
        self._popped.clear()
        self._pinned_tier = None
        self._maybe_log_stats()

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def __contains__(self, request: Any) -> bool:
        return request.request_id in self._where

    def __iter__(self) -> Iterator[Any]:
        """The order in which the queue would dispatch now (lazily, tier by tier)."""
        pinned = self._pinned_tier
        if pinned is not None:
            yield from self._tiers[pinned]
        for tier in self.tiers():
            if tier != pinned:
                yield from self._tiers[tier]

    def __getitem__(self, index: int) -> Any:
        """The request at ``index`` in dispatch order (negative counts from the back)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"prefill queue indices must be integers, not {type(index).__name__}")
        size = len(self._where)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError("prefill queue index out of range")
        return next(itertools.islice(iter(self), position, None))

    # --- statistics ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The tiers' counters added up, plus each tier's size."""
        total: dict[str, Any] = {"policy": self.policy, "size": len(self._where), "lanes": {}, "dispatched": {},
                                 "prepends": 0, "steps": self._steps, "processed_prefill_tokens": self.processed_tokens,
                                 "longest_wait_s": {}}
        sizes: dict[str, int] = {}
        for tier, queue in sorted(self._tiers.items()):
            part = queue.stats()
            sizes["decode" if tier == DECODE_TIER else str(tier)] = part["size"]
            for field in ("lanes", "dispatched"):
                for lane, count in part[field].items():
                    total[field][lane] = total[field].get(lane, 0) + count
            for lane, wait in part["longest_wait_s"].items():
                total["longest_wait_s"][lane] = max(wait, total["longest_wait_s"].get(lane, 0.0))
            total["prepends"] += part["prepends"]
            for key, value in part.items():
                if key not in total and isinstance(value, int):
                    total[key] = total.get(key, 0) + value
        total["tiers"] = sizes
        return total

    def _maybe_log_stats(self) -> None:
        interval = self.config.stats_interval_s
        if interval <= 0 or self._clock is None:
            return
        now = self._clock()
        if self._last_stats_at is None:
            self._last_stats_at = now
        elif now - self._last_stats_at >= interval:
            self._last_stats_at = now
            _logger.info("%s", format_stats_line(self.stats()))

    # --- partial prefills (SPEC §3.6): tier first, then the tier's policy ------------------------------

    def plan_step(self, partials: Sequence[Any], budget: int, *, free_seats: int,
                  demand: Demand | None = None,
                  replan: Callable[[dict[str, int]], Demand | None] | None = None) -> dict[str, int]:
        """As :meth:`PolicyQueue.plan_step`, over the tiers: a tier's partial prefills and waiting requests
        are walked in that tier's policy order, and a whole tier before the next."""
        if not self.ranks_partials:
            return {}
        groups: dict[float, list[Entry]] = {}
        for obj in partials:
            tier = self._tier_of(obj)
            queue = self._queue(tier)
            queue._flush_warning()
            groups.setdefault(tier, []).append(queue._partial_entry(obj))
        for tier in sorted(set(groups) | {t for t, q in self._tiers.items() if q}):
            entries = groups.setdefault(tier, [])
            queue = self._tiers[tier]
            queue._plan_begin(entries)  # every tier walked plans its step (promote_shortest's head)
            entries.sort(key=cmp_to_key(lambda a, b, q=queue: -1 if q._before(a, b) else 1))
        ranked = sorted(groups.items())
        if demand is None:
            demand = self._default_demand
        caps = self._walk(ranked, budget, free_seats, demand)
        for _ in range(MAX_WALKS - 1):
            again = replan(dict(caps)) if replan is not None else None
            if again is None:
                break
            revised = self._walk(ranked, budget, free_seats, again)
            if revised == caps:
                break
            caps = revised
        for tier, entries in ranked:
            for entry in entries:
                if caps.get(entry.key):
                    self._tiers[tier]._on_partial_planned(entry)
        return caps

    def _default_demand(self, obj: Any, budget_left: int) -> int:
        return min(max(1, self._view(obj).remaining_prefill_tokens), budget_left)

    def _walk(self, ranked: list[tuple[float, list[Entry]]], budget: int, free_seats: int,
              demand: Demand) -> dict[str, int]:
        """One walk: tiers in order; inside one, its partials merged with its waiting requests."""
        caps: dict[str, int] = {}
        left = sum(len(entries) for _, entries in ranked)
        for tier, mine in ranked:
            if not left:
                break
            queue = self._tiers[tier]
            entries = iter(mine)
            partial = next(entries, None)
            for waiting in queue._waiting_in_order():
                if not left or free_seats <= 0 or budget <= 0:
                    break
                while partial is not None and queue._before(partial, waiting):
                    budget = _give(partial, budget, demand, caps)
                    left -= 1
                    partial = next(entries, None)
                take = min(max(0, demand(waiting.obj, budget)), budget) if budget > 0 else 0
                if take:
                    budget -= take
                    free_seats -= 1
            while partial is not None:
                budget = _give(partial, budget, demand, caps)
                left -= 1
                partial = next(entries, None)
        return caps


def _at_priority_zero(view: QueuedRequest) -> QueuedRequest:
    """A copy of ``view`` at priority 0 (the caller's view is never changed)."""
    copied = object.__new__(QueuedRequest)
    for name in QueuedRequest.__slots__:
        setattr(copied, name, getattr(view, name))
    copied.priority = 0
    return copied


def _give(entry: Entry, budget: int, demand: Demand, caps: dict[str, int]) -> int:
    take = min(max(0, demand(entry.obj, budget)), budget) if budget > 0 else 0
    caps[entry.key] = take
    return budget - take


__all__ = ["DECODE_TIER", "PriorityHeapQueue", "TiersQueue"]
