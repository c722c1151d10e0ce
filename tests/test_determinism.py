"""Replicas (tensor-parallel ranks) that see the same operations dispatch in the same order."""

from __future__ import annotations

import random

import pytest

from prefillq import QueuedRequest, make_queue, order


def run(policy: str, clock, seed: int) -> list[str]:
    rng = random.Random(seed)
    queue = make_queue({"policy": policy, "threshold": 256, "long_max_wait_ms": 0}, clock=clock)
    dispatched = []
    for number in range(400):
        for _ in range(rng.randint(0, 3)):
            queue.add_request(QueuedRequest(f"r{number}-{rng.random():.6f}", rng.choice([64, 128, 4096, 16384])))
        budget = 1024
        spent = 0
        while queue and spent < budget:
            request = queue.pop_request()
            spent += request.prompt_tokens
            dispatched.append(request.request_id)
        queue.on_prefill_submitted(min(spent, budget))
    return dispatched


@pytest.mark.parametrize("policy", ["default", "promote_shortest", "hrrn", "short_request_first", "auto"])
def test_same_operations_under_different_wall_clocks_give_the_same_order(policy):
    slow = iter(range(0, 10**9, 7))
    fast = iter(range(5, 10**9, 1013))
    assert run(policy, lambda: next(slow) / 1000, seed=3) == run(policy, lambda: next(fast) / 10, seed=3)


def test_order_is_deterministic_across_calls():
    requests = [QueuedRequest(f"x{i}", (i * 7919) % 5000 + 1) for i in range(200)]
    for policy in ("default", "promote_shortest", "hrrn", "srf"):
        assert order(policy, requests) == order(policy, list(requests))


@pytest.mark.parametrize("policy", ["default", "promote_shortest", "hrrn", "short_request_first", "auto"])
def test_ranker_agrees_with_queue_step_by_step(policy):
    """A LightLLM-style engine (re-rank the ready list each step) dispatches what the queue dispatches."""
    from prefillq import Ranker, load_config

    rng = random.Random(11)
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    config = load_config({"policy": policy, "threshold": 256, "long_max_wait_ms": 30})
    queue = make_queue(config, clock=clock)
    ranker = Ranker(config, clock=clock)
    ready: list[QueuedRequest] = []
    for step in range(300):
        for k in range(rng.randint(0, 3)):
            request = QueuedRequest(f"s{step}-{k}", rng.choice([5, 64, 300, 2000, 9000]))
            queue.add_request(request)
            ready.append(request)
        ranked = ranker.rank(ready)
        assert [r.request_id for r in ranked] == [r.request_id for r in queue]
        taken = ranked[: rng.randint(0, 2)]
        for request in taken:
            assert queue.pop_request() is request
            ready.remove(request)
        tokens = sum(r.prompt_tokens for r in taken)
        queue.on_prefill_submitted(tokens)
        ranker.on_prefill_submitted(tokens)
        now[0] += 0.01
