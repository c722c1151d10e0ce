"""A waiting list that the engine re-sorts once per scheduling pass, as SGLang and TensorRT-LLM do.

These engines keep their waiting requests in a plain list and sort the whole list at the start of each
scheduling pass with a key computed then (cache hits included), so a key may change between passes. The
emulation does the same: O(n log n) per pass and O(n) per removal, like the engines themselves. Between
sorts the list keeps its order: new arrivals go to the back, a request handed back (prepend) to the front.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefillq.policies.base import Entry, PolicyQueue


class SortedEachPassQueue(PolicyQueue):
    """Base of the list-sorting peers: subclasses give ``_sort_key`` and may switch sorting off."""

    ranks_partials = False  # these engines continue a started prefill before taking a waiting request

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._list: list[Entry] = []
        self._sorted_in_step = -1          # the step whose pass last looked at the list
        self._hole: tuple[str, int, int] | None = None  # (key, seq, index) of the last entry deleted

    def _sort_key(self, entry: Entry) -> Any:
        raise NotImplementedError

    def _sorts_this_pass(self) -> bool:
        return True

    def _pass(self) -> None:
        """The start of a scheduling pass (the first look at the list in a step): re-sort it."""
        if self._sorted_in_step != self._steps:
            self._sorted_in_step = self._steps
            if self._sorts_this_pass():
                self._list.sort(key=self._sort_key)

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        hole = self._hole
        self._hole = None
        if hole is not None and hole[:2] == (entry.key, entry.seq):  # refreshed in place: it keeps its place
            self._list.insert(hole[2], entry)
        elif entry.seq < 0:
            self._list.insert(0, entry)
        else:
            self._list.append(entry)

    def _delete_rest(self, entry: Entry) -> None:
        index = self._list.index(entry)
        del self._list[index]
        self._hole = (entry.key, entry.seq, index)

    def _choose_rest(self) -> Entry | None:
        self._pass()
        return self._list[0] if self._list else None

    def _rest_order(self) -> list[Entry]:
        self._pass()
        return list(self._list)

    def _rest_in_order(self) -> Iterator[Entry]:
        return iter(self._rest_order())

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return self._sort_key(a) < self._sort_key(b)
