"""``short_request_first`` (alias ``srf``): three FIFO lanes with aging (SPEC §3.4).

Dispatch order: immediate (resumed requests) > aged long > short > long. A long head is "aged" once it
has waited ``long_max_wait_ms`` since it first entered the queue and short requests are waiting. This is
the only policy that reads a clock, and only the one it was given.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue, merge_ordered

DEGRADATION_STREAK = 3


class ShortRequestFirstQueue(PolicyQueue):
    policy = "short_request_first"
    returning_first = False  # its immediate lane takes every resumed request, first (SPEC §3.4)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = self.config.threshold
        self._max_wait_s = self.config.long_max_wait_ms / 1000.0
        self._lanes = {"immediate": LazyHeap(), "short": LazyHeap(), "long": LazyHeap()}
        self._aged_promotions = 0
        self._streak = 0
        self._warnings = 0
        # This step's streak events in order, (request id, extends), so that undoing one pop
        # (a skip, SPEC §3.0) can replay the rest from the step's starting streak.
        self._events: list[tuple[str, bool]] = []
        self._streak_at_step_start = 0
        self._warnings_at_step_start = 0
        self._plan_now = 0.0
        self._aged_partials: set[str] = set()  # partial prefills whose aged-long promotion was counted

    def _lane_for(self, entry: Entry) -> str:
        if entry.view.resumed:
            return "immediate"
        return "short" if entry.view.prompt_tokens <= self._threshold else "long"

    def _partial_lane(self, entry: Entry) -> str:
        # SPEC §3.6: by prompt length, never "immediate" (a partial prefill keeps its KV blocks).
        return "short" if entry.view.prompt_tokens <= self._threshold else "long"

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = self._lane_for(entry)
        self._lanes[entry.lane].push((entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._lanes[entry.lane].discard()
        if entry.lane == "short" and not self._lanes["short"].live:
            # Keyed by the request, so that if this was a pop that comes back, the reset goes too.
            self._record_event(entry.key, extends=False)

    def _long_head_aged(self, head: Entry, now: float) -> bool:
        return self._max_wait_s > 0 and now - head.enqueued_at >= self._max_wait_s

    def _choose_rest(self) -> Entry | None:
        immediate, short, long = self._lanes["immediate"], self._lanes["short"], self._lanes["long"]
        if immediate.live:
            return immediate.top()
        if short.live and long.live and self._max_wait_s > 0:
            head = long.top()
            if self._long_head_aged(head, self._clock()):
                return head
        if short.live:
            return short.top()
        return long.top()

    def _on_dispatch(self, entry: Entry) -> bool:
        """Returns whether this pop counted as an aged-long promotion."""
        if entry.lane == "short":
            self._record_event(entry.key, extends=False)
        elif entry.lane == "long":
            aged = bool(self._lanes["short"].live)  # a long request went ahead of waiting shorts
            self._long_dispatched(entry.key, aged)
            return aged
        return False

    def _long_dispatched(self, key: str, aged: bool) -> None:
        self._aged_promotions += aged
        warnings = self._warnings
        self._record_event(key, extends=aged)
        if self._warnings > warnings:
            self._warn_after_this_pop(
                key,
                "prefillq short_request_first: %d consecutive aged-long promotions while short "
                "requests were waiting; the policy is favouring long requests. threshold=%d is "
                "probably too small for this traffic: raise it (or disable the policy), then "
                "revisit long_max_wait_ms=%g.",
                self._streak, self._threshold, self.config.long_max_wait_ms)

    def _record_event(self, key: str, *, extends: bool) -> None:
        self._events.append((key, extends))
        self._apply(extends)

    def _apply(self, extends: bool) -> None:
        self._streak = self._streak + 1 if extends else 0
        if self._streak == DEGRADATION_STREAK:
            self._warnings += 1

    def _undo_dispatch(self, key: str, token: bool) -> None:
        self._aged_promotions -= token
        self._events = [event for event in self._events if event[0] != key]
        self._streak, self._warnings = self._streak_at_step_start, self._warnings_at_step_start
        for _, extends in self._events:
            self._apply(extends)

    def _on_step(self) -> None:
        self._events.clear()
        self._streak_at_step_start, self._warnings_at_step_start = self._streak, self._warnings

    # --- planning with partial prefills (SPEC §3.6) ---

    def _plan_begin(self, partials: list[Entry]) -> None:
        self._plan_now = self._clock()
        self._aged_partials.intersection_update(e.key for e in partials)

    def _rank_class(self, entry: Entry) -> int:
        """immediate 0 < aged long 1 < short 2 < long 3 (aged longs are a prefix of the long lane)."""
        if entry.lane == "immediate":
            return 0
        if entry.lane == "short":
            return 2
        return 1 if self._long_head_aged(entry, self._plan_now) else 3

    def _rest_before(self, a: Entry, b: Entry) -> bool:
        return (self._rank_class(a), a.seq) < (self._rank_class(b), b.seq)

    def _rest_in_order(self) -> Iterator[Entry]:
        lanes = self._lanes
        return chain(lanes["immediate"].ordered(),
                     merge_ordered(lanes["short"].ordered(), lanes["long"].ordered(), self._rest_before))

    def _on_partial_planned(self, entry: Entry) -> None:
        """A partial long prefill aged ahead of waiting shorts is an aged-long promotion, once per request."""
        if (entry.lane == "long" and entry.key not in self._aged_partials and self._lanes["short"].live
                and self._long_head_aged(entry, self._plan_now)):
            self._aged_partials.add(entry.key)
            self._long_dispatched(entry.key, True)

    def _rest_dispatch_iter(self) -> Iterator[Entry]:
        lanes = self._lanes
        yield from lanes["immediate"].ordered()
        now = self._clock()
        shorts, longs = lanes["short"].ordered(), lanes["long"].ordered()
        short, long = next(shorts, None), next(longs, None)
        while short is not None or long is not None:
            if long is not None and (short is None or self._long_head_aged(long, now)):
                yield long
                long = next(longs, None)
            else:
                yield short
                short = next(shorts, None)

    def _rest_order(self) -> list[Entry]:
        lanes = {name: sorted((e for e in self._entries.values() if e.lane == name), key=lambda e: e.seq)
                 for name in self._lanes}
        order = list(lanes["immediate"])
        short, long = lanes["short"], lanes["long"]
        now = self._clock()
        i = j = 0
        while i < len(short) or j < len(long):
            if j < len(long) and (i >= len(short) or self._long_head_aged(long[j], now)):
                order.append(long[j])
                j += 1
            else:
                order.append(short[i])
                i += 1
        return order

    def _policy_stats(self) -> dict[str, Any]:
        return {"aged_long_promotions": self._aged_promotions, "degradation_streak": self._streak,
                "degradation_warnings": self._warnings}

    def _lane_names(self) -> tuple[str, ...]:
        return ("immediate", "short", "long")
