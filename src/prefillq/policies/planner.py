"""The partial-prefill plan (SPEC §3.6), beside the queue contract rather than inside it.

``partials_ordered`` mode shares each step's prefill token budget between the engine's running partial
prefills and the waiting requests, in the policy's order. :class:`Planner` is a mixin of
:class:`~prefillq.policies.base.PolicyQueue`: it walks the queue's own order (``_waiting_in_order``,
``_before``) and asks the engine, through a ``demand`` function, what each request would take. It reads no
clock except through the queue (a partial prefill the queue never saw enters at the queue's clock).

The plan is advice to the engine: an engine adapter applies it as caps on running partial prefills and
must give back, in the same step, any budget it held for waiting requests that the engine then did not
admit (SPEC §4.1: never worse than the engine's own rule). The vLLM plug-in does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cmp_to_key
from typing import Any

from prefillq.policies.entry import Entry, returning

# plan_step's question to the engine: how many prefill tokens would this request take in this step with
# ``budget_left`` tokens left (0: it cannot run now: no KV blocks, no seat, ...)?
Demand = Callable[[Any, int], int]

# Walks of one plan at most: later walks refine the waiting requests' prefix-cache hits (plan_step's replan).
MAX_WALKS = 6


class Planner:
    """Mixin of PolicyQueue: ``plan_step`` and what it needs (the queue supplies the order and the memory)."""

    ranks_partials = True  # plan_step ranks partials among waiting requests; not `default` (SPEC §3.6)
    returning_first = True  # see PolicyQueue

    def plan_step(self, partials: Sequence[Any], budget: int, *, free_seats: int,
                  demand: Demand | None = None,
                  replan: Callable[[dict[str, int]], Demand | None] | None = None) -> dict[str, int]:
        """Share a step's prefill budget between partial prefills and waiting requests in policy order (SPEC §3.6).

        Call at the start of a step, before any pop. ``partials`` are the engine's running requests whose
        prefill is unfinished (they hold KV blocks; the queue does not hold them). Walking the policy's
        order, each partial prefill gets ``demand(partial, budget left)`` tokens and each waiting request
        (while ``free_seats`` last) takes ``demand(request, budget left)``; 0 means it cannot run now and
        passes its share on. Returns each partial's token cap (request id -> tokens, possibly 0); {} means
        no caps, the engine's own rule (always with ``default``). ``replan(caps)`` returns a fresh demand
        for another walk when those caps change what waiting requests would take (the blocks partials fill
        raise their prefix-cache hits in the same step), else None; at most ``MAX_WALKS`` walks.
        A walk stops at the last partial: O(k log n) for the k waiting requests ranked ahead of it.
        """
        self._flush_warning()
        if not self.ranks_partials:
            return {}
        if demand is None:
            demand = self._default_demand
        entries = [self._partial_entry(obj) for obj in partials]
        self._plan_begin(entries)
        entries.sort(key=cmp_to_key(lambda a, b: -1 if self._before(a, b) else 1))
        caps = self._walk(entries, budget, free_seats, demand)
        for _ in range(MAX_WALKS - 1):
            again = replan(dict(caps)) if replan is not None else None
            if again is None:
                break
            revised = self._walk(entries, budget, free_seats, again)
            if revised == caps:
                break
            caps = revised
        for entry in entries:
            if caps.get(entry.key):
                self._on_partial_planned(entry)
        return caps

    def _walk(self, entries: list[Entry], budget: int, free_seats: int, demand: Demand) -> dict[str, int]:
        """One walk of a plan: the partials (``entries``, ranked) merged with the waiting requests."""
        caps: dict[str, int] = {}
        ranked = iter(entries)
        partial = next(ranked, None)
        for waiting in self._waiting_in_order():
            if partial is None or free_seats <= 0 or budget <= 0:
                break
            while partial is not None and self._before(partial, waiting):
                budget = self._give(partial, budget, demand, caps)
                partial = next(ranked, None)
            take = min(max(0, demand(waiting.obj, budget)), budget) if budget > 0 else 0
            if take:
                budget -= take
                free_seats -= 1
        while partial is not None:
            budget = self._give(partial, budget, demand, caps)
            partial = next(ranked, None)
        return caps

    def _default_demand(self, obj: Any, budget_left: int) -> int:
        return min(max(1, self._view(obj).remaining_prefill_tokens), budget_left)

    def _partial_entry(self, obj: Any) -> Entry:
        """An entry for a partial prefill, with what it had when it first entered the queue."""
        view = self._view(obj)
        key = view.request_id
        if key in self._entries:
            raise ValueError(f"request {key!r} is waiting in the queue, not a partial prefill")
        memory = self._memory.get(key)
        if memory is None:  # started before this queue saw it (or forgotten): it enters now
            memory = (self._clock(), self.processed_tokens, None, self._next_seq)
            self._next_seq += 1
        enqueued_at, p_arrival, cost, arrival = memory
        entry = Entry(obj, key, view, arrival, arrival, enqueued_at, p_arrival, cost)
        entry.alive = False  # never in a heap
        if self.returning_first and returning(view):  # recomputing after a preemption mid-stream
            entry.lane = "returning"
        else:
            entry.lane = "priority" if view.priority < 0 else self._partial_lane(entry)
        self._memory[key] = (entry.enqueued_at, entry.p_arrival, entry.cost, entry.arrival)
        self._memory.move_to_end(key)
        return entry

    def _give(self, entry: Entry, budget: int, demand: Demand, caps: dict[str, int]) -> int:
        take = min(max(0, demand(entry.obj, budget)), budget) if budget > 0 else 0
        caps[entry.key] = take
        return budget - take

    # --- supplied by PolicyQueue ------------------------------------------------------------------

    def _flush_warning(self) -> None:
        raise NotImplementedError

    def _waiting_in_order(self) -> Iterator[Entry]:
        raise NotImplementedError

    def _before(self, a: Entry, b: Entry) -> bool:
        raise NotImplementedError

    def _plan_begin(self, partials: list[Entry]) -> None:
        """Called once per plan, before ranking, with the partial prefills' entries."""

    def _on_partial_planned(self, entry: Entry) -> None:
        """A partial prefill was given tokens in a plan."""

    def _partial_lane(self, entry: Entry) -> str:
        """The lane of a partial prefill outside the priority group (SPEC §3.6); may bind its cost."""
        return "queue"
