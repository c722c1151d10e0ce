"""Fleets: many engine replicas behind a router, optionally with a gateway queue in front (docs/fleet.md).

``router.py`` holds the replicas' view and the routers (``round_robin``, ``least_outstanding_tokens``,
``prefix_affinity``), ``gateway.py`` the gateway queue (the same policy queues the engines run),
``system.py`` the settings (:class:`FleetConfig`) and the event loop (:class:`FleetSystem`).

    simulate(workload, "hrrn", fleet=FleetConfig(replicas=4, router="least_outstanding_tokens"))
"""

from prefillq.sim.fleet.gateway import Gateway
from prefillq.sim.fleet.router import (
    DEFAULT_AFFINITY_LOAD_CAP,
    ROUTERS,
    LeastOutstandingTokens,
    PrefixAffinity,
    Replica,
    RoundRobin,
    Router,
    make_router,
    request_outstanding_tokens,
)
from prefillq.sim.fleet.system import FleetConfig, FleetSystem

__all__ = ["DEFAULT_AFFINITY_LOAD_CAP", "ROUTERS", "FleetConfig", "FleetSystem", "Gateway", "LeastOutstandingTokens",
           "PrefixAffinity", "Replica", "RoundRobin", "Router", "make_router", "request_outstanding_tokens"]
