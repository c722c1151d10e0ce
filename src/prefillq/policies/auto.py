"""``auto``: shortest remaining prefill first, with a token-aged deadline cap (SPEC §3.7). No settings.

Every request in the rest group gets, the first time it takes part in an ordering, a frozen cost
``c = max(1, prompt_tokens - cached_tokens)`` (as ``hrrn``) and a *deadline* on the processed-prefill
counter ``P`` (the same counter ``hrrn`` ages by, SPEC §3.3):

    deadline = P_at_arrival + SLOWDOWN * c + GRACE_TOKENS

Order, each step:

1. *due* requests (``deadline <= P``) first, earliest deadline first;
2. then the rest by least remaining prefill (prompt - cached - computed), shortest remaining first.

Ties: the queue position (arrival order; a prepended request keeps its place at the front).

Short prompts therefore overtake long ones at once, with no threshold to choose (the split follows the
lengths actually waiting), while a long request can be passed over only until the engine has processed
``SLOWDOWN`` times its own prefill (plus a grace) since it arrived. The bound it gives, stated in
``docs/auto.md`` and tested in ``tests/test_auto_bound.py``: a request whose deadline has passed goes
before every request that arrived after its deadline, so a flood of short prompts can delay it by at
most the work that arrived before ``P_at_arrival + SLOWDOWN * c + GRACE_TOKENS``.

Both keys are integers on a counter every replica advances identically; no clock is read. Two lazy
heaps (by remaining prefill, by deadline) give O(log n) add/pop/remove.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue

# A request is due once the engine has processed this many times its own prefill since it arrived ...
SLOWDOWN = 64
# ... plus this many tokens (a short prompt is not promoted over other short ones within one budget).
GRACE_TOKENS = 8192


def frozen_cost(entry: Entry) -> int:
    """Bind the entry's cost the first time it is ordered (then frozen, as ``hrrn``)."""
    if entry.cost is None:
        entry.cost = max(1, entry.view.prompt_tokens - entry.view.cached_tokens)
    return entry.cost


def deadline(entry: Entry) -> int:
    return entry.p_arrival + SLOWDOWN * frozen_cost(entry) + GRACE_TOKENS


class AutoQueue(PolicyQueue):
    policy = "auto"
    ranks_by_uncached = True  # its key is the remaining uncached prefill: engines keep it fresh

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shortest = LazyHeap()  # (remaining prefill, seq, entry)
        self._due = LazyHeap()       # (deadline, seq, entry)
        self._promotions = 0

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._shortest.push((entry.view.remaining_prefill_tokens, entry.seq, entry))
        self._due.push((deadline(entry), entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._shortest.discard()
        self._due.discard()

    def _is_due(self, entry: Entry) -> bool:
        return deadline(entry) <= self.processed_tokens

    def _choose_rest(self) -> Entry | None:
        head = self._due.top()
        if head is not None and self._is_due(head):
            return head
        return self._shortest.top()

    def _on_dispatch(self, entry: Entry) -> bool:
        promoted = self._is_due(entry) and entry is not self._shortest.top()
        self._promotions += promoted
        return promoted

    def _undo_dispatch(self, key: str, token: bool) -> None:
        self._promotions -= token

    def _partial_lane(self, entry: Entry) -> str:
        frozen_cost(entry)
        return "queue"

    def _key(self, entry: Entry) -> tuple[int, int, int]:
        if self._is_due(entry):
            return (0, deadline(entry), entry.seq)
        return (1, entry.view.remaining_prefill_tokens, entry.seq)

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return self._key(a) < self._key(b)

    def _rest_in_order(self) -> Iterator[Entry]:
        due_now: set[str] = set()
        for entry in self._due.ordered():
            if not self._is_due(entry):
                break
            due_now.add(entry.key)
            yield entry
        for entry in self._shortest.ordered():
            if entry.key not in due_now:
                yield entry

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        rest.sort(key=self._key)
        return rest

    def _policy_stats(self) -> dict[str, object]:
        return {"deadline_promotions": self._promotions}
