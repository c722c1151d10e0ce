"""``auto``'s starvation bound (docs/auto.md), attacked with adversarial streams of short prompts.

The bound: once the processed-prefill counter reaches a request's deadline
``P_at_arrival + SLOWDOWN * cost + GRACE_TOKENS``, no request of its group that arrived at or after that
counter value is dispatched before it. Checked on the policy queue directly (hypothesis, against every
pop, with the real constants and with small ones so the deadlines come often), against the reference
model with small constants, and in the simulator (a long prompt under a flood of shorts that exceeds
the engine's capacity is served while the flood lasts; strict short-first never serves it).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, make_queue
from prefillq.policies import auto
from prefillq.sim import simulate
from prefillq.workload import scenario
from tests import test_queue_stateful


@pytest.fixture(params=[(auto.SLOWDOWN, auto.GRACE_TOKENS), (2, 10), (1, 0)], ids=["real", "small", "tiny"])
def constants(request, monkeypatch):
    slowdown, grace = request.param
    monkeypatch.setattr(auto, "SLOWDOWN", slowdown)
    monkeypatch.setattr(auto, "GRACE_TOKENS", grace)
    return slowdown, grace


def check_bound_on_stream(seed: int, length: int, slowdown: int, grace: int) -> int:
    """Drive one adversarial program; assert the bound at every pop. Returns how many pops it checked."""
    rng = random.Random(seed)
    queue = make_queue({"policy": "auto", "stats_interval_s": 0})
    counter = 0
    waiting: dict[str, tuple[QueuedRequest, int, int]] = {}  # id -> (request, P at arrival, deadline)
    checked = 0
    long_every = rng.choice([3, 10, 50])
    for number in range(length):
        op = rng.random()
        if op < 0.55:  # the flood: mostly tiny prompts, now and then a long one
            prompt = rng.randint(5000, 20000) if number % long_every == 0 else rng.randint(1, 64)
            request = QueuedRequest(f"q{number:05d}", prompt)
            queue.add_request(request)
            waiting[request.request_id] = (request, counter, counter + slowdown * prompt + grace)
        elif op < 0.85 and waiting:
            got = queue.pop_request()
            _, arrived, _ = waiting.pop(got.request_id)
            for other, (_, _, other_deadline) in waiting.items():
                assert not arrived >= other_deadline, (
                    f"{got.request_id} (arrived at P={arrived}) went before {other}, due since P={other_deadline}")
            checked += 1
        else:  # a step ends: the engine processed some prefill tokens
            counter += rng.choice([0, 1, 64, 512, 1024, 4096, 8192])
            queue.on_prefill_submitted(counter - queue.processed_tokens)
    return checked


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(50, 600))
def test_no_later_arrival_overtakes_a_due_request(constants, seed: int, length: int) -> None:
    check_bound_on_stream(seed, length, *constants)


def test_bound_is_exercised() -> None:
    """The check above is not vacuous: with small constants, due requests are overtaken-checked often."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(auto, "SLOWDOWN", 1)
        patch.setattr(auto, "GRACE_TOKENS", 0)
        queue = make_queue("auto")
        long = QueuedRequest("long", 1000)
        queue.add_request(long)
        queue.add_request(QueuedRequest("s0", 10))
        assert queue.pop_request().request_id == "s0"  # shortest remaining first
        queue.on_prefill_submitted(1000)                 # the long one is due now (P = 0 + 1 * 1000)
        queue.add_request(QueuedRequest("s1", 10))
        assert queue.pop_request() is long               # a later short does not pass a due request
        assert queue.stats()["deadline_promotions"] == 1


def test_matches_reference_with_frequent_deadlines() -> None:
    """The queue against the naive reference model, with constants small enough that due requests and
    their earliest-deadline order occur in most programs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(auto, "SLOWDOWN", 1)
        patch.setattr(auto, "GRACE_TOKENS", 2)
        test_queue_stateful.test_long_programs_match_reference(policy="auto")


def test_flood_of_shorts_cannot_starve_a_long_prompt() -> None:
    """Simulator: one 16K prompt, then for 30 s 1.3x more 512-token prompts than the engine can prefill
    (its capacity measured first, on a burst). Strict short-first serves the long prompt only after the
    flood has drained; auto serves it while the flood lasts (its deadline, ~1.06M processed tokens, comes
    after well under 30 s of work on the default profile)."""
    burst = scenario("long-then-stream", leading_long=0, long_fraction=0.0, rate=4000.0, duration_s=2.0,
                     short_tokens=512, output_tokens=4)
    records = simulate(burst, "default", budget=1024).records
    per_second = len(records) / max(r.sent_at + r.ttft_s for r in records)  # short prompts prefilled per second
    # the deadline comes within the flood's first half
    assert 0.5 * 30 * per_second * 512 > auto.SLOWDOWN * 16384 + auto.GRACE_TOKENS
    flood = scenario("long-then-stream", leading_long=1, long_fraction=0.0, rate=round(1.3 * per_second),
                     duration_s=30.0, short_tokens=512, output_tokens=4)

    def long_ttft(policy):
        result = simulate(flood, policy, budget=1024)
        (record,) = [r for r in result.records if r.klass == "long"]
        return record.ttft_s

    strict = long_ttft({"policy": "short_request_first", "threshold": 1024, "partial_prefills": "ordered"})
    served = long_ttft({"policy": "auto", "partial_prefills": "ordered"})
    assert strict > 30.0   # the flood starves it under strict short-first
    assert served < 25.0   # auto's deadline lets it through while the flood goes on
