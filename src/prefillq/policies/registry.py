"""The registry: policy name -> queue class, and the one factory every engine uses."""

from __future__ import annotations

from typing import Any

from prefillq.config import PolicyConfig, load_config
from prefillq.policies.auto import AutoQueue
from prefillq.policies.base import Clock, PolicyQueue, View
from prefillq.policies.fcfs import FCFSQueue
from prefillq.policies.hrrn import HRRNQueue
from prefillq.policies.peers import PEER_QUEUES
from prefillq.policies.promote_shortest import PromoteShortestQueue
from prefillq.policies.short_first import ShortRequestFirstQueue
from prefillq.policies.tiers import Arrival, TiersQueue

QUEUES: dict[str, type[PolicyQueue]] = {
    "default": FCFSQueue,
    "promote_shortest": PromoteShortestQueue,
    "hrrn": HRRNQueue,
    "short_request_first": ShortRequestFirstQueue,
    "auto": AutoQueue,
    **PEER_QUEUES,  # other engines' options, for the simulator (docs/peers.md)
}


def make_queue(config: Any = None, *, clock: Clock | None = None, view: View | None = None,
               arrival: Arrival | None = None) -> PolicyQueue:
    """A queue for a policy name/alias, a config dict in any dialect, JSON text or a PolicyConfig.

    With ``priority_tiers`` the queue serves strict tiers of the request priority, the policy inside each
    (:class:`~prefillq.policies.tiers.TiersQueue`, the same contract); ``arrival`` (the engine's arrival
    time of a request) then orders ``default``'s tiers as vLLM's priority heap does. Other queues ignore it.
    """
    cfg: PolicyConfig = load_config(config)
    if cfg.priority_tiers:
        return TiersQueue(cfg, QUEUES[cfg.policy], clock=clock, view=view, arrival=arrival)  # type: ignore[return-value]
    return QUEUES[cfg.policy](cfg, clock=clock, view=view)
