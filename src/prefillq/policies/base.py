"""The queue contract every policy implements, and the bookkeeping they share.

The contract is vLLM's ``RequestQueue`` (add/pop/peek/prepend/remove, len/bool/iter) plus
``refresh_request`` (for re-ranking engines whose requests progress while queued), ``on_prefill_submitted``
(the end of a scheduling step, SPEC §3.0), ``plan_step`` (SPEC §3.6) and ``stats``. A queue stores the
caller's own objects and sees them through a ``view`` function that returns a :class:`QueuedRequest`.

Shared rules live here so each policy file only orders its "rest" group: decode requests first (stable),
then negative internal priority (in arrival order; ``default`` alone sorts it by value, lower first), then
the policy. This module imports nothing from the rest of the package except the request view and the config.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.policies.entry import Entry, LazyHeap, identity_view, merge_ordered, returning
from prefillq.policies.planner import MAX_WALKS, Demand, Planner
from prefillq.requests import QueuedRequest

__all__ = ["MAX_WALKS", "MEMORY_LIMIT", "SKIPPED", "Clock", "Demand", "Entry", "LazyHeap", "PolicyQueue", "View",
           "identity_view", "merge_ordered"]

logger = logging.getLogger("prefillq")

Clock = Callable[[], float]
View = Callable[[Any], QueuedRequest]
# How many popped requests a queue remembers so that a later prepend keeps the original enqueue time,
# arrival counter and frozen cost. Old memories are dropped first; a forgotten request re-enters as new.
MEMORY_LIMIT = 65536

SKIPPED = "skipped"  # a pop of this step that the engine has already declared a skip


class PolicyQueue(Planner):
    """Base of every prefill-queue policy (the contract plus shared bookkeeping)."""

    policy = ""
    # Only ``default`` orders the negative-priority group by value; every other policy keeps that
    # group in arrival order (SPEC §3.2/§3.3: LightLLM's elevated flag is a single level).
    priority_by_value = False
    # Requests that come back with streamed output (preempted mid-stream) go first, in the order they
    # came back, as stock vLLM puts them (SPEC §4.1). ``default`` already does (its prepends go to the
    # front) and short_request_first has its immediate lane for them.
    returning_first = True
    # Whether the order reads a request's remaining uncached work (its prefix-cache hit) while it waits; an
    # engine adapter then refreshes a request whose hit grew (the vLLM plug-in's CacheKeys).
    ranks_by_uncached = False

    def __init__(self, config: PolicyConfig, clock: Clock | None = None, view: View | None = None) -> None:
        self.config = config
        self._clock = clock if clock is not None else time.monotonic
        self._view = view if view is not None else identity_view
        self._entries: dict[str, Entry] = {}
        self._next_seq = 0
        self._next_front_seq = -1
        self._memory: OrderedDict[str, tuple[float, int, int | None, int]] = OrderedDict()
        # None: remember every popped request until the engine says it finished (forget_request), as the
        # vLLM plug-in does; a number keeps at most that many (an engine that never says so).
        self.memory_limit: int | None = MEMORY_LIMIT
        self._pinned: Entry | None = None
        self._decodes = LazyHeap()
        self._elevated = LazyHeap()
        self.processed_tokens = 0
        self._dispatched: dict[str, int] = {}
        self._prepends = 0
        # Pops of the current step, by request id: (lane, the policy's undo token), or SKIPPED once the
        # engine said it only popped the request to skip it. A pop that comes back in the same step is
        # not a dispatch (SPEC §3.0), so its effects are undone.
        self._step_pops: dict[str, Any] = {}
        self._pending_warning: tuple[str, str, tuple] | None = None  # (request id, message, args)
        self._reordering = False  # inside reordering(): removals and prepends only move requests
        self._moved_views: dict[str, QueuedRequest] = {}
        self._steps = 0
        self._last_stats_at: float | None = None

    # --- the contract -----------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        """Enqueue a newly arrived request at the back."""
        self._flush_warning()
        key = request.request_id
        if key in self._entries:
            raise ValueError(f"request {key!r} is already queued")
        self._memory.pop(key, None)
        now = self._clock()
        seq = self._next_seq
        self._next_seq += 1
        self._insert(Entry(request, key, self._view(request), seq, seq, now, self.processed_tokens, None))
        self._after_change(now)

    def pop_request(self) -> Any:
        """Remove and return the next request to dispatch (the peeked one, if a peek is pinned)."""
        self._flush_warning()
        entry = self._pinned if self._pinned is not None else self._choose()
        if entry is None:
            raise IndexError("pop from an empty prefill queue")
        self._pinned = None
        self._step_pops[entry.key] = (entry.lane, self._on_dispatch(entry))
        self._dispatched[entry.lane] = self._dispatched.get(entry.lane, 0) + 1
        self._delete(entry)
        self._memory[entry.key] = (entry.enqueued_at, entry.p_arrival, entry.cost, entry.arrival)
        if self.memory_limit is not None and len(self._memory) > self.memory_limit:
            self._memory.popitem(last=False)
        self._maybe_log_stats()
        return entry.obj

    def peek_request(self) -> Any:
        """Return the next request without removing it; the choice stays pinned until a change."""
        self._flush_warning()
        if self._pinned is None:
            entry = self._choose()
            if entry is None:
                raise IndexError("peek from an empty prefill queue")
            self._pinned = entry
        return self._pinned.obj

    def prepend_request(self, request: Any) -> None:
        """Re-insert a request that was popped (skipped this step, or preempted), at the front of its group."""
        key = request.request_id
        if key in self._entries:
            raise ValueError(f"request {key!r} is already queued")
        returned = self._undo_pop(key)  # popped this step and back: a skip, not a dispatch
        self._flush_warning()
        now = self._clock()
        seq = self._next_front_seq
        self._next_front_seq -= 1
        memory = self._memory.pop(key, None)
        if memory is None:
            entry = Entry(request, key, self._view(request), seq, seq, now, self.processed_tokens, None)
        else:
            enqueued_at, p_arrival, cost, arrival = memory
            # inside reordering() the request only moved: its view is the one it had a moment ago
            view = self._moved_views.pop(key, None) if self._reordering else None
            entry = Entry(request, key, view if view is not None else self._view(request), seq, arrival,
                          enqueued_at, p_arrival, cost)
        if not returned and not self._reordering:
            self._prepends += 1
        self._insert(entry)
        self._after_change(now)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Prepend several requests one after the other, as vLLM's deque ``extendleft`` does (SPEC §3.0).

        The last one given ends up first. vLLM hands back the requests it skipped in a step in reverse
        pop order, so they return to the front in the order they had before they were popped.
        """
        for request in list(requests):
            self.prepend_request(request)

    def skip_request(self, request: Any) -> None:
        """The engine popped ``request`` this step only to skip it (it will prepend it): not a dispatch.

        vLLM pops such a request first and prepends it at the end of the step; telling the queue at
        once keeps the rest of the step exact (``promote_shortest``'s promotion stays available).
        Requests not popped in this step are ignored.
        """
        if self._undo_pop(request.request_id):
            self._step_pops[request.request_id] = SKIPPED

    def refresh_request(self, request: Any) -> None:
        """Re-read a queued request's view (its progress changed), keeping its place and its history."""
        old = self._entries.get(request.request_id)
        if old is None:
            raise KeyError(f"request {request.request_id!r} is not queued")
        self._delete(old)
        self._insert(Entry(request, old.key, self._view(request), old.seq, old.arrival, old.enqueued_at,
                           old.p_arrival, old.cost))
        self._after_change(None)

    def remove_request(self, request: Any) -> None:
        """Remove a request if queued (abort/finish); requests not in the queue are ignored."""
        self._flush_warning()
        entry = self._entries.get(request.request_id)
        self._memory.pop(request.request_id, None)
        if entry is None:
            return
        self._delete(entry)
        if self._reordering:  # it comes back at once: keep what a prepend restores
            self._memory[entry.key] = (entry.enqueued_at, entry.p_arrival, entry.cost, entry.arrival)
            self._moved_views[entry.key] = entry.view
        self._after_change(None)

    def forget_request(self, request: Any) -> None:
        """The engine is done with ``request`` (finished or aborted): drop what a prepend would restore."""
        self._memory.pop(request.request_id, None)

    @contextlib.contextmanager
    def reordering(self) -> Iterator[None]:
        """The engine removes queued requests and prepends them again in an order of its own (vLLM 0.34's
        cache-aware admission window): those prepends are not preempted requests coming back, and the
        requests keep their waiting time, arrival and cost."""
        self._reordering = True
        dead_before = {id(heap): heap.dead for heap in self._heaps()}
        try:
            yield
        finally:
            self._reordering = False
            self._moved_views.clear()
            # moved requests' dead entries left in a heap would sit at the head of every read: drop them
            for heap in self._heaps():
                if heap.dead > dead_before.get(id(heap), 0):
                    heap.compact()

    def _heaps(self) -> Iterator[LazyHeap]:
        """Every heap of this queue: an attribute, or the values of a dict attribute of heaps (lanes). A dict
        of anything else (the entries, the memory) is skipped on its first value: O(attributes), not O(n)."""
        for value in vars(self).values():
            if isinstance(value, LazyHeap):
                yield value
            elif isinstance(value, dict) and isinstance(next(iter(value.values()), None), LazyHeap):
                yield from (heap for heap in value.values() if isinstance(heap, LazyHeap))

    def remove_requests(self, requests: Iterable[Any]) -> None:
        """Remove each request that is queued; others are ignored."""
        for request in requests:
            self.remove_request(request)
        if self._reordering:
            # vLLM 0.34's admission window removes the head of the queue before it prepends it again in
            # its own order: the dead entries sit at the top of the heaps now, where popping them costs
            # O(log n) each, and leaving reordering() then has nothing to compact.
            for heap in self._heaps():
                heap.top()

    def move_to_front(self, removed: list[Any], prepended: list[Any]) -> None:
        """``remove_requests(removed)``, then ``prepend_request`` of each of ``prepended`` in turn, as one
        reordering: what vLLM 0.34's admission window does to the head of the queue every step.

        Where the policy can (``_move_entries``: ``default``), a permutation of queued requests moves in
        one pass at C speed, the entries reused and the heap rebuilt once, into the state the calls one by
        one would leave (the same order, keys, waiting times and counters); anything else takes the calls.
        """
        if not self._reordering:
            with self.reordering():
                self.move_to_front(removed, prepended)
            return
        self._flush_warning()
        if self._move_entries(removed, prepended):
            self._after_change(self._clock())
            return
        self.remove_requests(removed)
        for request in prepended:
            self.prepend_request(request)

    def on_prefill_submitted(self, num_tokens: int, steps: int = 1) -> None:
        """End of a scheduling step: the engine submitted ``num_tokens`` prefill tokens for execution
        (``steps`` > 1: the end of that many steps in a row that submitted no tokens, as many calls would)."""
        if ((type(num_tokens) is not int and (isinstance(num_tokens, bool) or not isinstance(num_tokens, int)))
                or num_tokens < 0 or (steps != 1 and (num_tokens or type(steps) is not int or steps < 1))):
            raise ValueError(f"num_tokens must be a non-negative int (0 over several steps), got {num_tokens!r}, "
                             f"steps={steps!r}")
        self._flush_warning()
        self.processed_tokens += num_tokens
        self._steps += steps
        self._pinned = None
        self._step_pops.clear()
        self._on_step()
        self._maybe_log_stats()

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[Any]:
        """The order in which the queue would dispatch now, within the current step."""
        # Lazily, from the heaps: the k-th request costs O(k log n), so a reader of the head (vLLM 0.34's
        # admission window takes the first few with islice) does not pay for the whole queue.
        # No generator of its own: a reader of the whole queue pays per request only for the heap's.
        first = self._pinned
        if first is None:
            return map(_OBJ, self._dispatch_iter())
        return itertools.chain((first.obj,), (e.obj for e in self._dispatch_iter() if e is not first))

    def __contains__(self, request: Any) -> bool:
        return request.request_id in self._entries

    def in_order(self) -> list[Any]:
        """Every waiting request in dispatch order at once (``list(queue)``; a policy may do it faster)."""
        return list(self)

    def __getitem__(self, index: int) -> Any:
        """The request at ``index`` in dispatch order (negative counts from the back), as vLLM's deque allows."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"prefill queue indices must be integers, not {type(index).__name__}")
        size = len(self._entries)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError("prefill queue index out of range")
        return next(itertools.islice(iter(self), position, None))

    # --- statistics -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Aggregated counters (the content of the periodic statistics line)."""
        self._flush_warning()
        now = self._clock()
        lanes: dict[str, int] = {}
        longest: dict[str, float] = {}
        for entry in self._entries.values():
            lanes[entry.lane] = lanes.get(entry.lane, 0) + 1
            wait = now - entry.enqueued_at
            if wait > longest.get(entry.lane, -1.0):
                longest[entry.lane] = wait
        for lane in self._lane_names():
            lanes.setdefault(lane, 0)
        return {
            "policy": self.policy,
            "size": len(self._entries),
            "lanes": lanes,
            "dispatched": dict(self._dispatched),
            "prepends": self._prepends,
            "steps": self._steps,
            "processed_prefill_tokens": self.processed_tokens,
            "longest_wait_s": {lane: round(w, 6) for lane, w in longest.items()},
            **self._policy_stats(),
        }

    def _maybe_log_stats(self, now: float | None = None) -> None:
        interval = self.config.stats_interval_s
        if interval <= 0:
            return
        if now is None:
            now = self._clock()
        if self._last_stats_at is None:
            self._last_stats_at = now
        elif now - self._last_stats_at >= interval:
            self._last_stats_at = now
            logger.info("%s", format_stats_line(self.stats()))

    # --- shared grouping: decodes, then elevated priority, then the policy's own order --------

    def _insert(self, entry: Entry) -> None:
        self._entries[entry.key] = entry
        view = entry.view
        if view.is_decode or (self.returning_first and returning(view)):
            entry.lane = "decode" if view.is_decode else "returning"
            self._decodes.push((entry.seq, entry))
        elif view.priority < 0:
            entry.lane = "priority"
            self._elevated.push((view.priority if self.priority_by_value else 0, entry.seq, entry))
        else:
            self._insert_rest(entry)

    def _delete(self, entry: Entry) -> None:
        del self._entries[entry.key]
        entry.alive = False
        if entry.lane in _FRONT:
            self._decodes.discard()
        elif entry.lane == "priority":
            self._elevated.discard()
        else:
            self._delete_rest(entry)

    def _choose(self) -> Entry | None:
        if self._decodes.live:
            return self._decodes.top()
        if self._elevated.live:
            return self._elevated.top()
        return self._choose_rest()

    def _dispatch_order(self) -> list[Entry]:
        front = [e for e in self._entries.values() if e.lane in _GROUPS]
        by_value = self.priority_by_value
        front.sort(key=lambda e: (e.lane not in _FRONT, e.view.priority if by_value and e.lane == "priority" else 0,
                                  e.seq))
        return front + self._rest_order()

    def _undo_pop(self, key: str) -> bool:
        """Undo a pop of this step (True), or do nothing for a request not popped in it (False)."""
        record = self._step_pops.pop(key, None)
        if record is None:
            return False
        if record is not SKIPPED:
            lane, token = record
            self._dispatched[lane] -= 1
            if not self._dispatched[lane]:
                del self._dispatched[lane]
            if self._pending_warning is not None and self._pending_warning[0] == key:
                self._pending_warning = None
            self._undo_dispatch(key, token)
        return True

    def _warn_after_this_pop(self, key: str, message: str, *args: Any) -> None:
        """Log a warning caused by popping ``key`` at the next queue operation, unless the pop is undone."""
        self._pending_warning = (key, message, args)

    def _flush_warning(self) -> None:
        if self._pending_warning is not None:
            _, message, args = self._pending_warning
            self._pending_warning = None
            logger.warning(message, *args)

    def _after_change(self, now: float | None) -> None:
        self._pinned = None
        self._maybe_log_stats(now)

    # --- planning a step with partial prefills (SPEC §3.6) -------------------------------------

    def _dispatch_iter(self) -> Iterator[Entry]:
        """The waiting entries in the order pops would take them now, lazily."""
        return itertools.chain(self._decodes.ordered(), self._elevated.ordered(), self._rest_dispatch_iter())

    def _rest_dispatch_iter(self) -> Iterator[Entry]:
        """The rest group in dispatch order, lazily (a policy whose plan order differs overrides it)."""
        return self._rest_in_order()

    def _waiting_in_order(self) -> Iterator[Entry]:
        yield from self._decodes.ordered()
        yield from self._elevated.ordered()
        yield from self._rest_in_order()

    def _before(self, a: Entry, b: Entry) -> bool:
        """Whether ``a`` ranks before ``b`` in this step's order (waiting entries and partials alike)."""
        group_a, group_b = _GROUPS.get(a.lane, 2), _GROUPS.get(b.lane, 2)
        if group_a != group_b:
            return group_a < group_b
        if group_a == 2:
            return self._rest_before(a, b)
        if group_a == 1 and self.priority_by_value and a.view.priority != b.view.priority:
            return a.view.priority < b.view.priority
        return a.seq < b.seq

    # --- what each policy provides ----------------------------------------------------------

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        raise NotImplementedError

    def _rest_in_order(self) -> Iterator[Entry]:
        """The rest group's waiting entries in dispatch order, lazily."""
        raise NotImplementedError

    def _insert_rest(self, entry: Entry) -> None:
        raise NotImplementedError

    def _delete_rest(self, entry: Entry) -> None:
        raise NotImplementedError

    def _choose_rest(self) -> Entry | None:
        raise NotImplementedError

    def _rest_order(self) -> list[Entry]:
        raise NotImplementedError

    def _move_entries(self, removed: list[Any], prepended: list[Any]) -> bool:
        """``move_to_front`` in one pass, if this policy can and the move is a permutation (False: it did
        nothing, and the calls one by one follow)."""
        return False

    def _on_dispatch(self, entry: Entry) -> Any:
        """Called with the chosen entry just before it leaves the queue; returns what undoing it needs."""
        return None

    def _undo_dispatch(self, key: str, token: Any) -> None:
        """Undo ``_on_dispatch`` for a pop that came back in the same step (``token`` is what it returned)."""

    def _on_step(self) -> None:
        """Called after the processed-prefill counter advanced (end of a step)."""

    def _policy_stats(self) -> dict[str, Any]:
        return {}

    def _lane_names(self) -> tuple[str, ...]:
        return ("queue",)


_GROUPS = {"decode": 0, "returning": 0, "priority": 1}
_OBJ = operator.attrgetter("obj")
_FRONT = ("decode", "returning")  # the lanes of the front group, kept in one FIFO heap



def format_stats_line(stats: dict[str, Any]) -> str:
    lanes = " ".join(f"{k}={v}" for k, v in sorted(stats["lanes"].items()))
    sent = " ".join(f"{k}={v}" for k, v in sorted(stats["dispatched"].items())) or "none"
    waits = " ".join(f"{k}={v:.3f}s" for k, v in sorted(stats["longest_wait_s"].items())) or "none"
    extra = " ".join(f"{k}={v}" for k, v in stats.items()
                     if k not in ("policy", "size", "lanes", "dispatched", "longest_wait_s"))
    return (f"prefillq stats policy={stats['policy']} waiting={stats['size']} lanes[{lanes}] "
            f"dispatched[{sent}] longest_wait[{waits}] {extra}")
