"""Strict priority tiers (policies/tiers.py, SPEC §4.1 "Priority mode") against naive reference models.

The reference for every policy is a plain sort by (tier, the policy's own order inside the tier), where the
order inside a tier is the naive model of tests/reference.py run on that tier's requests alone (at
priority 0) with the one processed-token counter. For ``default`` the reference is vLLM's priority heap:
(priority, arrival), a prepended request back at the place its arrival gives it.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, make_queue
from prefillq.config import ConfigError, load_config, validate_deployment
from prefillq.policies import TiersQueue
from tests.reference import RefQueue

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto"]
TIERS = [0, 0, 0, 1, 1, 2, -1, 7]


class RefDefaultTier(RefQueue):
    """vLLM's priority heap inside one priority value: by arrival (kept across pop and prepend)."""

    def order(self, items=None):
        items = self.items if items is None else items
        decodes = sorted((i for i in items if i.req.is_decode), key=lambda i: i.seq)
        return decodes + sorted((i for i in items if not i.req.is_decode), key=lambda i: (i.arrival, i.seq))


class RefTiers:
    """The naive model: one reference queue per tier, the tiers in ascending order, one counter."""

    def __init__(self, policy: str, threshold: int, wait_ms: float, clock) -> None:
        self.policy, self.threshold, self.wait_ms, self.clock = policy, threshold, wait_ms, clock
        self.tiers: dict[float, RefQueue] = {}
        self.P = 0
        self.pinned: float | None = None
        self.original: dict[str, QueuedRequest] = {}
        self.popped_from: dict[str, float] = {}

    @staticmethod
    def tier_of(req: QueuedRequest) -> float:
        return -math.inf if req.is_decode else req.priority

    def _ref(self, tier: float) -> RefQueue:
        if tier not in self.tiers:
            kind = RefDefaultTier if self.policy == "default" else RefQueue
            ref = kind(self.policy, self.threshold, self.wait_ms, clock=self.clock)
            ref.P = self.P
            self.tiers[tier] = ref
        return self.tiers[tier]

    def _touch(self, tier: float) -> None:
        if self.pinned is not None and self.pinned != tier:
            self.tiers[self.pinned].pinned = None
        self.pinned = None

    def _inner(self, req: QueuedRequest) -> QueuedRequest:
        self.original[req.request_id] = req
        return dataclasses.replace(req, priority=0)

    def add(self, req: QueuedRequest) -> None:
        tier = self.tier_of(req)
        self._ref(tier).add(self._inner(req))
        self._touch(tier)

    def prepend(self, req: QueuedRequest) -> None:
        tier = self.tier_of(req)
        self._ref(tier).prepend(self._inner(req))
        self._touch(tier)

    def skip(self, req: QueuedRequest) -> None:
        tier = self.popped_from.get(req.request_id)
        if tier is not None:
            self.tiers[tier].skip(req)

    def remove(self, req: QueuedRequest) -> None:
        tier = self.tier_of(req)
        self._ref(tier).remove(req.request_id)
        self._touch(tier)

    def top(self) -> float:
        return self.pinned if self.pinned is not None else min(t for t, r in self.tiers.items() if r.items)

    def peek(self) -> QueuedRequest:
        self.pinned = self.top()
        return self.original[self.tiers[self.pinned].peek().request_id]

    def pop(self) -> QueuedRequest:
        tier = self.top()
        self.pinned = None
        got = self.original[self.tiers[tier].pop().request_id]
        self.popped_from[got.request_id] = tier
        return got

    def step(self, tokens: int) -> None:
        self.P += tokens
        for ref in self.tiers.values():
            ref.step(tokens)
        self.pinned = None
        self.popped_from.clear()

    def size(self) -> int:
        return sum(len(r.items) for r in self.tiers.values())

    def order(self) -> list[str]:
        out = []
        for tier in sorted(self.tiers):
            out.extend(item.req.request_id for item in self.tiers[tier].order())
        return out

    def plan(self, partials: list[QueuedRequest], budget: int, free_seats: int, demand) -> dict[str, int]:
        """Rank each tier's partials and waiting requests by its reference model, the tiers in order, then
        hand out the budget walking that one order."""
        order: list[tuple[QueuedRequest, bool]] = []
        for tier in sorted(set(self.tiers) | {self.tier_of(p) for p in partials}):
            mine = [self._inner(p) for p in partials if self.tier_of(p) == tier]
            calls: list[QueuedRequest] = []

            def record(req, left, calls=calls):
                calls.append(req)
                return 1

            self._ref(tier).plan(mine, 1 << 40, 1 << 20, record)
            ids = {p.request_id for p in mine}
            order.extend((self.original[r.request_id], r.request_id in ids) for r in calls)
        caps: dict[str, int] = {}
        for req, partial in order:
            take = min(max(0, demand(req, budget)), budget) if budget > 0 else 0
            if partial:
                caps[req.request_id] = take
                budget -= take
            elif free_seats > 0 and take:
                budget -= take
                free_seats -= 1
        return caps


OPERATIONS = ["add", "add", "add", "pop", "pop", "peek", "skip", "step", "step", "clock", "prepend", "prepend",
              "remove", "plan"]


def _request(rng: random.Random, number: int) -> QueuedRequest:
    prompt = rng.choice([rng.randint(1, 12), rng.randint(1, 12), 200, 300, 5000])
    return QueuedRequest(f"q{number:04d}", prompt, cached_tokens=rng.choice([0, 0, 0, 1]) % prompt,
                         priority=rng.choice(TIERS), resumed=rng.random() < 0.1, is_decode=rng.random() < 0.05)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), threshold=st.sampled_from([6, 256]),
       wait_ms=st.sampled_from([0.0, 2.0, 10.0]), length=st.integers(20, 250))
def test_tiers_match_the_naive_model(policy: str, seed: int, threshold: int, wait_ms: float, length: int) -> None:
    rng = random.Random(seed)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    queue = make_queue({"policy": policy, "threshold": threshold, "long_max_wait_ms": wait_ms,
                        "stats_interval_s": 0, "priority_tiers": True}, clock=clock)
    assert isinstance(queue, TiersQueue)
    ref = RefTiers(policy, threshold, wait_ms, clock)
    popped: list[QueuedRequest] = []
    queued: dict[str, QueuedRequest] = {}
    dispatched = 0
    for number in range(length):
        op = rng.choice(OPERATIONS)
        if op == "add":
            request = _request(rng, number)
            queue.add_request(request)
            ref.add(request)
            queued[request.request_id] = request
        elif op in ("pop", "skip") and queued:
            got = queue.pop_request()
            assert got is ref.pop()
            del queued[got.request_id]
            popped.append(got)
            if op == "skip":
                queue.skip_request(got)
                ref.skip(got)
            else:
                dispatched += 1
        elif op == "peek" and queued:
            assert queue.peek_request() is ref.peek()
        elif op == "step":
            tokens = rng.choice([0, 3, 9, 128, 4096])
            queue.on_prefill_submitted(tokens)
            ref.step(tokens)
        elif op == "clock":
            now[0] += rng.choice([0.001, 0.003, 0.02])
        elif op == "prepend" and popped:
            request = popped.pop(rng.randrange(len(popped)))
            if rng.random() < 0.3:  # preempted after streaming output: the engine's view changes
                request = dataclasses.replace(request, resumed=True, output_tokens=request.output_tokens + 2)
            queue.prepend_request(request)
            ref.prepend(request)
            queued[request.request_id] = request
        elif op == "remove" and queued:
            victim = queued.pop(rng.choice(sorted(queued)))
            queue.remove_request(victim)
            ref.remove(victim)
        elif op == "plan" and not ref.pinned:
            partials = [p for p in popped[-3:] if not p.is_decode]
            if policy == "short_request_first" or len({p.request_id for p in partials}) < len(partials):
                continue
            budget, seats = rng.choice([0, 5, 300, 6000]), rng.choice([0, 1, 4, 100])
            caps = queue.plan_step(partials, budget, free_seats=seats)
            assert caps == ({} if policy == "default" else ref.plan(partials, budget, seats, _demand))
        assert len(queue) == ref.size() == len(queued)
        if ref.pinned is None:
            assert [r.request_id for r in queue] == ref.order()
    assert sum(queue.stats()["dispatched"].values()) == sum(r.dispatches for r in ref.tiers.values()) <= dispatched
    assert queue.stats()["size"] == len(queued)


def _demand(request: QueuedRequest, left: int) -> int:
    return min(max(1, request.remaining_prefill_tokens), left)


# --- default = vLLM's priority heap -------------------------------------------------------------------


class VllmLike:
    """A request ordered as vLLM's ``Request.__lt__``: (priority, arrival_time, request_id)."""

    def __init__(self, request_id: str, priority: int, arrival_time: float) -> None:
        self.request_id, self.priority, self.arrival_time = request_id, priority, arrival_time

    def __lt__(self, other: VllmLike) -> bool:
        return (self.priority, self.arrival_time, self.request_id) < (other.priority, other.arrival_time,
                                                                      other.request_id)


def vllm_view(r: VllmLike) -> QueuedRequest:
    return QueuedRequest(r.request_id, 100, priority=r.priority)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(5, 200), own_times=st.booleans())
def test_default_in_tiers_orders_as_vllms_priority_heap(seed: int, length: int, own_times: bool) -> None:
    """After adds, pops, peeks, prepends (skips and preemptions) and removes, ``default``'s order is
    (priority, arrival): vLLM's heap, whose prepend is an add by that key."""
    rng = random.Random(seed)
    queue = make_queue({"policy": "default", "priority_tiers": True}, view=vllm_view,
                       arrival=(lambda r: r.arrival_time) if own_times else None)
    heap: list[VllmLike] = []
    popped: list[VllmLike] = []
    clock = 0.0
    for number in range(length):
        op = rng.choice(["add", "add", "pop", "peek", "prepend", "remove", "step"])
        if op == "add":
            # an engine's arrival times may come out of add order (vLLM's own tests do that)
            clock += rng.choice([0.5, 1.0]) if not own_times else rng.uniform(-3.0, 3.0)
            request = VllmLike(f"r{number:04d}", rng.choice([0, 0, 1, 2, -3]), clock)
            queue.add_request(request)
            heapq.heappush(heap, request)
        elif op in ("pop", "peek") and heap:
            expected = heap[0]
            if op == "pop":
                assert queue.pop_request() is heapq.heappop(heap)
                popped.append(expected)
            else:
                assert queue.peek_request() is expected
        elif op == "prepend" and popped:
            request = popped.pop(rng.randrange(len(popped)))
            queue.prepend_request(request)
            heapq.heappush(heap, request)
        elif op == "remove" and heap:
            victim = rng.choice(heap)
            heap.remove(victim)
            heapq.heapify(heap)
            queue.remove_request(victim)
        elif op == "step":
            queue.on_prefill_submitted(rng.choice([0, 16]))
        assert list(queue) == sorted(heap)


def test_the_held_out_case_orders_as_stock_with_default_and_short_first_with_auto() -> None:
    """``H0 S0 L1 S1``: tier 0 before tier 1; stock order inside a tier with default, shortest with auto."""
    requests = [QueuedRequest("H0", 4000, priority=0), QueuedRequest("S0", 20, priority=0),
                QueuedRequest("L1", 8000, priority=1), QueuedRequest("S1", 30, priority=1)]
    for policy, expected in (("default", ["H0", "S0", "L1", "S1"]), ("auto", ["S0", "H0", "S1", "L1"]),
                             ("hrrn", ["S0", "H0", "S1", "L1"])):
        queue = make_queue({"policy": policy, "priority_tiers": True})
        for request in reversed(requests):
            queue.add_request(request)
        if policy == "default":  # added in reverse: by arrival, the add order
            expected = ["S0", "H0", "S1", "L1"]
        assert [r.request_id for r in queue] == expected, policy


def test_every_tier_ages_by_all_the_engines_prefill_work() -> None:
    """A tier made after work was done starts at the shared counter: auto's deadlines count from there."""
    from prefillq.policies.auto import GRACE_TOKENS, SLOWDOWN

    queue = make_queue({"policy": "auto", "priority_tiers": True})
    queue.add_request(QueuedRequest("a", 10, priority=0))
    queue.pop_request()
    queue.on_prefill_submitted(100_000)
    queue.add_request(QueuedRequest("long", 1000, priority=3))  # its tier is made now, at P = 100000
    queue.on_prefill_submitted(SLOWDOWN * 1000 + GRACE_TOKENS - 1)
    queue.add_request(QueuedRequest("short", 10, priority=3))
    assert [r.request_id for r in queue] == ["short", "long"]  # not due yet: its wait counts from 100000
    queue.on_prefill_submitted(1)  # due now, in its tier
    assert [r.request_id for r in queue] == ["long", "short"]
    assert queue.stats()["processed_prefill_tokens"] == 100_000 + SLOWDOWN * 1000 + GRACE_TOKENS


def test_a_peek_is_pinned_until_another_tier_changes() -> None:
    queue = make_queue({"policy": "auto", "priority_tiers": True})
    queue.add_request(QueuedRequest("b", 10, priority=1))
    assert queue.peek_request().request_id == "b"
    queue.add_request(QueuedRequest("a", 50, priority=0))
    assert queue.pop_request().request_id == "a"  # the queue changed: a higher tier goes first
    assert queue.pop_request().request_id == "b"
    with pytest.raises(IndexError):
        queue.peek_request()


def test_decodes_stay_in_front_of_every_tier_and_indexing_follows_the_order() -> None:
    queue = make_queue({"policy": "hrrn", "priority_tiers": True})
    queue.add_request(QueuedRequest("w", 10, priority=-5))
    queue.add_request(QueuedRequest("d", 10, priority=3, is_decode=True))
    assert [r.request_id for r in queue] == ["d", "w"]
    assert queue[0].request_id == "d" and queue[-1].request_id == "w"
    assert QueuedRequest("w", 1) in queue and QueuedRequest("d", 1) in queue


def test_the_tier_queues_never_see_a_negative_priority_nor_change_the_callers_view() -> None:
    seen = QueuedRequest("x", 10, priority=-2)
    queue = make_queue({"policy": "promote_shortest", "priority_tiers": True})
    queue.add_request(seen)
    assert seen.priority == -2
    assert queue.stats()["lanes"].get("priority", 0) == 0 and queue.stats()["tiers"] == {"-2": 1}


def test_configuration_and_deployment_checks() -> None:
    config = load_config({"policy": "auto", "priority_tiers": True})
    assert config.priority_tiers and load_config("auto").priority_tiers is False
    with pytest.raises(ConfigError, match="priority_tiers"):
        load_config({"policy": "auto", "priority_tiers": "yes"})
    with pytest.raises(ConfigError, match="peer"):
        load_config({"policy": "sglang_hrrn", "priority_tiers": True})
    validate_deployment(config, scheduling_policy="priority")
    with pytest.raises(ConfigError, match="priority_tiers"):
        validate_deployment(load_config("auto"), scheduling_policy="priority")
    with pytest.raises(ConfigError, match="--scheduling-policy priority"):
        validate_deployment(config, scheduling_policy="fcfs")
    validate_deployment(load_config("auto"), scheduling_policy="fcfs")


def test_memory_limit_reaches_every_tier_and_forget_drops_the_memory() -> None:
    queue = make_queue({"policy": "hrrn", "priority_tiers": True})
    queue.memory_limit = None
    request = QueuedRequest("m", 100, priority=2)
    queue.add_request(request)
    queue.add_request(QueuedRequest("n", 100, priority=2))
    assert queue.pop_request() is request
    queue.on_prefill_submitted(50)
    queue.forget_request(request)
    queue.prepend_request(request)  # forgotten: it enters as new, having waited for no work yet
    assert [r.request_id for r in queue] == ["n", "m"]
    assert all(q.memory_limit is None for q in queue._tiers.values())
