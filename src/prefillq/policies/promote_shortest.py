"""``promote_shortest``: one request with the least remaining prefill jumps to the head (SPEC §3.2).

At most one promotion per scheduling step; after the promoted request is dispatched the rest of the
step is plain FCFS. A deliberately small reorder, meant for prefill nodes of a PD deployment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue


class PromoteShortestQueue(PolicyQueue):
    policy = "promote_shortest"
    ranks_by_uncached = True  # its key is the remaining uncached prefill: engines keep it fresh

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fifo = LazyHeap()      # (seq,)
        self._shortest = LazyHeap()  # (remaining prefill, seq): the earliest wins a tie
        self._promoted_this_step = False
        self._promotions = 0
        self._partial_promoted = False  # this step's promotion went to a partial prefill (SPEC §3.6)
        self._plan_head: Entry | None = None  # the request a plan puts first

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = "queue"
        self._fifo.push((entry.seq, entry))
        self._shortest.push((entry.view.remaining_prefill_tokens, entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._fifo.discard()
        self._shortest.discard()

    def _choose_rest(self) -> Entry | None:
        if self._promoted_this_step:
            return self._fifo.top()
        return self._shortest.top()

    def _on_dispatch(self, entry: Entry) -> bool:
        """Returns whether this pop counted as a promotion (it used the step's turn, not the FIFO head)."""
        if entry.lane == "queue" and not self._promoted_this_step:
            self._promoted_this_step = True
            promoted = entry is not self._fifo.top()
            self._promotions += promoted
            return promoted
        return False

    def _undo_dispatch(self, key: str, token: bool) -> None:
        self._promotions -= token
        # The promotion stays used while another request of the group was dispatched in this step.
        self._promoted_this_step = self._partial_promoted or any(
            record[0] == "queue" for record in self._step_pops.values() if isinstance(record, tuple))

    def _on_step(self) -> None:
        self._promoted_this_step = self._partial_promoted = False

    def _plan_begin(self, partials: list[Entry]) -> None:
        """The step's one promotion goes to the least remaining prefill, waiting or partial."""
        self._plan_head = None
        if self._promoted_this_step:
            return
        candidates = [e for e in partials if e.lane == "queue"]
        waiting = self._shortest.top()
        if waiting is not None:
            candidates.append(waiting)
        if candidates:
            head = min(candidates, key=lambda e: (e.view.remaining_prefill_tokens, e.seq))
            self._plan_head = head
            if head is not waiting:  # a partial used the promotion: the step's pops are plain FCFS
                self._promoted_this_step = self._partial_promoted = True

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        if a is self._plan_head or b is self._plan_head:
            return a is self._plan_head
        return a.seq < b.seq

    def _rest_in_order(self) -> Iterator[Entry]:
        head = self._plan_head if self._plan_head is not None and self._plan_head.alive else None
        if head is not None:
            yield head
        yield from (e for e in self._fifo.ordered() if e is not head)

    def _rest_dispatch_iter(self) -> Iterator[Entry]:
        head = None if self._promoted_this_step else self._shortest.top()
        if head is not None:
            yield head
        yield from (e for e in self._fifo.ordered() if e is not head)

    def _rest_order(self) -> list[Entry]:
        rest = [e for e in self._entries.values() if e.lane == "queue"]
        rest.sort(key=lambda e: e.seq)
        if rest and not self._promoted_this_step:
            shortest = min(rest, key=lambda e: (e.view.remaining_prefill_tokens, e.seq))
            rest.remove(shortest)
            rest.insert(0, shortest)
        return rest

    def _policy_stats(self) -> dict[str, Any]:
        return {"promotions": self._promotions}
