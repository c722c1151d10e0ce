"""``promote_shortest``: one request with the least remaining prefill jumps to the head (SPEC §3.2).

At most one promotion per scheduling step; after the promoted request is dispatched the rest of the
step is plain FCFS. A deliberately small reorder, meant for prefill nodes of a PD deployment.
"""

from __future__ import annotations

from typing import Any

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue


class PromoteShortestQueue(PolicyQueue):
    policy = "promote_shortest"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fifo = LazyHeap()      # (seq,)
        self._shortest = LazyHeap()  # (remaining prefill, seq): the earliest wins a tie
        self._promoted_this_step = False
        self._promotions = 0

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
        self._promoted_this_step = any(record[0] == "queue" for record in self._step_pops.values()
                                       if isinstance(record, tuple))

    def _on_step(self) -> None:
        self._promoted_this_step = False

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
