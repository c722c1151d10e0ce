"""``default`` (alias ``fcfs``): stable order by internal priority, first come first served (SPEC §3.1)."""

from __future__ import annotations

from collections.abc import Iterator

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue


class FCFSQueue(PolicyQueue):
    policy = "default"
    priority_by_value = True
    ranks_partials = False  # SPEC §3.6: "ordered" schedules exactly as "first" (no caps)
    returning_first = False  # prepends already go to the front: vLLM's own FCFS order, step for step

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._heap = LazyHeap()  # (priority, seq): priorities >= 0; negative ones are ahead in the base

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._heap.push((entry.view.priority, entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._heap.discard()

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
