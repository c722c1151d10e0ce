"""The vLLM node's fast path for runs of decode-only steps gives what stepping one by one gives, to the bit."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import make_queue
from prefillq.sim import CostModel, Profile, simulate
from prefillq.sim.clairvoyant import KEYS, Schedule
from prefillq.sim.costs import RooflineCostModel
from prefillq.sim.vllm import VllmNode
from prefillq.workload import RequestSpec, Workload

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto", "default+ordered",
            "promote_shortest+ordered", "hrrn+ordered", "short_request_first+ordered", "auto+ordered",
            *(f"reference:{key}" for key in KEYS)]  # compare's clairvoyant reference schedules too


def _workload(requests: list[tuple[float, int, int]]) -> Workload:
    specs = [RequestSpec(f"r{i}", at, prompt, out, "long" if prompt > 200 else "short")
             for i, (at, prompt, out) in enumerate(requests)]
    return Workload("fast", sorted(specs, key=lambda s: s.arrival_s), {})


@st.composite
def cases(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    requests = [(draw(st.integers(0, 300)) / 100.0, draw(st.integers(1, 400)), draw(st.integers(1, 60)))
                for _ in range(draw(st.integers(1, 14)))]
    largest = max(math.ceil((p + o) / block_size) for _, p, o in requests)
    limits = {"max_num_batched_tokens": draw(st.integers(4, 256)), "max_num_seqs": draw(st.integers(1, 8)),
              "kv_blocks": draw(st.integers(largest + 1, largest * 3 + 8)), "block_size": block_size,
              "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 32]))}
    c = (0.004, draw(st.sampled_from([1e-5, 1e-4])), draw(st.sampled_from([0.0, 1e-7])), 3e-4, 2e-6)
    cost = (RooflineCostModel(*c, knee_tokens=draw(st.sampled_from([1.0, 20.0])), knee_exponent=0.5)
            if draw(st.booleans()) else CostModel(*c))
    return _workload(requests), Profile("t", "", "", cost, limits), draw(st.sampled_from(POLICIES))


def _run(w: Workload, profile: Profile, policy: str, fast: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(VllmNode, "fast_steps", fast)
    if policy.startswith("reference:"):
        schedule = Schedule(policy.partition(":")[2])
        return simulate(w, schedule.config(), profile=profile, **schedule.engine_options("vllm"))
    name, _, partials = policy.partition("+")
    return simulate(w, {"policy": name, "partial_prefills": partials or "first"}, profile=profile)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_fast_decode_runs_match_stepping_one_by_one(case, monkeypatch):
    w, profile, config = case
    slow = _run(w, profile, config, False, monkeypatch)
    fast = _run(w, profile, config, True, monkeypatch)
    assert list(fast.records) == list(slow.records)  # every time, bit for bit (RequestRecord equality)
    assert list(fast.timeline) == list(slow.timeline)
    assert fast.lanes == slow.lanes
    assert (fast.steps, fast.preemptions, fast.sim_time_s) == (slow.steps, slow.preemptions, slow.sim_time_s)
    assert fast.summary == slow.summary


def test_a_lone_decode_runs_on_the_fast_path(monkeypatch):
    # One request, 50 output tokens, nothing else arriving: after its prefill step every step is a
    # decode-only step, the last one (where it finishes) included, and the fast path runs them all.
    w = _workload([(0.0, 100, 50)])
    profile = Profile("t", "", "", CostModel(0.01, 1e-4, 0.0, 1e-4, 1e-6),
                      {"max_num_batched_tokens": 256, "max_num_seqs": 4, "kv_blocks": 64, "block_size": 16})
    calls = []
    step = VllmNode.step

    def counted(self, now):
        calls.append(now)
        return step(self, now)

    monkeypatch.setattr(VllmNode, "step", counted)
    result = simulate(w, "default", profile=profile)
    assert result.steps == 50  # the prefill step (first token) and 49 decodes
    assert len(calls) == 1     # only the prefill step went through step()
    (record,) = result.records
    decodes = sum(0.01 + 1e-4 + 1e-6 * (100 + k) for k in range(1, 50))  # context 101, 102, ... 149
    assert record.e2e_s == pytest.approx(0.01 + 100e-4 + decodes)


@pytest.mark.parametrize("policy", ["default", "promote_shortest", "hrrn", "short_request_first", "auto"])
def test_steps_without_prefill_at_once_count_as_that_many_calls(policy):
    from prefillq.requests import QueuedRequest

    one_by_one, at_once = make_queue(policy, clock=lambda: 1.0), make_queue(policy, clock=lambda: 1.0)
    for queue in (one_by_one, at_once):
        queue.add_request(QueuedRequest(request_id="a", prompt_tokens=10))
        queue.on_prefill_submitted(5)
    for _ in range(7):
        one_by_one.on_prefill_submitted(0)
    at_once.on_prefill_submitted(0, steps=7)
    assert one_by_one.stats() == at_once.stats()
    assert one_by_one.pop_request().request_id == at_once.pop_request().request_id == "a"
    for bad in ({"num_tokens": 3, "steps": 2}, {"num_tokens": 0, "steps": 0}, {"num_tokens": 0, "steps": 1.5}):
        with pytest.raises(ValueError, match="num_tokens"):
            at_once.on_prefill_submitted(**bad)


@pytest.mark.parametrize("cost", [CostModel(0.003, 2e-6, 7e-10, 4e-7, 2.6e-8),
                                  RooflineCostModel(0.003, 2e-6, 7e-10, 4e-7, 2.6e-8, knee_tokens=19.8,
                                                    knee_exponent=0.5)])
def test_decode_step_terms_give_step_latency_bit_for_bit(cost):
    for n in (1, 7, 64, 255):
        base, per_token = cost.decode_step_terms(n)
        for context in (0, 1, 999, 123_457, 10**9 + 7):
            assert base + per_token * context == cost.step_latency(0, 0, n, context)

