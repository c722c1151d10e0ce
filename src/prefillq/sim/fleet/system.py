"""The fleet: N engine replicas behind a router, optionally with a gateway queue, driven by one event loop.

    simulate(workload, "hrrn", fleet=FleetConfig(replicas=4, router="least_outstanding_tokens"))
    simulate(workload, "default", fleet=FleetConfig(replicas=4, gateway_policy="short_request_first",
                                                   max_inflight_per_replica=8))

Each replica is an ordinary engine node (``sim/vllm.py`` or ``sim/lightllm.py``) running the policy.
The loop is the single-engine loop of ``sim/simulator.py`` over many nodes (the pattern of
``sim/pd/system.py``): arrivals join (through the router, or the gateway) between steps, a free node
with work starts its next step at once, and an idle fleet jumps to the next arrival. With one replica
and no gateway limit, every router reproduces ``simulate(..)`` without a fleet exactly.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from prefillq.config import load_config
from prefillq.metrics import RequestRecord, percentile, summarize
from prefillq.sim.fleet.gateway import Gateway
from prefillq.sim.fleet.router import DEFAULT_AFFINITY_LOAD_CAP, ROUTERS, Replica, make_router
from prefillq.sim.node import SimRequest, SimulationError
from prefillq.validation import check_choice, check_int, check_number, settings_from
from prefillq.workload import Workload


@dataclass(frozen=True)
class FleetConfig:
    """How the fleet is built.

    ``gateway_policy`` None means no gateway queue (requests go to a replica as they arrive);
    otherwise requests wait at the gateway, in that policy's order, until a replica has fewer than
    ``max_inflight_per_replica`` requests in flight (None: no limit, so nothing ever waits there).
    ``affinity_load_cap`` is the ``prefix_affinity`` router's bound (times the mean outstanding tokens).
    """

    replicas: int = 1
    router: str = "round_robin"
    gateway_policy: Any = None
    max_inflight_per_replica: int | None = None
    affinity_load_cap: float = DEFAULT_AFFINITY_LOAD_CAP

    def __post_init__(self) -> None:
        check_int("replicas", self.replicas, minimum=1)
        check_choice("router", self.router, ROUTERS)
        if self.max_inflight_per_replica is not None:
            check_int("max_inflight_per_replica", self.max_inflight_per_replica, minimum=1)
        check_number("affinity_load_cap", self.affinity_load_cap, strict=True)
        if self.affinity_load_cap < 1:
            raise ValueError(f"affinity_load_cap must be >= 1, got {self.affinity_load_cap!r}")
        if self.gateway_policy is not None:
            load_config(self.gateway_policy)  # ConfigError (a ValueError) for an unknown policy

    @classmethod
    def from_value(cls, value: FleetConfig | Mapping[str, Any] | None) -> FleetConfig:
        """A FleetConfig from itself, a dict of its fields, or None (one replica, no gateway)."""
        return settings_from(cls, value, "fleet settings", "fleet")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.gateway_policy is not None:
            data["gateway_policy"] = load_config(self.gateway_policy).to_dict()
        return data


class FleetSystem:
    """Router (+ optional gateway) in front of ``config.replicas`` engine nodes, and the loop that drives them."""

    def __init__(self, make_engine: Callable[[], Any], config: FleetConfig, *,
                 frontend: tuple[float, float] = (0.0, 0.0)) -> None:
        self.config = config
        self.frontend = frontend  # the profile's (frontend_s, frontend_per_seq_s): time outside the steps
        self.replicas = [Replica(index, make_engine()) for index in range(config.replicas)]
        for replica in self.replicas:
            replica.node.on_finish = self._finisher(replica.index)
        self.router = make_router(config.router, self.replicas, load_cap=config.affinity_load_cap)
        self.gateway = (Gateway(config.gateway_policy, config.max_inflight_per_replica)
                        if config.gateway_policy is not None else None)
        self.finishing: list[list[SimRequest]] = [[] for _ in self.replicas]  # finished in a running step
        self.assignment: list[int] = []
        self.requests: list[SimRequest] = []
        self.tables: list[Any] = []  # per replica: its SimRecords (the rows of the requests it served)
        self.finished = 0
        self._specs: dict[int, Any] = {}

    def _finisher(self, index: int) -> Callable[[SimRequest], None]:
        def on_finish(r: SimRequest) -> None:
            self.tables[index].finish(r)
            self.finishing[index].append(r)
        return on_finish

    def _spec_of(self, r: SimRequest) -> Any:
        return self._specs[id(r)]

    def _dispatch(self, r: SimRequest, replica: Replica, now: float) -> None:
        replica.inflight[r.request_id] = r
        replica.routed += 1
        replica.routed_tokens += r.prompt_tokens + r.output_tokens
        self.assignment[r.index] = replica.index
        replica.node.add_request(r, now)

    def _arrive(self, r: SimRequest, now: float) -> None:
        if self.gateway is not None:
            self.gateway.hold(r, now)
            self.gateway.release(now, self.replicas, self.router, self._spec_of, self._dispatch)
        else:
            self._dispatch(r, self.router.choose(r, self._spec_of(r), self.replicas), now)

    def _step_ended(self, index: int) -> None:
        replica = self.replicas[index]
        for r in self.finishing[index]:
            del replica.inflight[r.request_id]
            replica.finished += 1
            self.finished += 1
        self.finishing[index].clear()

    def run(self, workload: Workload, template_tokens: int = 0,
            progress: Callable[[float], None] | None = None) -> list[SimRequest]:
        """Simulate ``workload``; return its requests (in workload order) as the nodes left them."""
        from prefillq.sim.records import SimRecords

        specs = list(workload.requests)
        self.tables = [SimRecords(specs, replica.node.step_end_s, *self.frontend) for replica in self.replicas]
        requests = self.requests = [SimRequest(spec, template_tokens, i) for i, spec in enumerate(specs)]
        self._specs = {id(r): spec for r, spec in zip(requests, specs, strict=True)}
        self.assignment = [-1] * len(requests)
        total = len(requests)
        ends: list[tuple[float, int, int]] = []   # (step end, order, replica index) of running steps
        order = itertools.count()
        busy = [False] * len(self.replicas)
        next_arrival = 0
        reported = 0
        now = 0.0
        while True:
            t = requests[next_arrival].arrival_s if next_arrival < total else math.inf
            if ends and ends[0][0] < t:
                t = ends[0][0]
            if t == math.inf:
                break
            now = max(now, t)
            while next_arrival < total and requests[next_arrival].arrival_s <= now:
                self._arrive(requests[next_arrival], requests[next_arrival].arrival_s)
                next_arrival += 1
            while ends and ends[0][0] <= now:
                index = heapq.heappop(ends)[2]
                busy[index] = False
                self._step_ended(index)
            if self.gateway is not None:
                self.gateway.release(now, self.replicas, self.router, self._spec_of, self._dispatch)
            for replica in self.replicas:
                if not busy[replica.index] and replica.node.has_work():
                    end = replica.node.step(now)
                    if end is not None:
                        busy[replica.index] = True
                        heapq.heappush(ends, (end, next(order), replica.index))
            if progress is not None and self.finished - reported >= 256:
                reported = self.finished
                progress(reported / max(1, total))
        if self.finished < total:
            held = len(self.gateway.queue) if self.gateway is not None else 0
            raise SimulationError(f"the fleet stopped with {total - self.finished} unfinished requests "
                                  f"({held} held at the gateway): a replica has waiting requests but cannot "
                                  "schedule any of them")
        return requests

    # --- results ------------------------------------------------------------------------------------

    def records(self) -> list[RequestRecord]:
        """One record per request, in workload order, read from the table of the replica that served it
        (a request never dispatched reads as not finished)."""
        tables = self.tables
        return [tables[max(replica, 0)][position] for position, replica in enumerate(self.assignment)]

    def stats(self, records: list[RequestRecord]) -> dict[str, Any]:
        """Per-replica load, imbalance, router and gateway figures (the ``fleet`` part of a result)."""
        per_replica = []
        for replica in self.replicas:
            mine = [records[p] for p, index in enumerate(self.assignment) if index == replica.index]
            summary = summarize(mine)
            node = replica.node
            per_replica.append({
                "replica": replica.index, "requests": replica.routed, "routed_tokens": replica.routed_tokens,
                "steps": node.step_index, "preemptions": node.preemption_count,
                "peak_waiting": max((point[1] for point in node.timeline), default=0),
                "short_ttft_p50_ms": summary.get("short_ttft_p50_ms"),
                "short_ttft_p95_ms": summary.get("short_ttft_p95_ms"),
                "long_ttft_p95_ms": summary.get("long_ttft_p95_ms"),
                "summary": summary,
            })
        tokens = [replica.routed_tokens for replica in self.replicas]
        mean_tokens = sum(tokens) / len(tokens)
        stats: dict[str, Any] = {
            **self.config.to_dict(),
            "token_imbalance": max(tokens) / mean_tokens if mean_tokens else 1.0,
            "request_imbalance": (max(r.routed for r in self.replicas) * len(self.replicas)
                                  / max(1, sum(r.routed for r in self.replicas))),
            "per_replica": per_replica,
        }
        if hasattr(self.router, "overflowed"):
            stats["affinity_sent_home"] = self.router.sent_home
            stats["affinity_overflowed"] = self.router.overflowed
        if self.gateway is not None:
            waits = self.gateway.waits_s
            stats["gateway"] = {
                "policy": self.gateway.policy_name,
                "held": sum(1 for wait in waits if wait > 0), "max_held": self.gateway.max_held,
                "wait_ms_p50": _ms(percentile(waits, 50)), "wait_ms_p95": _ms(percentile(waits, 95)),
                "wait_ms_max": _ms(max(waits, default=None)),
            }
        return stats


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0
