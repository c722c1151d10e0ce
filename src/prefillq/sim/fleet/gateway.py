"""The gateway queue: requests wait at the router until a replica has a free in-flight slot.

It is the same policy queue the engines run (:func:`prefillq.make_queue`), holding the simulator's
requests; the gateway releases them in that policy's order. A released request is dispatched for good
(a gateway cannot call a request back), so short-first ordering here only decides *which* request
takes the next free slot. Each release round that dispatches anything ends a "step" for the queue:
``on_prefill_submitted`` gets the prompt tokens it sent, which is what ages requests in the
work-based policies (``hrrn``), as a replica's prefill does in an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefillq import make_queue
from prefillq.sim.fleet.router import Replica, Router
from prefillq.sim.node import SimRequest, queue_view


class Gateway:
    """Holds requests in a policy queue; :meth:`release` dispatches while replicas have free slots."""

    def __init__(self, policy: Any, max_inflight_per_replica: int | None) -> None:
        self.now = 0.0
        self.queue = make_queue(policy, clock=lambda: self.now, view=queue_view)
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
