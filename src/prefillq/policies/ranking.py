"""LightLLM-style re-ranking of a whole ready list once per step (SPEC §3.0).

An engine that keeps decodes and prefills in one ready list calls :meth:`Ranker.rank` every step and
takes requests in that order. The ranker keeps the little state the policies need between steps (the
processed-prefill counter, when each request was first seen, its frozen HRRN cost) and sorts naively;
for requests that are all new it gives exactly the order a fresh queue would dispatch them in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cmp_to_key
from typing import Any

from prefillq.config import PolicyConfig
from prefillq.policies.base import Clock, View, identity_view


class _Seen:
    __slots__ = ("cost", "first_seen_at", "order", "p_arrival")

    def __init__(self, order: int, p_arrival: int, cost: int, first_seen_at: float) -> None:
        self.order = order
        self.p_arrival = p_arrival
        self.cost = cost
        self.first_seen_at = first_seen_at


class Ranker:
    """Stateful ready-list ranker: ``rank(ready_list)`` each step, then ``on_prefill_submitted(n)``."""

    def __init__(self, config: PolicyConfig, clock: Clock | None = None, view: View | None = None) -> None:
        self.config = config
        self._clock = clock if clock is not None else time.monotonic
        self._view = view if view is not None else identity_view
        self.processed_tokens = 0
        self._seen: dict[str, _Seen] = {}
        self._next_order = 0

    def on_prefill_submitted(self, num_tokens: int) -> None:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative int, got {num_tokens!r}")
        self.processed_tokens += num_tokens

    def rank(self, ready_list: Sequence[Any]) -> list[Any]:
        """A new list: decodes first in their order, then negative priority, then the policy's order."""
        views = [self._view(obj) for obj in ready_list]
        now = self._clock()
        present = set()
        for view in views:
            present.add(view.request_id)
            if view.request_id not in self._seen:
                self._seen[view.request_id] = _Seen(self._next_order, self.processed_tokens,
                                                    max(1, view.prompt_tokens - view.cached_tokens), now)
                self._next_order += 1
        for key in [k for k in self._seen if k not in present]:
            del self._seen[key]

        items = list(zip(ready_list, views, strict=True))
        decodes = [pair for pair in items if pair[1].is_decode]
        prefills = [pair for pair in items if not pair[1].is_decode]
        policy = self.config.policy
        if policy == "default":
            prefills.sort(key=lambda pair: pair[1].priority)
            ranked = prefills
        else:
            elevated = sorted((p for p in prefills if p[1].priority < 0), key=lambda pair: pair[1].priority)
            rest = [p for p in prefills if p[1].priority >= 0]
            ranked = elevated + getattr(self, f"_rank_{policy}")(rest, now)
        return [obj for obj, _ in decodes] + [obj for obj, _ in ranked]

    def _rank_promote_shortest(self, rest: list, now: float) -> list:
        if not rest:
            return rest
        shortest = min(range(len(rest)), key=lambda i: (rest[i][1].remaining_prefill_tokens, i))
        return [rest[shortest], *rest[:shortest], *rest[shortest + 1:]]

    def _rank_hrrn(self, rest: list, now: float) -> list:
        counter = self.processed_tokens
        seen = self._seen

        def compare(a: tuple, b: tuple) -> int:
            sa, sb = seen[a[1].request_id], seen[b[1].request_id]
            left = (counter - sa.p_arrival) * sb.cost
            right = (counter - sb.p_arrival) * sa.cost
            if left != right:
                return -1 if left > right else 1
            return -1 if (sa.order, a[1].request_id) < (sb.order, b[1].request_id) else 1

        return sorted(rest, key=cmp_to_key(compare))

    def _rank_short_request_first(self, rest: list, now: float) -> list:
        threshold = self.config.threshold
        max_wait_s = self.config.long_max_wait_ms / 1000.0
        immediate = [p for p in rest if p[1].resumed]
        short = [p for p in rest if not p[1].resumed and p[1].prompt_tokens <= threshold]
        long = [p for p in rest if not p[1].resumed and p[1].prompt_tokens > threshold]
        ranked = immediate
        i = j = 0
        while i < len(short) or j < len(long):
            aged = (j < len(long) and max_wait_s > 0
                    and now - self._seen[long[j][1].request_id].first_seen_at >= max_wait_s)
            if j < len(long) and (i >= len(short) or aged):
                ranked.append(long[j])
                j += 1
            else:
                ranked.append(short[i])
                i += 1
        return ranked


def order(policy: Any, ready_list: Sequence[Any], *, clock: Clock | None = None,
          view: View | None = None) -> list[Any]:
    """One-shot LightLLM-style ordering of a ready list (a fresh :class:`Ranker`)."""
    from prefillq.config import load_config

    return Ranker(load_config(policy), clock=clock, view=view).rank(ready_list)
