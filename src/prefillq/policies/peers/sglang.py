"""SGLang's ``--schedule-policy hrrn`` and ``shortest-prefill-first``, as read at sgl-project/sglang commit
00550cd11b35 (``python/sglang/srt/managers/schedule_policy.py``: ``SchedulePolicy``).

Both sort SGLang's whole waiting list at every scheduling pass (``calc_priority``), so both are O(n log n)
per pass and emulated as such (:mod:`.sorted_list`). Negative internal priority still goes first, as for
every prefillq queue; SGLang combines priority only with ``fcfs``/``lof``. Not modelled: the in-batch
prefix de-duplication that sends a request sharing a long prefix with another waiting one to the back
(the simulator has no token ids), and SGLang's fallback to FCFS when prefix caching is off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefillq.policies.base import Demand, Entry
from prefillq.policies.peers.sorted_list import SortedEachPassQueue

# Above this many waiting requests SGLang's hrrn (and lpm) stop sorting: the list keeps its last order,
# new requests join at the back (``SchedulePolicy._determine_active_policy``).
SORT_LIMIT = 128
PAGE_SIZE = 1  # SGLang's default page size; the chunk limit rounds to it


class SGLangHRRNQueue(SortedEachPassQueue):
    """``sglang_hrrn``: highest (P - P_at_arrival) / uncached first, the uncached length re-read every pass.

    A request with nothing left to compute goes first; ties by request id (as text). While more than
    ``SORT_LIMIT`` requests wait, the list is not sorted at all (the engine's FCFS fallback).
    """

    policy = "sglang_hrrn"

    def _sorts_this_pass(self) -> bool:
        return len(self) <= SORT_LIMIT

    def _sort_key(self, entry: Entry) -> tuple[float, str]:
        uncached = entry.view.remaining_prefill_tokens
        if uncached <= 0:
            return (-float("inf"), entry.key)
        waited = max(0, self.processed_tokens - entry.p_arrival)
        return (-(waited / uncached), entry.key)


def prefill_work(entry: Entry) -> int:
    """What SGLang's shortest-prefill-first ranks by: prompt plus output so far, less the cached tokens."""
    view = entry.view
    return max(1, view.prompt_tokens + view.output_tokens - view.cached_tokens)


class SGLangSPFQueue(SortedEachPassQueue):
    """``sglang_spf``: least prefill work first, re-read every pass, ties by arrival; no aging at all.

    SGLang also caps the running chunked prefill so that shorter waiting requests fit beside it
    (``shortest_prefill_chunk_limit``). That cap is :meth:`plan_step` here, so the simulator applies it
    where it plans partial prefills (``partial_prefills = "ordered"``); with ``"first"`` it is not modelled.
    """

    policy = "sglang_spf"

    def _sort_key(self, entry: Entry) -> tuple[int, int]:
        return (prefill_work(entry), entry.arrival)

    def plan_step(self, partials: Sequence[Any], budget: int, *, free_seats: int,
                  demand: Demand | None = None,
                  replan: Callable[[dict[str, int]], Demand | None] | None = None) -> dict[str, int]:
        """Each partial prefill's chunk, capped to leave room for the shorter requests waiting behind it."""
        self._flush_warning()
        if demand is None:
            demand = self._default_demand
        caps: dict[str, int] = {}
        for obj in partials:
            limit = self._chunk_limit(self._view(obj).remaining_prefill_tokens, budget)
            take = min(max(0, demand(obj, limit)), limit) if limit > 0 else 0
            caps[self._view(obj).request_id] = take
            budget -= take
        return caps

    def _chunk_limit(self, remaining: int, budget: int) -> int:
        """The budget less what the waiting requests shorter than ``remaining`` need, walked in order and
        stopping at the first that is not shorter or does not fit (one page is always left to the chunk)."""
        if budget < 2 * PAGE_SIZE:
            return budget
        reserved = 0
        for entry in self._waiting_in_order():
            work = prefill_work(entry)
            charge = -(-work // PAGE_SIZE) * PAGE_SIZE
            if work >= remaining or reserved + charge > budget - PAGE_SIZE:
                break
            reserved += charge
        return (budget - reserved) // PAGE_SIZE * PAGE_SIZE if reserved else budget
