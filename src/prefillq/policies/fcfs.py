"""``default`` (alias ``fcfs``): stable order by internal priority, first come first served (SPEC §3.1)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import repeat
from operator import attrgetter
from typing import Any

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue


class FCFSQueue(PolicyQueue):
    policy = "default"
    priority_by_value = True
    ranks_partials = False  # SPEC §3.6: "ordered" schedules exactly as "first" (no caps)
    returning_first = False  # prepends already go to the front: vLLM's own FCFS order, step for step

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._heap = LazyHeap()  # (priority, seq): priorities >= 0; negative ones are ahead in the base
        # this lane's entries by their request object's identity: a move finds them without reading the
        # requests (an attribute read per request is a cache miss apiece on a long queue)
        self._lane_entries: dict[int, Entry] = {}

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._heap.push((entry.view.priority, entry.seq, entry))
        self._lane_entries[id(entry.obj)] = entry

    def _delete_rest(self, entry: Entry) -> None:
        self._heap.discard()
        # a subclass with keys of its own (tiers.PriorityHeapQueue) registers nothing: its moves take the calls
        self._lane_entries.pop(id(entry.obj), None)

    def _choose_rest(self) -> Entry | None:
        return self._heap.top()

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        rest.sort(key=lambda e: (e.view.priority, e.seq))
        return rest

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return (a.view.priority, a.seq) < (b.view.priority, b.seq)

    def _rest_in_order(self) -> Iterator[Entry]:
        return self._heap.ordered()

    def in_order(self) -> list[Any]:
        if self._pinned is not None or self._decodes.live or self._elevated.live:
            return super().in_order()
        return list(map(_OBJ, self._heap.all_ordered()))  # the FIFO lane is the whole queue

    def _move_entries(self, removed: list[Any], prepended: list[Any]) -> bool:
        # A permutation of queued requests of the FIFO lane: each takes the front position a prepend would
        # give it (prepends count down). A move of a large share of the lane keeps the entries and rebuilds
        # the heap once, every pass in C (map, zip, set); a few requests of a long queue get fresh entries
        # pushed in (the old ones die at the heap's top). Either costs a fraction of the calls one by one.
        count = len(prepended)
        if not count or len(removed) != count:
            return False
        try:
            same = len(moved := set(prepended)) == count and moved == set(removed)
        except TypeError:  # unhashable requests: compare identities
            same = len(moved := set(map(id, prepended))) == count and moved == set(map(id, removed))
        if not same:
            return False
        moving = list(map(self._lane_entries.get, map(id, prepended)))
        if not all(moving):  # one is not in this lane
            return False
        heap = self._heap
        if count * _REBUILD_SHARE < heap.live:
            self._push_moved(moving)
            return True
        # prepends count down: the last one prepended gets the smallest seq; items built in key order
        low = self._next_front_seq - count + 1
        seqs = range(low, low + count)
        self._next_front_seq -= count
        moving.reverse()
        deque(map(setattr, moving, repeat("seq", count), seqs), maxlen=0)
        # the whole lane moving with one priority (the usual case): its keys say so, no view need be read
        shared = heap.shared_first_key() if count == heap.live else None
        priorities = repeat(shared, count) if shared is not None else map(_PRIORITY, moving)
        heap.rebuild(list(zip(priorities, seqs, moving, strict=True)), count)
        return True

    def _push_moved(self, moving: list[Entry]) -> None:
        heap, entries, lane, seq = self._heap, self._entries, self._lane_entries, self._next_front_seq
        for entry in moving:
            entry.alive = False
            heap.discard()
        heap.top()  # a window's old items are the heap's smallest: they leave now, O(log n) each
        for entry in moving:  # in prepend order: each one ahead of those before it
            fresh = Entry(entry.obj, entry.key, entry.view, seq, entry.arrival, entry.enqueued_at, entry.p_arrival,
                          entry.cost)
            fresh.lane = "queue"
            entries[entry.key] = fresh
            lane[id(entry.obj)] = fresh
            heap.push((entry.view.priority, seq, fresh))
            seq -= 1
        self._next_front_seq = seq


# a move rebuilds the heap when it holds at least 1/8 of the FIFO lane (a rebuild costs O(lane); pushing
# fresh entries costs about 8x as much per moved request as the rebuild per request it keeps)
_REBUILD_SHARE = 8
_PRIORITY = attrgetter("view.priority")
_OBJ = attrgetter("obj")
