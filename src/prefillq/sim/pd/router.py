"""The PD router: admission ordered by admission priority then arrival, pair choice (round-robin) and
opt-in busy-node retry, bounded by its timeout and applied only before a request's first token."""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Callable, Mapping
from typing import Any

from prefillq.sim.pd.nodes import ClientRequest, Pair, SegmentRequest
from prefillq.validation import check_number

BUSY_RETRY_ENV = "PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S"


def parse_busy_retry_timeout(value: Any, source: str = "busy retry timeout") -> float:
    """A busy-retry timeout in seconds (0 = retry disabled); ValueError naming ``source`` otherwise."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{source} must be a number of seconds (0 disables retry), got {value!r}") from None
    return check_number(f"{source} (seconds; 0 disables retry)", value)


def busy_retry_timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S`` (0 when unset or empty); ValueError for a bad value."""
    env = os.environ if environ is None else environ
    text = env.get(BUSY_RETRY_ENV, "")
    if not text.strip():
        return 0.0
    return parse_busy_retry_timeout(text, BUSY_RETRY_ENV)


class Router:
    """Admission (ordered by admission priority, then arrival), pair choice and opt-in busy retry."""

    def __init__(self, pairs: list[Pair], *, retry_timeout_s: float, prefill_waiting_limit: int | None,
                 wake: Callable[[float], None]) -> None:
        self.pairs = pairs
        self.retry_timeout_s = retry_timeout_s
        self.prefill_waiting_limit = prefill_waiting_limit
        self.wake = wake                                    # ask the event loop to call dispatch() at a time
        self.held: list[list[tuple[int, float, int, ClientRequest]]] = [[] for _ in pairs]  # per home pair
        self.retrying: list[tuple[int, float, int, ClientRequest]] = []  # heap: waiting for any pair
        self.pending = 0
        self.next_home = 0
        self.order = itertools.count()
        self.retried = 0
        self.held_count = 0
        self.max_hold_s = 0.0

    def accepting(self, pair: Pair) -> bool:
        limit = self.prefill_waiting_limit
        return limit is None or pair.prefill.waiting_count() < limit

    def busy(self, pair: Pair) -> bool:
        return not self.accepting(pair) or pair.decode.is_full()

    def arrive(self, client: ClientRequest, now: float) -> None:
        home = self.pairs[self.next_home % len(self.pairs)]
        self.next_home += 1
        client.home = home.index
        if self.retry_timeout_s > 0 and len(self.pairs) > 1 and self.busy(home):
            other = self._first_free(home)
            if other is not None:
                self._send(client, other, now)
                return
            client.retry_deadline_s = now + self.retry_timeout_s
            heapq.heappush(self.retrying, self._key(client))
            self.pending += 1
            self.wake(client.retry_deadline_s)
            return
        if self.accepting(home) and not self.held[home.index]:
            self._send(client, home, now)
        else:
            heapq.heappush(self.held[home.index], self._key(client))
            self.pending += 1

    def dispatch(self, now: float) -> None:
        """Send what the pairs can take now (called between events)."""
        if not self.pending:
            return
        for pair in self.pairs:
            queue = self.held[pair.index]
            while queue and self.accepting(pair):
                self.pending -= 1
                self._send(heapq.heappop(queue)[3], pair, now)
        if self.retrying:
            kept: list[tuple[int, float, int, ClientRequest]] = []
            while self.retrying:
                entry = heapq.heappop(self.retrying)
                client = entry[3]
                home = self.pairs[client.home]
                target = home if not self.busy(home) else self._first_free(home)
                if target is not None:
                    self.pending -= 1
                    self._send(client, target, now)
                elif now >= client.retry_deadline_s:  # the timeout bounds the retrying: go home
                    if self.accepting(home) and not self.held[home.index]:
                        self.pending -= 1
                        self._send(client, home, now)
                    else:
                        heapq.heappush(self.held[home.index], entry)
                else:
                    kept.append(entry)
            self.retrying = kept
            heapq.heapify(self.retrying)

    def _key(self, client: ClientRequest) -> tuple[int, float, int, ClientRequest]:
        return (client.spec.admission_priority, client.arrival_s, next(self.order), client)

    def _first_free(self, home: Pair) -> Pair | None:
        count = len(self.pairs)
        for offset in range(1, count):
            pair = self.pairs[(home.index + offset) % count]
            if not self.busy(pair):
                return pair
        return None

    def _send(self, client: ClientRequest, pair: Pair, now: float) -> None:
        if pair.index != client.home:
            client.retried = True
            self.retried += 1
        if now > client.arrival_s:
            self.held_count += 1
            self.max_hold_s = max(self.max_hold_s, now - client.arrival_s)
        client.pair = pair.index
        client.dispatched_s = now
        segment = SegmentRequest(client, 0, now)
        client.segments.append(segment)
        segment.prefill_node = pair.prefill
        pair.prefill.add_request(segment, now)
