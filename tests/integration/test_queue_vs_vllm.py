"""``default``'s queue against vLLM's own FCFS queue as the reference model (SPEC §3.0, §4.1).

Random operation sequences, as vLLM's scheduler issues them (add, peek, pop, skip-then-prepend,
prepend of preempted requests one by one or several at once, remove, iterate, index), applied to both
queues: after every operation the two hold the same requests in the same order.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from vllm.v1.core.sched.request_queue import FCFSRequestQueue

from prefillq import QueuedRequest, make_queue


class AgainstVllmFCFS(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.queue = make_queue({"policy": "default", "stats_interval_s": 0}, clock=lambda: 0.0)
        self.ref = FCFSRequestQueue()
        self.counter = 0
        self.popped: list[QueuedRequest] = []
        self.skipped: list[QueuedRequest] = []  # popped this step to be skipped, in pop order

    @rule(prompt=st.integers(1, 5000), cached=st.sampled_from([0, 0, 16]))
    def add(self, prompt: int, cached: int) -> None:
        request = QueuedRequest(f"r{self.counter:04d}", prompt, cached_tokens=min(cached, prompt))
        self.counter += 1
        self.queue.add_request(request)
        self.ref.add_request(request)

    @precondition(lambda self: self.ref)
    @rule()
    def peek(self) -> None:
        assert self.queue.peek_request() is self.ref.peek_request()

    @precondition(lambda self: self.ref)
    @rule()
    def pop(self) -> None:
        got = self.queue.pop_request()
        assert got is self.ref.pop_request()
        self.popped.append(got)

    @precondition(lambda self: self.ref)
    @rule()
    def pop_to_skip(self) -> None:
        """vLLM's skip path: pop, mark it deferred, and hand it back at the end of the step."""
        got = self.queue.pop_request()
        assert got is self.ref.pop_request()
        self.queue.skip_request(got)
        self.skipped.append(got)

    @rule(tokens=st.integers(0, 600))
    def end_step(self, tokens: int) -> None:
        """The end of vLLM's waiting loop: the skipped requests come back in reverse, in one call."""
        if self.skipped:
            handed_back = list(reversed(self.skipped))
            self.queue.prepend_requests(handed_back)
            self.ref.prepend_requests(handed_back)
            self.skipped.clear()
        self.queue.on_prefill_submitted(tokens)

    @precondition(lambda self: self.popped)
    @rule(index=st.integers(0, 1000))
    def preempt(self, index: int) -> None:
        request = self.popped.pop(index % len(self.popped))
        self.queue.prepend_request(request)
        self.ref.prepend_request(request)

    @precondition(lambda self: len(self.popped) >= 2)
    @rule(count=st.integers(2, 4))
    def prepend_several(self, count: int) -> None:
        batch = [self.popped.pop() for _ in range(min(count, len(self.popped)))]
        self.queue.prepend_requests(batch)
        self.ref.prepend_requests(batch)

    @precondition(lambda self: self.ref)
    @rule(index=st.integers(0, 1000))
    def remove(self, index: int) -> None:
        victim = self.ref[index % len(self.ref)]
        self.queue.remove_request(victim)
        self.ref.remove_request(victim)

    @precondition(lambda self: self.ref)
    @rule(indices=st.lists(st.integers(0, 1000), min_size=1, max_size=3))
    def remove_several(self, indices: list[int]) -> None:
        victims = list({id(r): r for r in (self.ref[i % len(self.ref)] for i in indices)}.values())
        self.queue.remove_requests(victims)
        self.ref.remove_requests(victims)

    @precondition(lambda self: self.ref)
    @rule(index=st.integers(-1000, 1000))
    def index(self, index: int) -> None:
        position = index % len(self.ref) - (len(self.ref) if index < 0 else 0)
        assert self.queue[position] is self.ref[position]

    @invariant()
    def same_order(self) -> None:
        if not hasattr(self, "queue"):
            return
        assert len(self.queue) == len(self.ref)
        assert bool(self.queue) == bool(self.ref)
        assert [r.request_id for r in self.queue] == [r.request_id for r in self.ref]


def test_default_queue_is_vllm_fcfs_after_every_operation() -> None:
    AgainstVllmFCFS.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow])
    AgainstVllmFCFS.TestCase().runTest()


@pytest.mark.parametrize("policy", ["default", "promote_shortest", "hrrn", "short_request_first"])
def test_requests_skipped_together_come_back_in_their_order(policy: str) -> None:
    """vLLM hands back a step's skipped requests in reverse; they return in the order they were popped."""
    queue = make_queue({"policy": policy, "stats_interval_s": 0}, clock=lambda: 0.0)
    requests = [QueuedRequest(f"s{i}", 100) for i in range(4)]
    for request in requests:
        queue.add_request(request)
    before = list(queue)
    skipped = [queue.pop_request(), queue.pop_request(), queue.pop_request()]
    for request in skipped:
        queue.skip_request(request)
    queue.prepend_requests(list(reversed(skipped)))
    queue.on_prefill_submitted(0)
    assert list(queue) == before
    assert queue.stats()["prepends"] == 0  # skips are not preemption returns (SPEC §3.0)


def test_index_like_a_deque() -> None:
    queue = make_queue({"policy": "default", "stats_interval_s": 0}, clock=lambda: 0.0)
    requests = [QueuedRequest(f"i{i}", 10) for i in range(3)]
    for request in requests:
        queue.add_request(request)
    assert [queue[0], queue[1], queue[2], queue[-1], queue[-3]] == [*requests, requests[2], requests[0]]
    with pytest.raises(IndexError):
        queue[3]
    with pytest.raises(IndexError):
        queue[-4]
    with pytest.raises(TypeError, match="integers"):
        queue["0"]
