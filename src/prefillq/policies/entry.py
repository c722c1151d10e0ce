"""The queue entry and the lazy heap that every policy orders its entries in (shared by base and planner)."""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

from prefillq.requests import QueuedRequest

# LazyHeap.ordered(): after yielding this share of the items one by one, the rest comes from one sort
_LAZY_SHARE = 32
_ENTRY = operator.itemgetter(-1)
_FIRST = operator.itemgetter(0)
_ALIVE = operator.attrgetter("alive")


def identity_view(obj: Any) -> QueuedRequest:
    return obj


class Entry:
    """One queued request: the caller's object plus what the policy needs to order it."""

    __slots__ = ("alive", "arrival", "cost", "enqueued_at", "key", "lane", "obj", "p_arrival", "seq", "slot",
                 "view")

    def __init__(self, obj: Any, key: str, view: QueuedRequest, seq: int, arrival: int, enqueued_at: float,
                 p_arrival: int, cost: int | None) -> None:
        self.obj = obj
        self.key = key
        self.view = view
        self.seq = seq                  # FIFO position: adds count up, prepends count down (front)
        self.arrival = arrival          # original add order, kept across pop + prepend
        self.enqueued_at = enqueued_at  # clock value when the request first entered the queue
        self.p_arrival = p_arrival      # processed-prefill counter when it first entered
        self.cost = cost                # HRRN cost, frozen once bound
        self.lane = ""
        self.slot = -1
        self.alive = True

    def __lt__(self, other: Entry) -> bool:
        # Heap keys end with ``seq``; only a refreshed entry shares its seq, with its dead former self,
        # and which of those two a heap holds first makes no difference.
        return False


class LazyHeap:
    """A binary heap whose removals are lazy: dead entries are dropped when they reach the top.

    Items are ``(*sort_key, entry)``; every sort key ends with the entry's ``seq``, unique among live
    entries, so two live entries are never compared.
    """

    __slots__ = ("_items", "live")

    def __init__(self) -> None:
        self._items: list[tuple] = []
        self.live = 0

    def __len__(self) -> int:
        return self.live

    def push(self, item: tuple) -> None:
        heapq.heappush(self._items, item)
        self.live += 1

    def discard(self) -> None:
        """Account for one of this heap's entries having been marked dead."""
        self.live -= 1
        if len(self._items) > 2 * self.live + 64:
            self._items = [item for item in self._items if item[-1].alive]
            heapq.heapify(self._items)

    @property
    def dead(self) -> int:
        """How many dead entries the heap still holds."""
        return len(self._items) - self.live

    def compact(self) -> None:
        """Drop every dead entry now (O(n))."""
        if len(self._items) > self.live:
            self._items = [item for item in self._items if item[-1].alive]
            heapq.heapify(self._items)

    def rebuild(self, added: list[tuple], moved: int) -> None:
        """Give ``moved`` of the live entries the items ``added``, whose keys end with their new ``seq``: their
        former items (whose keys end with a ``seq`` they no longer have) and every dead entry leave; one
        heapify, cheap when ``added`` is in key order and holds every live entry."""
        if moved < self.live:
            added.extend(item for item in self._items if item[-1].alive and item[-2] == item[-1].seq)
        heapq.heapify(added)
        self._items = added

    def shared_first_key(self) -> Any:
        """The first field of every item's key when they all have the same one (else None): O(n) in C."""
        values = set(map(_FIRST, self._items))
        return next(iter(values)) if len(values) == 1 else None

    def top(self) -> Entry | None:
        items = self._items
        while items and not items[0][-1].alive:
            heapq.heappop(items)
        return items[0][-1] if items else None

    def all_ordered(self) -> list[Entry]:
        """Every live entry in key order, at once: one C-speed sort of the items."""
        return list(filter(_ALIVE, map(_ENTRY, sorted(self._items))))

    def ordered(self) -> Iterator[Entry]:
        """Live entries in key order, lazily and without touching the heap: O(log k) for the k-th.

        A reader who goes on past a small share of the heap (vLLM 0.34's admission window over the
        whole queue reads all of it every step) gets the rest from one sort of the heap's items: a
        C-speed sort costs about as much as yielding 1/32 of the items one by one from the frontier.
        """
        items = self._items
        frontier = [(items[0], 0)] if items else []
        switch = max(16, len(items) // _LAZY_SHARE)
        yielded = 0
        while frontier:
            if yielded == switch:
                # the `yielded` smallest live entries are out: the rest of the sorted items follows them
                rest = filter(_ALIVE, map(_ENTRY, sorted(items)))
                yield from itertools.islice(rest, yielded, None)
                return
            item, index = heapq.heappop(frontier)
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(items):
                    heapq.heappush(frontier, (items[child], child))
            if item[-1].alive:
                yielded += 1
                yield item[-1]


def merge_ordered(first: Iterator[Entry], second: Iterator[Entry],
                  before: Callable[[Entry, Entry], bool]) -> Iterator[Entry]:
    """Lazily merge two streams that are each in order under ``before``."""
    a, b = next(first, None), next(second, None)
    while a is not None and b is not None:
        if before(b, a):
            yield b
            b = next(second, None)
        else:
            yield a
            a = next(first, None)
    if a is not None:
        yield a
        yield from first
    if b is not None:
        yield b
        yield from second


def returning(view: QueuedRequest) -> bool:
    """A request that comes back after it streamed output (preempted mid-stream; not a continuation
    segment, which has a lane of its own): its user watches a stalled stream (SPEC §4.1)."""
    return view.resumed and view.output_tokens > 0 and view.segment_index == 0
