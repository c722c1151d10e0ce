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
from tests.reference import RefRanker

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
