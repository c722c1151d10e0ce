"""LightLLM-style re-ranking of a whole ready list once per step (SPEC §3.0), as an adapter.

An engine that keeps its admitted requests in one ready list calls :meth:`Ranker.rank` every step and
takes requests in that order. The ranker owns one :class:`PolicyQueue` and only keeps it in step with
the list: requests new to the list are added (so the queue binds their arrival state the first time it
sees them), requests gone from it are removed, and requests whose view changed since the last step (a
chunk of their prefill ran, they started decoding) are refreshed in place, keeping their history. The
order returned is the queue's own dispatch order; every rule lives in the queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefillq.config import load_config
from prefillq.policies.base import Clock, PolicyQueue, View, identity_view
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
        self._tracked: dict[str, tuple[Any, tuple]] = {}

    @property
    def processed_tokens(self) -> int:
        return self.queue.processed_tokens

    def on_prefill_submitted(self, num_tokens: int) -> None:
        """End of a step: the engine submitted ``num_tokens`` prefill tokens for execution."""
        self.queue.on_prefill_submitted(num_tokens)

    def rank(self, ready_list: Sequence[Any]) -> list[Any]:
        """A new list: decodes first in their order, then negative priority, then the policy's order."""
        queue, tracked = self.queue, self._tracked
        present: set[str] = set()
        for obj in ready_list:
            view = self._view(obj)
            key = view.request_id
            present.add(key)
            snapshot = _snapshot(view)
            known = tracked.get(key)
            if known is None:
                queue.add_request(obj)
            elif known[1] != snapshot:
                queue.refresh_request(obj)
            tracked[key] = (obj, snapshot)
        if len(present) != len(tracked):
            for key in [k for k in tracked if k not in present]:
                queue.remove_request(tracked.pop(key)[0])
        return list(queue)


def order(policy: Any, ready_list: Sequence[Any], *, clock: Clock | None = None,
          view: View | None = None) -> list[Any]:
    """One-shot LightLLM-style ordering of a ready list (a fresh :class:`Ranker`)."""
    return Ranker(policy, clock=clock, view=view).rank(ready_list)
