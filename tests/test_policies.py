"""Every rule of SPEC §3 as a named test."""

from __future__ import annotations

import logging

import pytest

from prefillq import QueuedRequest, make_queue, order

R = QueuedRequest


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def fill(policy, requests, **kwargs):
    queue = make_queue(policy, **kwargs)
    for request in requests:
        queue.add_request(request)
    return queue


def drain(queue) -> list[str]:
    out = []
    while queue:
        out.append(queue.pop_request().request_id)
    return out


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# A fixture with decodes, an elevated request, and prompts of mixed lengths arriving longest first.
MIXED = [
    R("long-a", 16384), R("dec-1", 300, is_decode=True), R("long-b", 8192), R("mid", 1000),
    R("elev", 9000, priority=-1), R("short-a", 128), R("dec-2", 50, is_decode=True), R("short-b", 64),
    R("cached", 4096, cached_tokens=4000),
]


@pytest.mark.parametrize(("policy", "expected"), [
    ("default", ["dec-1", "dec-2", "elev", "long-a", "long-b", "mid", "short-a", "short-b", "cached"]),
    ("promote_shortest", ["dec-1", "dec-2", "elev", "short-b", "long-a", "long-b", "mid", "short-a", "cached"]),
    ("hrrn", ["dec-1", "dec-2", "elev", "long-a", "long-b", "mid", "short-a", "short-b", "cached"]),
    ("short_request_first", ["dec-1", "dec-2", "elev", "short-a", "short-b", "long-a", "long-b", "mid",
                             "cached"]),
])
def test_mixed_priority_fixture_order(policy, expected):
    queue = fill(policy, MIXED)
    assert ids(queue) == expected
    assert ids(order(policy, MIXED)) == expected


@pytest.mark.parametrize(("policy", "expected"), [
    ("default", ["p3", "p3b", "p2", "p1", "n"]),
    ("promote_shortest", ["p1", "p3", "p2", "p3b", "n"]),
    ("hrrn", ["p1", "p3", "p2", "p3b", "n"]),
    ("short_request_first", ["p1", "p3", "p2", "p3b", "n"]),
])
def test_priority_group_keeps_arrival_order_except_default(policy, expected):
    """SPEC §3.2/§3.3: only ``default`` sorts negative priorities by value; the others keep arrival order."""
    requests = [R("p1", 900, priority=-1), R("n", 5), R("p3", 50, priority=-3), R("p2", 10, priority=-2),
                R("p3b", 20, priority=-3)]
    queue = fill(policy, requests)
    assert ids(queue) == expected
    assert ids(order(policy, requests)) == expected
    assert [queue.pop_request().request_id for _ in requests] == expected


def test_promote_shortest_uses_remaining_prefill():
    # "cached" has 96 uncached tokens: it is the shortest once nothing shorter waits.
    queue = fill("promote_shortest", [R("a", 5000), R("cached", 4096, cached_tokens=4000), R("b", 128)])
    assert queue.pop_request().request_id == "cached"


def test_decodes_first_in_stable_order():
    requests = [R("p1", 10), R("d1", 900, is_decode=True), R("p2", 5), R("d2", 1, is_decode=True)]
    for policy in ("default", "promote_shortest", "hrrn", "srf"):
        assert ids(order(policy, requests))[:2] == ["d1", "d2"]
        assert ids(fill(policy, requests))[:2] == ["d1", "d2"]


def test_order_returns_new_list_and_leaves_input_untouched():
    requests = list(MIXED)
    snapshot = list(requests)
    result = order("promote_shortest", requests)
    assert result is not requests and requests == snapshot
    assert sorted(ids(result)) == sorted(ids(requests))


def test_default_is_stable_by_priority():
    queue = fill("fcfs", [R("a", 1), R("b", 1, priority=2), R("c", 1, priority=-3), R("d", 1), R("e", 1, priority=-3)])
    assert drain(queue) == ["c", "e", "a", "d", "b"]


def test_promote_shortest_promotes_only_one_per_step():
    queue = fill("promote_shortest", [R("a", 900), R("b", 500), R("c", 20), R("d", 10), R("e", 5)])
    assert queue.pop_request().request_id == "e"          # the one promotion of this step
    assert [queue.pop_request().request_id for _ in range(2)] == ["a", "b"]  # then plain FCFS
    queue.on_prefill_submitted(1000)                      # next step: one more promotion
    assert queue.pop_request().request_id == "d"
    assert queue.stats()["promotions"] == 2


def test_promote_shortest_tie_goes_to_earliest():
    queue = fill("promote_shortest", [R("a", 900), R("b", 7), R("c", 7)])
    assert queue.pop_request().request_id == "b"


def test_promote_shortest_keeps_others_relative_order():
    queue = fill("promote_shortest", [R("a", 900), R("b", 50), R("c", 10), R("d", 20)])
    assert ids(queue) == ["c", "a", "b", "d"]


def test_hrrn_new_arrivals_start_fcfs_then_short_overtakes():
    queue = fill("hrrn", [R("long", 8000), R("short", 100)])
    assert ids(queue) == ["long", "short"]                # both waited 0 tokens: arrival order
    queue.on_prefill_submitted(512)
    assert ids(queue) == ["short", "long"]                # 512/100 > 512/8000


def test_hrrn_aging_lets_long_request_overtake():
    queue = make_queue("hrrn")
    queue.add_request(R("long", 4000))
    queue.on_prefill_submitted(40_000)                    # long has waited 40k tokens: score 10
    queue.add_request(R("short", 100))
    queue.on_prefill_submitted(500)                       # short: 5.0, long: 10.125
    assert queue.peek_request().request_id == "long"
    queue.on_prefill_submitted(600)                       # short: 1100/100 = 11 > long 40600+... /4000
    assert queue.peek_request().request_id == "short"


def test_hrrn_cost_frozen_across_chunks():
    queue = make_queue("hrrn")
    big = R("big", 10_000)
    queue.add_request(big)
    queue.add_request(R("other", 5000))
    assert queue.pop_request() is big                     # both waited 0: arrival order
    # The engine computed a chunk and puts it back with fewer uncached tokens: the cost stays 10,000.
    chunked = R("big", 10_000, cached_tokens=8000)
    queue.prepend_request(chunked)
    queue.on_prefill_submitted(1000)
    # big: 1000/10000, other: 1000/5000 -> other first; with a re-bound cost (2000) big would win.
    assert ids(queue) == ["other", "big"]


def test_hrrn_ties_break_by_arrival_then_id():
    queue = fill("hrrn", [R("z", 100), R("a", 100), R("m", 100)])
    queue.on_prefill_submitted(300)
    assert ids(queue) == ["z", "a", "m"]


def test_hrrn_counter_only_moves_with_submitted_prefill():
    clock = FakeClock()
    queue = fill("hrrn", [R("long", 8000), R("short", 100)], clock=clock)
    clock.now += 3600.0                                   # wall-clock time alone ages nothing
    assert ids(queue) == ["long", "short"]
    queue.on_prefill_submitted(0)
    assert ids(queue) == ["long", "short"]


def test_hrrn_has_no_queue_depth_fallback():
    requests = [R(f"l{i:04d}", 8000) for i in range(300)] + [R("s", 10)]
    queue = fill("hrrn", requests)
    queue.on_prefill_submitted(100)
    assert queue.peek_request().request_id == "s"         # no FCFS fallback past 128 waiting


def srf(clock=None, threshold=256, wait_ms=0.0):
    return make_queue({"policy": "short_request_first", "threshold": threshold, "long_max_wait_ms": wait_ms},
                      clock=clock or FakeClock())


def test_srf_lane_choice():
    queue = srf()
    for request in [R("long", 257), R("short", 256), R("resumed", 9000, resumed=True)]:
        queue.add_request(request)
    assert queue.stats()["lanes"] == {"immediate": 1, "short": 1, "long": 1}
    assert drain(queue) == ["resumed", "short", "long"]


def test_srf_aged_long_promotion_with_fake_clock():
    clock = FakeClock()
    queue = srf(clock, wait_ms=2000)
    queue.add_request(R("long", 5000))
    clock.now += 1.0
    queue.add_request(R("s1", 100))
    queue.add_request(R("s2", 100))
    assert queue.peek_request().request_id == "s1"        # long waited 1 s < 2 s
    clock.now += 0.999
    queue.on_prefill_submitted(0)
    assert queue.peek_request().request_id == "s1"
    clock.now += 0.001                                    # exactly 2 s: aged
    queue.on_prefill_submitted(0)
    assert queue.pop_request().request_id == "long"
    assert queue.stats()["aged_long_promotions"] == 1


def test_srf_no_aging_when_wait_is_zero():
    clock = FakeClock()
    queue = srf(clock, wait_ms=0)
    queue.add_request(R("long", 5000))
    queue.add_request(R("short", 10))
    clock.now += 1e6
    assert drain(queue) == ["short", "long"]


def test_srf_long_goes_when_no_short_waits():
    queue = srf(wait_ms=0)
    queue.add_request(R("long", 5000))
    assert queue.pop_request().request_id == "long"
    assert queue.stats()["aged_long_promotions"] == 0


def test_srf_peek_pinning():
    clock = FakeClock()
    queue = srf(clock, wait_ms=1000)
    queue.add_request(R("long", 5000))
    queue.add_request(R("short", 10))
    assert queue.peek_request().request_id == "short"
    clock.now += 5.0                                      # long is now aged, but the peek is pinned
    assert queue.peek_request().request_id == "short"
    assert queue.pop_request().request_id == "short"


def test_srf_pin_cleared_by_mutation():
    clock = FakeClock()
    queue = srf(clock, wait_ms=1000)
    queue.add_request(R("long", 5000))
    queue.add_request(R("short", 10))
    assert queue.peek_request().request_id == "short"
    clock.now += 5.0
    queue.add_request(R("short2", 10))                    # any change clears the pin
    assert queue.pop_request().request_id == "long"


def test_peek_then_pop_returns_same_object_for_every_policy():
    for policy in ("default", "promote_shortest", "hrrn", "srf"):
        queue = fill(policy, MIXED)
        while queue:
            peeked = queue.peek_request()
            assert queue.pop_request() is peeked


def test_empty_queue_raises_index_error():
    for policy in ("default", "promote_shortest", "hrrn", "srf"):
        queue = make_queue(policy)
        with pytest.raises(IndexError):
            queue.peek_request()
        with pytest.raises(IndexError):
            queue.pop_request()


def _aged_srf(clock):
    queue = srf(clock, wait_ms=10)
    for i in range(5):
        queue.add_request(R(f"long{i}", 5000))
    clock.now += 1.0
    for i in range(5):
        queue.add_request(R(f"short{i}", 10))
    return queue


def test_srf_degradation_warning_after_three(caplog):
    clock = FakeClock()
    queue = _aged_srf(clock)
    with caplog.at_level(logging.WARNING, logger="prefillq"):
        assert [queue.pop_request().request_id for _ in range(2)] == ["long0", "long1"]
        assert queue.stats()["degradation_warnings"] == 0
        assert not caplog.records
        assert queue.pop_request().request_id == "long2"
    assert queue.stats()["degradation_warnings"] == 1
    assert "threshold" in caplog.records[0].getMessage()
    assert caplog.records[0].levelno == logging.WARNING


def test_srf_degradation_streak_resets_on_short_dispatch():
    clock = FakeClock()
    queue = _aged_srf(clock)
    queue.pop_request()
    queue.pop_request()
    queue.remove_request(R("long2", 5000))
    queue.remove_request(R("long3", 5000))
    queue.remove_request(R("long4", 5000))                 # no aged long left: a short goes
    assert queue.pop_request().request_id == "short0"
    assert queue.stats()["degradation_streak"] == 0
    queue.add_request(R("longX", 5000))
    clock.now += 1.0
    assert queue.pop_request().request_id == "longX"
    assert queue.stats()["degradation_streak"] == 1
    assert queue.stats()["degradation_warnings"] == 0


def test_srf_degradation_streak_resets_when_short_lane_empties():
    clock = FakeClock()
    queue = _aged_srf(clock)
    queue.pop_request()
    queue.pop_request()
    queue.remove_requests([R(f"short{i}", 10) for i in range(5)])
    assert queue.stats()["degradation_streak"] == 0


def test_stats_line_every_interval(caplog):
    clock = FakeClock()
    queue = make_queue({"policy": "srf", "stats_interval_s": 5.0}, clock=clock)
    with caplog.at_level(logging.INFO, logger="prefillq"):
        queue.add_request(R("a", 10))
        clock.now += 4.9
        queue.add_request(R("b", 10))
        assert not [r for r in caplog.records if "stats" in r.getMessage()]
        clock.now += 0.2
        queue.pop_request()
        lines = [r.getMessage() for r in caplog.records if "prefillq stats" in r.getMessage()]
        assert len(lines) == 1
        assert "short=1" in lines[0] and "aged_long_promotions=0" in lines[0]
        clock.now += 1.0
        queue.pop_request()                                 # too soon for another line
        assert len([r for r in caplog.records if "prefillq stats" in r.getMessage()]) == 1


def test_pop_then_prepend_in_the_same_step_is_not_a_dispatch(caplog):
    """SPEC §3.0: a long request skipped three times raises no warning and counts in no statistic."""
    clock = FakeClock()
    queue = _aged_srf(clock)
    with caplog.at_level(logging.WARNING, logger="prefillq"):
        for _ in range(3):
            skipped = queue.pop_request()
            assert skipped.request_id == "long0"
            queue.prepend_request(skipped)
            queue.on_prefill_submitted(0)
        stats = queue.stats()
    assert not caplog.records
    assert stats["dispatched"] == {} and stats["prepends"] == 0
    assert stats["aged_long_promotions"] == 0 and stats["degradation_streak"] == 0


def test_skip_declared_right_after_the_pop_undoes_a_pending_warning(caplog):
    clock = FakeClock()
    queue = _aged_srf(clock)
    with caplog.at_level(logging.WARNING, logger="prefillq"):
        queue.pop_request()
        queue.pop_request()
        third = queue.pop_request()          # would complete the streak of 3
        queue.skip_request(third)            # ... but vLLM only popped it to skip it
        assert queue.pop_request().request_id == "long3"   # this one completes it
        queue.prepend_request(third)         # the skipped one comes back at the end of the step
        queue.on_prefill_submitted(0)
    assert queue.stats()["degradation_warnings"] == 1
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert queue.stats()["dispatched"] == {"long": 3}


def test_skipped_pop_does_not_use_up_the_promotion():
    queue = fill("promote_shortest", [R("a", 5000), R("b", 9000), R("tiny", 5), R("small", 50)])
    first = queue.pop_request()
    assert first.request_id == "tiny"
    queue.skip_request(first)                 # tiny must wait (e.g. its grammar is not compiled)
    assert queue.pop_request().request_id == "small"   # the promotion is still there this step
    assert queue.pop_request().request_id == "a"       # then plain FCFS
    queue.prepend_request(first)
    queue.on_prefill_submitted(0)
    assert queue.stats()["promotions"] == 1
    assert queue.stats()["dispatched"] == {"queue": 2}
    assert queue.pop_request().request_id == "tiny"


def test_stats_report_lanes_dispatches_prepends_and_waits():
    clock = FakeClock()
    queue = srf(clock)
    queue.add_request(R("s", 10))
    queue.add_request(R("l", 1000))
    clock.now += 2.0
    popped = queue.pop_request()
    queue.on_prefill_submitted(10)   # dispatched in that step; back later (preempted)
    queue.prepend_request(popped)
    stats = queue.stats()
    assert stats["lanes"] == {"immediate": 0, "short": 1, "long": 1}
    assert stats["dispatched"] == {"short": 1}
    assert stats["prepends"] == 1
    assert stats["longest_wait_s"]["short"] == pytest.approx(2.0)   # prepend kept the enqueue time


def test_prepend_keeps_original_enqueue_time():
    clock = FakeClock()
    queue = srf(clock, wait_ms=1000)
    queue.add_request(R("long", 5000))
    queue.add_request(R("short", 10))
    clock.now += 0.5
    queue.add_request(R("short2", 10))
    queue.on_prefill_submitted(0)
    # The long request is popped (only long would go if shorts were absent); simulate a skip:
    long = next(r for r in queue if r.request_id == "long")
    queue.remove_request(long)                             # aborted and forgotten...
    queue.add_request(long)                                # ...then a fresh add starts a new wait
    clock.now += 0.6
    assert queue.peek_request().request_id == "short"      # waited 0.6 s only
    # Contrast: a popped-then-prepended long request keeps its first enqueue time.
    queue2 = srf(clock, wait_ms=1000)
    queue2.add_request(R("long", 5000))
    first = queue2.pop_request()
    clock.now += 0.6
    queue2.prepend_request(first)
    queue2.add_request(R("short", 10))
    clock.now += 0.5                                        # 1.1 s since it first entered
    assert queue2.peek_request().request_id == "long"


def test_prepend_goes_to_front_of_its_group():
    queue = fill("default", [R("a", 10), R("b", 10), R("c", 10)])
    a = queue.pop_request()
    b = queue.pop_request()
    queue.prepend_requests([b, a])  # vLLM hands skipped requests back in reverse (deque extendleft)
    assert ids(queue) == ["a", "b", "c"]


def test_preempted_request_resumes_first_under_srf():
    queue = srf()
    queue.add_request(R("short", 10))
    long = R("long", 5000)
    queue.add_request(long)
    queue.pop_request()
    queue.pop_request()
    queue.add_request(R("short2", 10))
    queue.prepend_request(R("long", 5000, output_tokens=3, resumed=True))
    assert queue.pop_request().request_id == "long"


def test_remove_tolerates_unknown_requests_and_duplicates():
    queue = fill("hrrn", [R("a", 10), R("b", 20)])
    queue.remove_requests([R("zzz", 1), R("a", 10), R("a", 10)])
    assert ids(queue) == ["b"] and len(queue) == 1


def test_adding_a_queued_request_twice_is_refused():
    queue = fill("default", [R("a", 10)])
    with pytest.raises(ValueError, match="already queued"):
        queue.add_request(R("a", 10))


def test_len_bool_iter_consistent():
    queue = make_queue("srf")
    assert not queue and len(queue) == 0 and list(queue) == []
    queue.add_request(R("a", 10))
    assert queue and len(queue) == 1 and ids(queue) == ["a"]


def test_view_lets_the_queue_hold_engine_objects():
    class EngineRequest:
        def __init__(self, request_id, n):
            self.request_id, self.n = request_id, n

    engine_requests = [EngineRequest("x", 5000), EngineRequest("y", 10)]
    queue = make_queue("srf", view=lambda e: R(e.request_id, e.n))
    for e in engine_requests:
        queue.add_request(e)
    assert queue.pop_request() is engine_requests[1]


def test_on_prefill_submitted_rejects_bad_counts():
    queue = make_queue("hrrn")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            queue.on_prefill_submitted(bad)
