"""The fleet's routers: which replica a request goes to (round-robin, least outstanding tokens, prefix affinity).

A router sees each replica's *outstanding tokens*: the tokens the replica still has to compute for the
requests it holds, i.e. the prompt tokens not yet prefilled plus the output tokens not yet decoded
(:func:`outstanding_tokens`). A router is told each request's output length, standing for the
``max_tokens`` a real client sends. The count is read at the routing instant from the replica's
requests; a replica's step is computed when it starts, so a request in a step that is still running
counts as if that step had ended (at most one step of look-ahead).

Every router picks among the replicas it is offered (a gateway with an in-flight limit offers only the
replicas with a free slot); ties go to the lowest replica index, so runs are deterministic.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from prefillq.sim.node import DECODE, FINISHED, SimRequest

ROUTERS = ("round_robin", "least_outstanding_tokens", "prefix_affinity")
DEFAULT_AFFINITY_LOAD_CAP = 1.5


def request_outstanding_tokens(r: SimRequest, node: Any = None) -> int:
    """Tokens ``r`` still needs: unprefilled prompt (after a preemption, its recompute) plus undecoded output.
    ``node`` (the one ``r`` runs on) counts a decode's output after the steps it has computed."""
    if r.status == FINISHED:
        return 0
    if r.status == DECODE:
        return max(0, r.output_tokens - node.outputs_before(r, node.step_index))
    return (r.target - r.num_computed) + (r.output_tokens - r.num_output)


class Replica:
    """One engine replica as the router and the gateway see it: the node and the requests it holds."""

    __slots__ = ("finished", "index", "inflight", "node", "routed", "routed_tokens")

    def __init__(self, index: int, node: Any) -> None:
        self.index = index
        self.node = node
        self.inflight: dict[str, SimRequest] = {}  # dispatched here and not finished, in dispatch order
        self.routed = 0
        self.routed_tokens = 0
        self.finished = 0

    def outstanding_tokens(self) -> int:
        """The replica's outstanding tokens (see the module docstring)."""
        node = self.node
        return sum(request_outstanding_tokens(r, node) for r in self.inflight.values())


def affinity_key(r: SimRequest, spec: Any) -> str:
    """What ties a request to a replica: its trace's session (or first prefix hash), else its own id."""
    session = getattr(spec, "session", None)
    return str(session) if session is not None else r.request_id


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's ``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))


class Router:
    """Base: ``choose(request, spec, candidates)`` returns one of ``candidates`` (never empty)."""

    name = ""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = list(replicas)

    def choose(self, r: SimRequest, spec: Any, candidates: Sequence[Replica]) -> Replica:
        raise NotImplementedError


class RoundRobin(Router):
    """Replicas in turn; with a gateway, the next replica in turn that has a free slot."""

    name = "round_robin"

    def __init__(self, replicas: Sequence[Replica]) -> None:
        super().__init__(replicas)
        self.next_index = 0

    def choose(self, r: SimRequest, spec: Any, candidates: Sequence[Replica]) -> Replica:
        count = len(self.replicas)
        offered = {c.index for c in candidates}
        for offset in range(count):
            index = (self.next_index + offset) % count
            if index in offered:
                self.next_index = index + 1
                return self.replicas[index]
        raise ValueError("no candidate replica")


class LeastOutstandingTokens(Router):
    """The replica with the fewest outstanding tokens (pending prefill plus undecoded output)."""

    name = "least_outstanding_tokens"

    def choose(self, r: SimRequest, spec: Any, candidates: Sequence[Replica]) -> Replica:
        return min(candidates, key=lambda replica: (replica.outstanding_tokens(), replica.index))


class PrefixAffinity(Router):
    """Session / prefix affinity with a bounded load (consistent hashing with bounded loads).

    A request's home replica is a stable hash of its session (else its own id) modulo the replica count.
    It goes home unless that would put the home replica over ``load_cap`` times the fleet's mean
    outstanding tokens (counting the request itself; an idle replica always takes it); then to the
    next replica after home, in index order, that stays under the cap, else to the least loaded.
    """

    name = "prefix_affinity"

    def __init__(self, replicas: Sequence[Replica], load_cap: float = DEFAULT_AFFINITY_LOAD_CAP) -> None:
        super().__init__(replicas)
        self.load_cap = load_cap
        self.sent_home = 0
        self.overflowed = 0

    def choose(self, r: SimRequest, spec: Any, candidates: Sequence[Replica]) -> Replica:
        count = len(self.replicas)
        home = stable_hash(affinity_key(r, spec)) % count
        loads = {replica.index: replica.outstanding_tokens() for replica in self.replicas}
        own = request_outstanding_tokens(r)
        cap = self.load_cap * (sum(loads.values()) + own) / count
        offered = {c.index for c in candidates}
        for offset in range(count):
            index = (home + offset) % count
            if index in offered and (loads[index] == 0 or loads[index] + own <= cap):
                if offset == 0:
                    self.sent_home += 1
                else:
                    self.overflowed += 1
                return self.replicas[index]
        self.overflowed += 1
        return min(candidates, key=lambda replica: (loads[replica.index], replica.index))


def make_router(name: str, replicas: Sequence[Replica], *, load_cap: float = DEFAULT_AFFINITY_LOAD_CAP) -> Router:
    """A router by name (:data:`ROUTERS`); ValueError naming the valid ones otherwise."""
    if name == "round_robin":
        return RoundRobin(replicas)
    if name == "least_outstanding_tokens":
        return LeastOutstandingTokens(replicas)
    if name == "prefix_affinity":
        return PrefixAffinity(replicas, load_cap)
    raise ValueError(f"unknown router {name!r}; valid routers: {', '.join(ROUTERS)}")
