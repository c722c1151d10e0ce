"""SPEC §3.6: partial prefills in the policy's order (``plan_step``), one test per rule, plus the
option's configuration and a randomized comparison of the budget split with the naive reference model."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, make_queue
from prefillq.config import ConfigError, load_config, read_additional_config
from tests.reference import RefQueue

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def queue_for(policy: str, clock: Clock | None = None, **options):
    config = {"policy": policy, "stats_interval_s": 0, "partial_prefills": "ordered", **options}
    return make_queue(config, clock=clock or Clock())


def start(queue, request: QueuedRequest, tokens: int) -> QueuedRequest:
    """Dispatch ``request`` (it must be the queue's next) and run ``tokens`` of its prefill in one step."""
    assert queue.pop_request() is request
    queue.on_prefill_submitted(tokens)
    request.cached_tokens += tokens
    return request


# --- configuration ---------------------------------------------------------------------------------

def test_partial_prefills_defaults_to_first() -> None:
    assert load_config(None).partial_prefills == "first"
    assert load_config("hrrn").partial_prefills == "first"


def test_partial_prefills_in_native_config_and_additional_config() -> None:
    assert load_config({"policy": "hrrn", "partial_prefills": "ordered"}).partial_prefills == "ordered"
    config, _ = read_additional_config({"prefillq": {"policy": "srf", "partial_prefills": "ordered"}})
    assert config.partial_prefills == "ordered"
    assert load_config('{"prefillq": {"partial_prefills": "first"}}').partial_prefills == "first"


@pytest.mark.parametrize("value", ["Ordered", "last", "", 1, None, True])
def test_bad_partial_prefills_names_the_key_and_the_choices(value) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"policy": "hrrn", "partial_prefills": value})
    assert "partial_prefills" in str(info.value) and "first, ordered" in str(info.value)


def test_ascend_dialect_always_means_first() -> None:
    ascend = {"scheduler_config": {"short_request_first_config": {"enabled": True}}}
    assert load_config(ascend).partial_prefills == "first"
    with pytest.raises(ConfigError, match="partial_prefills"):
        load_config({"scheduler_config": {"short_request_first_config": {"partial_prefills": "ordered"}}})


# --- the rules -------------------------------------------------------------------------------------

RANKING = [p for p in POLICIES if p != "default"]  # `default` plans no caps: "ordered" is "first" (SPEC §3.6)


@pytest.mark.parametrize("policy", RANKING)
def test_plan_with_no_waiting_gives_partials_the_budget_in_order(policy: str) -> None:
    queue = queue_for(policy)
    a, b = QueuedRequest("a", 3000), QueuedRequest("b", 3000)
    queue.add_request(a)
    queue.add_request(b)
    start(queue, a, 0)
    start(queue, b, 0)
    assert queue.plan_step([a, b], 1024, free_seats=4) == {"a": 1024, "b": 0}
    assert queue.plan_step([a, b], 5000, free_seats=4) == {"a": 3000, "b": 2000}


def test_hrrn_short_waiting_request_ranks_ahead_of_a_young_long_partial() -> None:
    queue = queue_for("hrrn")
    long = QueuedRequest("long", 16000)
    queue.add_request(long)
    start(queue, long, 1024)  # P = 1024; long's score 1024/16000, frozen cost 16000
    short = QueuedRequest("short", 100)
    queue.add_request(short)
    queue.on_prefill_submitted(1024)  # the short one has waited 1024 tokens: score 10.24
    assert queue.plan_step([long], 1024, free_seats=4) == {"long": 924}


def test_hrrn_partial_keeps_arrival_counter_and_frozen_cost() -> None:
    """An old partial long prefill overtakes a newer short one once enough tokens have been processed."""
    queue = queue_for("hrrn")
    long = QueuedRequest("long", 2000)
    queue.add_request(long)
    start(queue, long, 1000)  # P=1000, long arrived at 0 with cost 2000 (frozen, not 1000 remaining)
    short = QueuedRequest("short", 500)
    queue.add_request(short)  # arrives at P=1000
    queue.on_prefill_submitted(100)  # P=1100: long 1100/2000 = 0.55 > short 100/500 = 0.2
    assert queue.plan_step([long], 600, free_seats=4) == {"long": 600}
    # With the remaining 1000 tokens as cost (wrong), long would score 1.1 too; so check a point
    # where the frozen cost decides: P=1500: long 1500/2000 = 0.75 < short 500/500 = 1.0.
    queue.on_prefill_submitted(400)
    assert queue.plan_step([long], 600, free_seats=4) == {"long": 100}


def test_srf_partial_is_classified_by_prompt_length_never_immediate() -> None:
    clock = Clock()
    queue = queue_for("short_request_first", clock, threshold=256)
    partial_short = QueuedRequest("ps", 200)
    queue.add_request(partial_short)
    start(queue, partial_short, 100)  # a partial short: in the short lane by its arrival, not immediate
    waiting_short = QueuedRequest("ws", 50)
    queue.add_request(waiting_short)
    resumed = QueuedRequest("res", 400, resumed=True)
    queue.add_request(resumed)  # immediate lane: ahead of every partial prefill
    assert queue.plan_step([partial_short], 500, free_seats=4) == {"ps": 100}
    assert queue.plan_step([partial_short], 450, free_seats=4) == {"ps": 50}
    # A partial long prefill ranks behind waiting shorts (strict short-first).
    long = QueuedRequest("long", 4000)
    queue2 = queue_for("short_request_first", clock, threshold=256)
    queue2.add_request(long)
    start(queue2, long, 512)
    queue2.add_request(QueuedRequest("s1", 100))
    queue2.add_request(QueuedRequest("s2", 100))
    assert queue2.plan_step([long], 512, free_seats=4) == {"long": 312}
    assert queue2.plan_step([long], 512, free_seats=1) == {"long": 412}  # one seat: one short runs


def started_longs(clock: Clock):
    """An SRF queue (threshold 256, long_max_wait_ms 1000) with three partial long prefills from t=0."""
    queue = queue_for("short_request_first", clock, threshold=256, long_max_wait_ms=1000)
    longs = [QueuedRequest(f"L{i}", 8000) for i in range(3)]
    for request in longs:
        queue.add_request(request)
    for request in longs:
        start(queue, request, 10)
    return queue, longs


def test_srf_aged_partial_long_goes_first_and_counts_once_for_the_streak() -> None:
    clock = Clock()
    queue, longs = started_longs(clock)
    clock.now = 0.5
    queue.add_request(QueuedRequest("s", 100))
    plan = queue.plan_step(longs, 1000, free_seats=4)
    assert plan == {"L0": 900, "L1": 0, "L2": 0}  # not aged yet: the short goes first
    assert queue.stats()["aged_long_promotions"] == 0
    clock.now = 1.0  # the longs' first enqueue was at 0: aged now
    plan = queue.plan_step(longs, 9000, free_seats=4)
    assert plan == {"L0": 7990, "L1": 1010, "L2": 0}
    assert queue.stats()["aged_long_promotions"] == 2  # L0 and L1 got tokens ahead of the short
    queue.plan_step(longs, 9000, free_seats=4)  # the same promotions again: not counted twice
    assert queue.stats()["aged_long_promotions"] == 2
    assert queue.stats()["degradation_streak"] == 2


def test_srf_aged_partial_promotions_trigger_the_degradation_warning(caplog) -> None:
    clock = Clock()
    queue, longs = started_longs(clock)
    queue.add_request(QueuedRequest("s", 100))
    clock.now = 2.0
    with caplog.at_level("WARNING", logger="prefillq"):
        queue.plan_step(longs, 24000, free_seats=4)
        queue.on_prefill_submitted(0)
    assert queue.stats()["degradation_warnings"] == 1
    assert "consecutive aged-long promotions" in caplog.text


def test_promote_shortest_promotion_may_go_to_a_waiting_request_ahead_of_a_partial() -> None:
    queue = queue_for("promote_shortest")
    long = QueuedRequest("long", 5000)
    queue.add_request(long)
    start(queue, long, 1000)
    for i, size in enumerate([3000, 60, 2000]):
        queue.add_request(QueuedRequest(f"w{i}", size))
    # w1 (60) is the least remaining: promoted ahead of the partial; then FIFO: long (arrival 0) first.
    assert queue.plan_step([long], 1024, free_seats=4) == {"long": 964}
    assert queue.pop_request().request_id == "w1"
    assert queue.pop_request().request_id == "w0"  # after the promotion the step is plain FIFO


def test_promote_shortest_promotion_to_a_partial_uses_up_the_step() -> None:
    queue = queue_for("promote_shortest")
    long = QueuedRequest("long", 5000)
    queue.add_request(long)
    start(queue, long, 4990)  # 10 tokens left: the least remaining prefill
    queue.add_request(QueuedRequest("w0", 3000))
    queue.add_request(QueuedRequest("w1", 60))
    assert queue.plan_step([long], 1024, free_seats=4) == {"long": 10}
    assert queue.pop_request().request_id == "w0"  # the promotion is spent: FIFO
    queue.on_prefill_submitted(0)
    assert queue.pop_request().request_id == "w1"  # a new step: promotion available again


def test_default_plans_no_caps_even_with_a_preempted_request_in_front() -> None:
    """SPEC §3.6: `default` with "ordered" schedules exactly as with "first": running partial prefills
    before every waiting request, a preempted one (prepended with a negative sequence number, ahead of
    requests older than the partial) included. The plan is empty (no caps) and asks nothing."""
    queue = queue_for("default")
    old, first = QueuedRequest("old", 300), QueuedRequest("first", 5000)
    queue.add_request(old)
    queue.add_request(first)
    start(queue, old, 300)
    start(queue, first, 1000)
    queue.add_request(QueuedRequest("later", 10))
    queue.prepend_request(QueuedRequest("old", 300, resumed=True))  # preempted: back at the front
    asked = []
    assert queue.plan_step([first], 1024, free_seats=4, demand=lambda r, left: asked.append(r) or left) == {}
    assert asked == []


def test_negative_priority_partial_ranks_in_the_priority_group() -> None:
    queue = queue_for("hrrn")
    elevated = QueuedRequest("e", 5000, priority=-1)
    queue.add_request(elevated)
    start(queue, elevated, 1000)
    queue.add_request(QueuedRequest("w", 10))
    queue.on_prefill_submitted(10000)
    assert queue.plan_step([elevated], 1024, free_seats=4) == {"e": 1024}


@pytest.mark.parametrize("policy", RANKING)
def test_work_conserving_budget_waiting_requests_cannot_use_goes_on(policy: str) -> None:
    queue = queue_for(policy, threshold=256)
    long = QueuedRequest("long", 8000)
    queue.add_request(long)
    start(queue, long, 10)
    queue.on_prefill_submitted(100000)  # every later arrival would outrank it under hrrn only after aging
    for i in range(3):
        queue.add_request(QueuedRequest(f"s{i}", 30))
    # no free seat: the waiting requests cannot run, so the partial takes the whole budget
    assert queue.plan_step([long], 1024, free_seats=0) == {"long": 1024}
    # no KV blocks for the waiting requests (demand 0): the same
    assert queue.plan_step([long], 1024, free_seats=9, demand=lambda r, b: 0 if r is not long else
                           min(b, r.remaining_prefill_tokens)) == {"long": 1024}
    # too little remaining work: what the shorts leave goes to the partial, wherever it ranks
    assert queue.plan_step([long], 1024, free_seats=9)["long"] >= 1024 - 90


def test_plan_step_stops_at_the_last_partial() -> None:
    """The walk asks about the waiting requests ranked ahead of the last partial only (O(k log n))."""
    queue = queue_for("hrrn")
    long = QueuedRequest("long", 8000)
    queue.add_request(long)
    start(queue, long, 10)
    for i in range(1000):
        queue.add_request(QueuedRequest(f"w{i}", 30))
    asked = []

    def demand(request, budget):
        asked.append(request.request_id)
        return min(budget, request.remaining_prefill_tokens)

    assert queue.plan_step([long], 1024, free_seats=9, demand=demand) == {"long": 1024}
    assert asked == ["long"]


def test_unknown_partial_enters_now_and_keeps_that_state() -> None:
    queue = queue_for("hrrn")
    queue.on_prefill_submitted(500)
    stranger = QueuedRequest("x", 2000, cached_tokens=1000)
    queue.add_request(QueuedRequest("w", 100))
    assert queue.plan_step([stranger], 50, free_seats=4) == {"x": 0}  # tie at score 0: w arrived first
    queue.on_prefill_submitted(100)  # x: 100/1000 (bound at its first plan), w: 100/100
    assert queue.plan_step([stranger], 150, free_seats=4) == {"x": 50}


def test_a_waiting_request_is_not_a_partial() -> None:
    queue = queue_for("hrrn")
    request = QueuedRequest("a", 100)
    queue.add_request(request)
    with pytest.raises(ValueError, match="waiting"):
        queue.plan_step([request], 100, free_seats=1)


# --- against the naive reference model, step by step ------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), budget=st.sampled_from([64, 300, 1024]),
       seats=st.sampled_from([2, 4, 16]), wait_ms=st.sampled_from([0.0, 3.0, 20.0]),
       steps=st.integers(5, 60))
def test_budget_split_matches_reference_step_by_step(policy: str, seed: int, budget: int, seats: int,
                                                     wait_ms: float, steps: int) -> None:
    """A small engine loop: plan, give partials their caps, admit waiting requests in order, end the step."""
    rng = random.Random(seed)
    clock = Clock()
    queue = queue_for(policy, clock, threshold=100, long_max_wait_ms=wait_ms)
    ref = RefQueue(policy, 100, wait_ms, clock=clock)
    chunk_limit = rng.choice([0, 0, 128])
    blocked = set()  # requests that cannot get KV blocks
    running: list[QueuedRequest] = []
    counter = 0

    def need(request: QueuedRequest, left: int) -> int:
        chunk = request.remaining_prefill_tokens
        if chunk_limit:
            chunk = min(chunk, chunk_limit)
        return 0 if request.request_id in blocked else min(chunk, left)

    for _ in range(steps):
        for _ in range(rng.choice([0, 0, 1, 3])):
            request = QueuedRequest(f"r{counter:03d}", rng.choice([5, 40, 90, 150, 400, 2000]),
                                    priority=rng.choice([0] * 8 + [-1]), resumed=rng.random() < 0.1)
            counter += 1
            if rng.random() < 0.1:
                blocked.add(request.request_id)
            queue.add_request(request)
            ref.add(request)
        clock.now += rng.choice([0.0, 0.001, 0.005])
        free = seats - len(running)
        caps = queue.plan_step(list(running), budget, free_seats=free, demand=need)
        if policy == "default":  # no caps: the engine's own rule, every partial first in running order
            assert caps == {}
            for request in running:
                caps[request.request_id] = need(request, budget - sum(caps.values()))
        else:
            assert caps == ref.plan(list(running), budget, free, need)
        left = budget - sum(caps.values())
        done = 0
        for request in running:
            request.cached_tokens += caps[request.request_id]
            done += caps[request.request_id]
        # vLLM's waiting loop: peek, stop at the first that cannot run, pop.
        while left > 0 and ref.items and len(running) < seats:
            head = queue.peek_request()
            assert head is ref.peek()
            take = need(head, left)
            if not take:
                break
            assert queue.pop_request() is ref.pop()
            head.cached_tokens += take
            left -= take
            done += take
            running.append(head)
        running = [r for r in running if r.remaining_prefill_tokens > 0]
        queue.on_prefill_submitted(done)
        ref.step(done)
    if policy == "short_request_first":
        stats = queue.stats()
        assert (stats["aged_long_promotions"], stats["degradation_warnings"]) == (ref.aged_promotions,
                                                                                  ref.warnings)
