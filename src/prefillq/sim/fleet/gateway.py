"""The gateway queue: requests wait at the router until a replica has a free in-flight slot.

It is the same policy queue the engines run (:func:`prefillq.make_queue`), holding the simulator's
requests; the gateway releases them in that policy's order. A released request is dispatched for good
(a gateway cannot call a request back), so short-first ordering here only decides *which* request
takes the next free slot. Each release round that dispatches anything ends a "step" for the queue:
``on_prefill_submitted`` gets the prompt tokens it sent, which is what ages requests in the
work-based policies (``hrrn``), as a replica's prefill does in an engine.

Priority classes (``RequestSpec.priority``, the client's class): the gateway is the operator's own
component, so it orders by class first (lower first) and by its policy inside a class, with strict tiers
(``policies/tiers.py``). Without classes (every request at 0) that is the policy's order alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefillq import make_queue
from prefillq.config import POLICIES, load_config
from prefillq.requests import QueuedRequest
from prefillq.sim.fleet.router import Replica, Router
from prefillq.sim.node import SimRequest, queue_view


def gateway_view(r: SimRequest) -> QueuedRequest:
    """What the gateway's queue sees: the engine's view with the request's class as its priority (a copy: the
    engine's own view of the request keeps its own priority)."""
    seen = queue_view(r)
    view = object.__new__(QueuedRequest)
    for name in QueuedRequest.__slots__:
        setattr(view, name, getattr(seen, name))
    view.priority = r.priority
    return view


class Gateway:
    """Holds requests in a policy queue; :meth:`release` dispatches while replicas have free slots."""

    def __init__(self, policy: Any, max_inflight_per_replica: int | None) -> None:
        self.now = 0.0
        config = load_config(policy)
        if config.policy in POLICIES:  # peers' emulations have no tiers: their own order only
            config = config.with_(priority_tiers=True)
        self.queue = make_queue(config, clock=lambda: self.now, view=gateway_view)
        self.limit = max_inflight_per_replica
        self.waits_s: list[float] = []   # arrival -> release, per released request
        self.max_held = 0

    @property
    def policy_name(self) -> str:
        return self.queue.policy

    def hold(self, r: SimRequest, now: float) -> None:
        self.now = now
        self.queue.add_request(r)
        if len(self.queue) > self.max_held:
            self.max_held = len(self.queue)

    def free(self, replicas: Sequence[Replica]) -> list[Replica]:
        """The replicas with a free in-flight slot (all of them without a limit)."""
        limit = self.limit
        if limit is None:
            return list(replicas)
        return [replica for replica in replicas if len(replica.inflight) < limit]

    def release(self, now: float, replicas: Sequence[Replica], router: Router, spec_of: Callable[[SimRequest], Any],
                dispatch: Callable[[SimRequest, Replica, float], None]) -> None:
        """Dispatch held requests, in the policy's order, while some replica has a free slot."""
        self.now = now
        queue = self.queue
        released = 0
        while queue:
            candidates = self.free(replicas)
            if not candidates:
                break
            r = queue.pop_request()
            self.waits_s.append(now - r.arrival_s)
            released += r.prompt_tokens
            dispatch(r, router.choose(r, spec_of(r), candidates), now)
        if released:
            queue.on_prefill_submitted(released)
