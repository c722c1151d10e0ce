"""LightLLM-style re-ranking of a whole ready list once per step (SPEC §3.0), as an adapter.

An engine that keeps its admitted requests in one ready list calls :meth:`Ranker.rank` every step and
takes requests in that order. The ranker owns one :class:`PolicyQueue` and only keeps it in step with
the list: requests new to the list are added (so the queue binds their arrival state the first time it
sees them), and requests whose view changed since the last step (a chunk of their prefill ran, they
started decoding) are refreshed in place, keeping their history. A request gone from the list may come
back (a PD node waiting for its KV, a paused request): it is set aside, not forgotten, and returns as the
same request, with its place among the others, its arrival counter, its frozen cost and its first
enqueue time. The engine calls :meth:`Ranker.forget` when a request leaves for good. The order returned
is the queue's own dispatch order; every rule lives in the queue.

Setting aside and bringing back use the queue's own ``reordering`` contract (the requests keep their
waiting time, arrival and cost): a returning request is prepended together with every request that was
first seen before it, in first-seen order, which puts it back at its place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from prefillq.config import load_config
from prefillq.policies.base import MEMORY_LIMIT, Clock, PolicyQueue, View, identity_view
from prefillq.policies.registry import make_queue


def _snapshot(view: Any) -> tuple:
    """The parts of a request's view that can move it within a policy's order."""
    return (view.is_decode, view.priority, view.resumed, view.prompt_tokens, view.cached_tokens)


class Ranker:
    """Stateful ready-list ranker: ``rank(ready_list)`` each step, then ``on_prefill_submitted(n)``."""

    def __init__(self, config: Any, clock: Clock | None = None, view: View | None = None) -> None:
        self._view = view if view is not None else identity_view
        self.queue: PolicyQueue = make_queue(load_config(config), clock=clock, view=self._view)
        self.config = self.queue.config
        self._tracked: dict[str, tuple[Any, tuple]] = {}  # in the list at the last rank: (object, snapshot)
        self._away: OrderedDict[str, Any] = OrderedDict()  # left the list, may come back (oldest first)
        self._place: dict[str, int] = {}  # first-seen order of tracked and away requests
        self._next_place = 0

    @property
    def processed_tokens(self) -> int:
        return self.queue.processed_tokens

    def on_prefill_submitted(self, num_tokens: int) -> None:
        """End of a step: the engine submitted ``num_tokens`` tokens for execution."""
        self.queue.on_prefill_submitted(num_tokens)

    def forget(self, request: Any) -> None:
        """``request`` left the ready list for good (finished, aborted): drop what is kept for its return.

        Requests never forgotten are kept for at most ``MEMORY_LIMIT`` absences (the oldest go first)."""
        key = self._view(request).request_id
        known = self._tracked.pop(key, None)
        obj = self._away.pop(key, None) if known is None else known[0]
        if obj is not None or known is not None:
            self._place.pop(key, None)
            self.queue.remove_request(obj)  # outside reordering: the queue forgets it as well

    def rank(self, ready_list: Sequence[Any]) -> list[Any]:
        """A new list: decodes first in their order, then negative priority, then the policy's order."""
        queue, tracked, away = self.queue, self._tracked, self._away
        present: set[str] = set()
        returning: list[Any] = []
        for obj in ready_list:
            view = self._view(obj)
            key = view.request_id
            present.add(key)
            snapshot = _snapshot(view)
            known = tracked.get(key)
            if known is None:
                if key in away:
                    del away[key]
                    returning.append(obj)
                else:
                    queue.add_request(obj)
                    self._place[key] = self._next_place
                    self._next_place += 1
            elif known[1] != snapshot:
                queue.refresh_request(obj)
            tracked[key] = (obj, snapshot)
        if len(present) != len(tracked):
            self._set_aside([k for k in tracked if k not in present])
        if returning:
            self._bring_back(returning)
        return list(queue)

    def _set_aside(self, keys: list[str]) -> None:
        with self.queue.reordering():  # the queue remembers what a prepend restores
            for key in keys:
                obj = self._tracked.pop(key)[0]
                self.queue.remove_request(obj)
                self._away[key] = obj
        while len(self._away) > MEMORY_LIMIT:
            self.forget(next(iter(self._away.values())))

    def _bring_back(self, returning: list[Any]) -> None:
        """Prepend the returning requests and every queued one first seen before them, in first-seen order.

        Queue positions follow first-seen order (adds count up, prepends count down), so this puts each
        returning request back at its place and leaves every other request's order as it was."""
        place, view = self._place, self._view
        back = {view(obj).request_id for obj in returning}
        last = max(place[key] for key in back)
        earlier = [obj for key, (obj, _) in self._tracked.items() if place[key] < last and key not in back]
        moving = sorted(earlier + returning, key=lambda obj: place[view(obj).request_id], reverse=True)
        with self.queue.reordering():
            for obj in earlier:
                self.queue.remove_request(obj)
            self.queue.prepend_requests(moving)


def order(policy: Any, ready_list: Sequence[Any], *, clock: Clock | None = None,
          view: View | None = None) -> list[Any]:
    """One-shot LightLLM-style ordering of a ready list (a fresh :class:`Ranker`)."""
    return Ranker(policy, clock=clock, view=view).rank(ready_list)
