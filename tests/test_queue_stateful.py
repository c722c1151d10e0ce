"""Randomized operation sequences: every policy's queue against the naive reference model."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefillq import QueuedRequest, make_queue
from tests.reference import RefQueue

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto"]

request_fields = st.fixed_dictionaries({
    "prompt_tokens": st.integers(1, 12) | st.sampled_from([64, 256, 257, 1000, 4096, 16384])
    | st.integers(1, 20000),
    "cached_tokens": st.sampled_from([0, 0, 0, 3, 16, 512]),
    "priority": st.sampled_from([0, 0, 0, 0, -1, -2, 1]),
    "is_decode": st.sampled_from([False] * 9 + [True]),
    "resumed": st.sampled_from([False] * 4 + [True]),
})


class QueueMachine(RuleBasedStateMachine):
    policy = "default"

    @initialize(threshold=st.sampled_from([0, 6, 64, 256, 1000]),
                wait_ms=st.sampled_from([0.0, 0.0, 5.0, 50.0, 400.0]))
    def setup(self, threshold: int, wait_ms: float) -> None:
        self.now = 1000.0
        clock = lambda: self.now  # noqa: E731
        config = {"policy": self.policy, "threshold": threshold, "long_max_wait_ms": wait_ms,
                  "stats_interval_s": 0}
        self.queue = make_queue(config, clock=clock)
        self.ref = RefQueue(self.policy, threshold, wait_ms, clock=clock)
        self.counter = 0
        self.queued: dict[str, QueuedRequest] = {}
        self.popped: list[QueuedRequest] = []
        self.dispatched: list[str] = []

    @rule(fields=request_fields)
    def add(self, fields: dict) -> None:
        request = QueuedRequest(request_id=f"r{self.counter:04d}", **fields)
        self.counter += 1
        self.queue.add_request(request)
        self.ref.add(request)
        self.queued[request.request_id] = request

    @precondition(lambda self: self.queued)
    @rule()
    def peek(self) -> None:
        assert self.queue.peek_request() is self.ref.peek()

    @precondition(lambda self: self.queued)
    @rule()
    def pop(self) -> None:
        got = self.queue.pop_request()
        assert got is self.ref.pop()
        del self.queued[got.request_id]
        self.popped.append(got)
        self.dispatched.append(got.request_id)

    @precondition(lambda self: self.queued)
    @rule()
    def pop_to_skip(self) -> None:
        """vLLM's skip path: pop, say it is a skip, prepend it later (SPEC §3.0: not a dispatch)."""
        got = self.queue.pop_request()
        assert got is self.ref.pop()
        self.queue.skip_request(got)
        self.ref.skip(got)
        del self.queued[got.request_id]
        self.popped.append(got)

    @precondition(lambda self: self.popped)
    @rule(index=st.integers(0, 1000), preempted=st.booleans())
    def prepend(self, index: int, preempted: bool) -> None:
        request = self.popped.pop(index % len(self.popped))
        if preempted:  # the engine's view changes: resumed, with output so far
            request = dataclasses.replace(request, resumed=True, output_tokens=request.output_tokens + 3)
        self.queue.prepend_request(request)
        self.ref.prepend(request)
        self.queued[request.request_id] = request

    @precondition(lambda self: len(self.popped) >= 2)
    @rule()
    def prepend_several(self) -> None:
        batch = [self.popped.pop(), self.popped.pop()]
        self.queue.prepend_requests(batch)
        for request in batch:  # one after the other, as vLLM's deque extendleft: the last given ends first
            self.ref.prepend(request)
        for request in batch:
            self.queued[request.request_id] = request

    @rule(index=st.integers(0, 1000), absent=st.booleans())
    def remove(self, index: int, absent: bool) -> None:
        if absent or not self.queued:
            ghost = QueuedRequest(request_id="ghost", prompt_tokens=5)
            self.queue.remove_requests([ghost])  # tolerated, changes nothing
            return
        key = sorted(self.queued)[index % len(self.queued)]
        request = self.queued.pop(key)
        self.queue.remove_request(request)
        self.ref.remove(key)

    @rule(tokens=st.integers(0, 9) | st.sampled_from([128, 1024, 4096]))
    def end_step(self, tokens: int) -> None:
        self.queue.on_prefill_submitted(tokens)
        self.ref.step(tokens)

    @rule(dt=st.sampled_from([0.0, 0.001, 0.004, 0.05, 0.5]))
    def advance_clock(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def same_order_and_contents(self) -> None:
        if not hasattr(self, "queue"):
            return
        assert len(self.queue) == len(self.queued) == len(self.ref.items)
        assert bool(self.queue) == bool(self.queued)
        if self.ref.pinned is None:
            expected = [i.req for i in self.ref.order()]
            got = list(self.queue)
            assert [r.request_id for r in got] == [r.request_id for r in expected]
            assert all(a is b for a, b in zip(got, expected, strict=True))
        assert {r.request_id for r in self.queue} == set(self.queued)

    @invariant()
    def dispatch_count_matches(self) -> None:
        if hasattr(self, "queue"):
            assert sum(self.queue.stats()["dispatched"].values()) == self.ref.dispatches

    @invariant()
    def srf_counters_match(self) -> None:
        if hasattr(self, "queue") and self.policy == "short_request_first":
            stats = self.queue.stats()
            assert stats["aged_long_promotions"] == self.ref.aged_promotions
            assert stats["degradation_warnings"] == self.ref.warnings
            assert stats["degradation_streak"] == self.ref.streak


def _machine(policy: str) -> type[RuleBasedStateMachine]:
    return type(f"Machine_{policy}", (QueueMachine,), {"policy": policy})


@pytest.mark.parametrize("policy", POLICIES)
def test_queue_matches_reference_model(policy: str) -> None:
    machine = _machine(policy)
    machine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()


# Long operation programs reach deeper states (many HRRN crossings, SRF streaks) than the rule-based
# machine, whose runs hypothesis keeps short. Hypothesis draws the seed and the mix; the program itself
# is drawn uniformly so that rare events (a counter landing exactly on a crossing) do happen.
OPERATIONS = ["add", "add", "add", "pop", "pop", "peek", "step", "step", "step", "clock", "prepend", "remove"]


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), threshold=st.sampled_from([6, 256]),
       wait_ms=st.sampled_from([0.0, 2.0, 10.0]), length=st.integers(20, 300))
def test_long_programs_match_reference(policy: str, seed: int, threshold: int, wait_ms: float,
                                       length: int) -> None:
    rng = random.Random(seed)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    queue = make_queue({"policy": policy, "threshold": threshold, "long_max_wait_ms": wait_ms,
                        "stats_interval_s": 0}, clock=clock)
    ref = RefQueue(policy, threshold, wait_ms, clock=clock)
    popped: list[QueuedRequest] = []
    for number in range(length):
        op = rng.choice(OPERATIONS)
        if op == "add":
            prompt = rng.choice([rng.randint(1, 12), rng.randint(1, 12), 200, 300, 5000])
            request = QueuedRequest(f"q{number:04d}", prompt, cached_tokens=rng.choice([0, 0, 0, 1]) % prompt,
                                    priority=rng.choice([0] * 6 + [-1]), resumed=rng.random() < 0.1)
            queue.add_request(request)
            ref.add(request)
        elif op in ("pop", "peek") and ref.items:
            got = queue.pop_request() if op == "pop" else queue.peek_request()
            assert got is (ref.pop() if op == "pop" else ref.peek())
            if op == "pop":
                popped.append(got)
        elif op == "step":
            tokens = rng.randint(0, 9)
            queue.on_prefill_submitted(tokens)
            ref.step(tokens)
        elif op == "clock":
            now[0] += rng.choice([0.001, 0.003, 0.02])
        elif op == "prepend" and popped:
            request = popped.pop(rng.randrange(len(popped)))
            queue.prepend_request(request)
            ref.prepend(request)
        elif op == "remove" and ref.items:
            victim = rng.choice(sorted(ref.items, key=lambda i: i.req.request_id)).req
            queue.remove_request(victim)
            ref.remove(victim.request_id)
        assert len(queue) == len(ref.items)
    if ref.pinned is None:
        assert [r.request_id for r in queue] == [i.req.request_id for i in ref.order()]
    if policy == "short_request_first":
        assert queue.stats()["degradation_warnings"] == ref.warnings
        assert queue.stats()["aged_long_promotions"] == ref.aged_promotions
