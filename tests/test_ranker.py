"""The re-ranking adapter (policies/ranker.py) against a naive re-rank of the reference model.

Requests progress while they sit in the ready list, as in a LightLLM-style engine: chunks of their
prefill run (cached tokens grow, they count as resumed), they start decoding, they leave. The adapter
must give exactly the order the spec gives for the list as it is now.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import Ranker, load_config, order
from prefillq.policies.base import PolicyQueue
from prefillq.requests import QueuedRequest
from tests.reference import RefItem, RefQueue, RefRanker

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto"]


def run_program(policy: str, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    config = {"policy": policy, "threshold": 256, "long_max_wait_ms": 30}
    ranker = Ranker(load_config(config), clock=clock)
    reference = RefRanker(policy, threshold=256, long_max_wait_ms=30, clock=clock)
    ready: list[QueuedRequest] = []
    for step in range(steps):
        for k in range(rng.choice([0, 0, 1, 1, 2, 3])):
            ready.append(QueuedRequest(f"r{step}-{k}", rng.choice([5, 64, 256, 257, 300, 2000, 9000]),
                                       priority=rng.choice([0, 0, 0, 0, -1, -2, 1])))
        ranked = ranker.rank(ready)
        assert [r.request_id for r in ranked] == [r.request_id for r in reference.rank(ready)]
        assert sorted(map(id, ranked)) == sorted(map(id, ready))  # nothing dropped, copied or invented
        if ranked:  # the queue's own next choice agrees with the order it gives (its heaps are current)
            assert ranker.queue.peek_request() is ranked[0]
        budget, used = rng.choice([0, 64, 512, 4096]), 0
        for request in ranked:
            if request.is_decode:
                if rng.random() < 0.3:
                    ready.remove(request)  # finished
                continue
            chunk = min(request.remaining_prefill_tokens, budget - used)
            if chunk <= 0:
                break
            used += chunk
            request.cached_tokens += chunk
            request.resumed = True
            if request.remaining_prefill_tokens == 0:
                request.is_decode = True
        if ready and rng.random() < 0.05:
            ready.remove(rng.choice(ready))  # aborted
        ranker.on_prefill_submitted(used)
        reference.step(used)
        now[0] += rng.choice([0.0, 0.004, 0.02])


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 80))
def test_ranker_matches_naive_rerank_while_requests_progress(policy, seed, steps):
    run_program(policy, seed, steps)


def test_ranker_is_a_thin_adapter_over_one_policy_queue():
    for policy in POLICIES:
        ranker = Ranker(policy)
        assert isinstance(ranker.queue, PolicyQueue) and ranker.queue.policy == policy


def test_refresh_keeps_arrival_state_and_moves_the_request_to_its_new_lane():
    now = [0.0]
    ranker = Ranker({"policy": "short_request_first", "threshold": 100, "long_max_wait_ms": 0},
                    clock=lambda: now[0])
    long, short = QueuedRequest("long", 1000), QueuedRequest("short", 50)
    assert [r.request_id for r in ranker.rank([long, short])] == ["short", "long"]
    long.cached_tokens, long.resumed = 200, True  # its first chunk ran: a partial prefill goes first
    now[0] = 5.0
    assert [r.request_id for r in ranker.rank([long, short])] == ["long", "short"]
    assert ranker.queue.stats()["longest_wait_s"]["immediate"] == 5.0  # waited since first seen


def test_one_shot_order_is_a_fresh_ranker():
    requests = [QueuedRequest("a", 900), QueuedRequest("b", 10), QueuedRequest("c", 50)]
    assert [r.request_id for r in order("promote_shortest", requests)] == ["b", "a", "c"]
    assert [r.request_id for r in requests] == ["a", "b", "c"]  # the caller's list is not touched


def test_progress_alone_refreshes_the_queue_so_its_choice_matches_its_order():
    ranker = Ranker("promote_shortest")
    long = QueuedRequest("long", 9000)
    ranker.rank([long])
    long.cached_tokens, long.resumed = 512, True
    ranker.on_prefill_submitted(512)
    ranker.rank([long])
    long.cached_tokens = 8512  # only its progress changed: 488 tokens left
    ranker.on_prefill_submitted(8000)
    mid = QueuedRequest("mid", 2000)
    assert [r.request_id for r in ranker.rank([long, mid])] == ["long", "mid"]
    assert ranker.queue.peek_request() is long


# --- SPEC §3.0: a request that leaves the ready list for some steps and comes back is the same request ---

def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def test_a_request_back_in_the_ready_list_keeps_its_place_under_default():
    # The smallest case: 1 (2 tokens) and 3 (3 tokens) admitted, 1 absent from one step's list.
    ranker = Ranker("default")
    one, three = QueuedRequest("1", 2), QueuedRequest("3", 3)
    assert ids(ranker.rank([one, three])) == ["1", "3"]
    ranker.on_prefill_submitted(0)
    assert ids(ranker.rank([three])) == ["3"]
    ranker.on_prefill_submitted(0)
    assert ids(ranker.rank([one, three])) == ["1", "3"]
    assert ids(ranker.rank([three, one])) == ["1", "3"]  # its place, not its position in the list


def test_a_request_back_in_the_ready_list_keeps_its_hrrn_arrival_counter():
    # A (1000 tokens) is seen at counter 0; 10000 tokens later it is absent for a step and B (10 tokens)
    # arrives; A comes back at 10100. Kept: A 10100/1000 = 10.1 > B 100/10 = 10. Restarted at 10100, A
    # would score 0 and follow B.
    ranker = Ranker("hrrn")
    a, b = QueuedRequest("A", 1000), QueuedRequest("B", 10)
    ranker.rank([a])
    ranker.on_prefill_submitted(10000)
    assert ids(ranker.rank([b])) == ["B"]
    ranker.on_prefill_submitted(100)
    assert ids(ranker.rank([b, a])) == ["A", "B"]


def test_a_request_back_in_the_ready_list_keeps_its_frozen_hrrn_cost():
    # A (1000 tokens) and B (500) seen at counter 0. A is absent while its KV arrives: 990 tokens cached
    # when it comes back at 10100. Frozen cost: at 11100, A 11100/1000 = 11.1 < B 11100/500 = 22.2.
    # Re-bound (cost 10), A would lead by far, with its old counter or with a new one (1000/10 = 100).
    ranker = Ranker("hrrn")
    a, b = QueuedRequest("A", 1000), QueuedRequest("B", 500)
    assert ids(ranker.rank([a, b])) == ["A", "B"]
    ranker.on_prefill_submitted(10100)
    ranker.rank([b])
    ranker.on_prefill_submitted(0)
    a.cached_tokens = 990
    ranker.rank([a, b])
    ranker.on_prefill_submitted(1000)
    assert ids(ranker.rank([a, b])) == ["B", "A"]


def test_a_request_back_in_the_ready_list_keeps_its_first_enqueue_time_under_srf():
    now = [0.0]
    ranker = Ranker({"policy": "short_request_first", "threshold": 100, "long_max_wait_ms": 1000},
                    clock=lambda: now[0])
    long, short = QueuedRequest("long", 1000), QueuedRequest("short", 50)
    ranker.rank([long])
    now[0] = 0.6
    ranker.rank([short])          # long is away
    now[0] = 1.2                  # 1.2 s since long first entered, 0.6 s since it came back
    assert ids(ranker.rank([short, long])) == ["long", "short"]


def test_forget_drops_a_request_that_left_for_good():
    ranker = Ranker("default")
    one, three = QueuedRequest("1", 2), QueuedRequest("3", 3)
    ranker.rank([one, three])
    ranker.rank([three])
    ranker.forget(one)
    ranker.forget(QueuedRequest("never-seen", 5))  # ignored
    assert ids(ranker.rank([one, three])) == ["3", "1"]  # the same id again is a new request
    ranker.forget(three)  # a request still in the list is removed from it as well
    assert ids(ranker.queue) == ["1"]


class ReadyListReference:
    """SPEC §3.0's ready-list rule, naively: the reference queue holds the requests in the list now; a
    request that leaves it is set aside whole (place, clock value, counter value, frozen cost) and put
    back as it was when it returns; only ``forget`` ends it."""

    def __init__(self, policy: str, **kwargs) -> None:
        self.ref = RefQueue(policy, **kwargs)
        self.away: dict[str, RefItem] = {}

    def rank(self, ready: list[QueuedRequest]) -> list[QueuedRequest]:
        present = {r.request_id for r in ready}
        for item in [i for i in self.ref.items if i.req.request_id not in present]:
            self.ref.items.remove(item)
            self.away[item.req.request_id] = item
        known = {i.req.request_id: i for i in self.ref.items}
        for req in ready:
            key = req.request_id
            if key in known:
                known[key].req = req
            elif key in self.away:
                item = self.away.pop(key)
                item.req = req
                self.ref.items.append(item)
            else:
                self.ref.add(req)
                continue
            self.ref.bind_cost(known.get(key) or self.ref.items[-1])
        return [i.req for i in self.ref.order()]

    def forget(self, request_id: str) -> None:
        self.away.pop(request_id, None)
        self.ref.items = [i for i in self.ref.items if i.req.request_id != request_id]


def run_comings_and_goings(policy: str, seed: int, steps: int) -> None:
    """Requests leave the ready list for a few steps (a KV transfer, a pause) and come back, sometimes
    changed (their KV arrived meanwhile), while others progress, decode, finish or are aborted."""
    rng = random.Random(seed)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    ranker = Ranker(load_config({"policy": policy, "threshold": 256, "long_max_wait_ms": 30}), clock=clock)
    reference = ReadyListReference(policy, threshold=256, long_max_wait_ms=30, clock=clock)
    ready: list[QueuedRequest] = []
    away: list[tuple[int, QueuedRequest]] = []  # (step it returns at, request)
    for step in range(steps):
        for k in range(rng.choice([0, 0, 1, 1, 2, 3])):
            ready.append(QueuedRequest(f"r{step}-{k}", rng.choice([2, 3, 5, 64, 256, 257, 2000, 9000]),
                                       priority=rng.choice([0, 0, 0, 0, -1, 1])))
        for back, request in [pair for pair in away if pair[0] <= step]:
            away.remove((back, request))
            if rng.random() < 0.3:
                request.cached_tokens = min(request.prompt_tokens, request.cached_tokens + rng.choice([1, 64, 999]))
            ready.insert(rng.randrange(len(ready) + 1), request)  # anywhere in the list: the place is kept
        for request in list(ready):
            if rng.random() < 0.15:
                ready.remove(request)
                away.append((step + rng.choice([1, 1, 2, 5]), request))
        ranked = ranker.rank(ready)
        assert ids(ranked) == ids(reference.rank(ready))
        assert sorted(map(id, ranked)) == sorted(map(id, ready))
        budget, used = rng.choice([0, 64, 512, 4096]), 0
        for request in ranked:
            if request.is_decode:
                if rng.random() < 0.3:
                    ready.remove(request)
                    ranker.forget(request)
                    reference.forget(request.request_id)
                continue
            chunk = min(request.remaining_prefill_tokens, budget - used)
            if chunk <= 0:
                break
            used += chunk
            request.cached_tokens += chunk
            request.resumed = True
            request.is_decode = request.remaining_prefill_tokens == 0
        if away and rng.random() < 0.05:  # aborted while away
            _, request = away.pop(rng.randrange(len(away)))
            ranker.forget(request)
            reference.forget(request.request_id)
        ranker.on_prefill_submitted(used)
        reference.ref.step(used)
        now[0] += rng.choice([0.0, 0.004, 0.02])


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 60))
def test_ranker_matches_the_ready_list_rule_when_requests_leave_and_return(policy, seed, steps):
    run_comings_and_goings(policy, seed, steps)
