"""Dynamo's router queue policy ``wspt`` (``--router-queue-policy wspt``), emulated inside one engine.

Rules as documented by ai-dynamo/dynamo (router ``configuration-and-tuning.md`` after PR #12635; policy
trait of PR #7260): the queue key is ``(1 + priority_jump) / max(1, input tokens - cached tokens)``,
computed when the request is queued, higher first (Smith's weighted-shortest-processing-time rule); strict
priority tiers and due dates come ahead of it (PR #14123). Here: no priority jump (every weight is 1), so
the order is least uncached input first, ties by arrival; our negative internal priority plays the strict
tier. The key is frozen at enqueue, so a heap gives O(log n) per operation, as in Dynamo's binary heap.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue


def wspt_cost(entry: Entry) -> int:
    """The uncached input when the request was queued, bound once."""
    if entry.cost is None:
        entry.cost = max(1, entry.view.prompt_tokens - entry.view.cached_tokens)
    return entry.cost


class DynamoWSPTQueue(PolicyQueue):
    policy = "dynamo_wspt"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._heap = LazyHeap()  # (cost, seq, entry)

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._heap.push((wspt_cost(entry), entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._heap.discard()

    def _choose_rest(self) -> Entry | None:
        return self._heap.top()

    def _partial_lane(self, entry: Entry) -> str:
        wspt_cost(entry)
        return "queue"

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return (wspt_cost(a), a.seq) < (wspt_cost(b), b.seq)

    def _rest_in_order(self) -> Iterator[Entry]:
        return self._heap.ordered()

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        rest.sort(key=lambda e: (wspt_cost(e), e.seq))
        return rest
