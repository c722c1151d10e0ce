"""``short_request_first`` (alias ``srf``): three FIFO lanes with aging (SPEC §3.4).

Dispatch order: immediate (resumed requests) > aged long > short > long. A long head is "aged" once it
has waited ``long_max_wait_ms`` since it first entered the queue and short requests are waiting. This is
the only policy that reads a clock, and only the one it was given.
"""

from __future__ import annotations

from typing import Any

from prefillq.policies.base import Entry, LazyHeap, PolicyQueue, logger

DEGRADATION_STREAK = 3


class ShortRequestFirstQueue(PolicyQueue):
    policy = "short_request_first"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = self.config.threshold
        self._max_wait_s = self.config.long_max_wait_ms / 1000.0
        self._lanes = {"immediate": LazyHeap(), "short": LazyHeap(), "long": LazyHeap()}
        self._aged_promotions = 0
        self._streak = 0
        self._warnings = 0

    def _lane_for(self, entry: Entry) -> str:
        if entry.view.resumed:
            return "immediate"
        return "short" if entry.view.prompt_tokens <= self._threshold else "long"

    def _insert_rest(self, entry: Entry) -> None:
        entry.lane = self._lane_for(entry)
        self._lanes[entry.lane].push((entry.seq, entry))

    def _delete_rest(self, entry: Entry) -> None:
        self._lanes[entry.lane].discard()
        if entry.lane == "short" and not self._lanes["short"].live:
            self._streak = 0

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

    def _on_dispatch(self, entry: Entry) -> None:
        if entry.lane == "short":
            self._streak = 0
        elif entry.lane == "long":
            if self._lanes["short"].live:  # a long request went ahead of waiting shorts: aged-long promotion
                self._aged_promotions += 1
                self._streak += 1
                if self._streak == DEGRADATION_STREAK:
                    self._warnings += 1
                    logger.warning(
                        "prefillq short_request_first: %d consecutive aged-long promotions while short "
                        "requests were waiting; the policy is favouring long requests. threshold=%d is "
                        "probably too small for this traffic: raise it (or disable the policy), then "
                        "revisit long_max_wait_ms=%g.",
                        self._streak, self._threshold, self.config.long_max_wait_ms)
            else:
                self._streak = 0

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
