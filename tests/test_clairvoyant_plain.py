"""The reference schedules' lean queue (PlainClairvoyantQueue, on a plain vLLM node) gives what the generic
ClairvoyantQueue gives, to the bit: the same schedule on random workloads, preemptions and several partial
prefills included, and the same compare bracket."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq.sim import CostModel, Profile, simulate
from prefillq.sim.clairvoyant import KEYS, ClairvoyantQueue, PlainClairvoyantQueue, Schedule
from prefillq.workload import RequestSpec, Workload


def _workload(requests: list[tuple[float, int, int]]) -> Workload:
    specs = [RequestSpec(f"r{i}", at, prompt, out, "long" if prompt > 200 else "short")
             for i, (at, prompt, out) in enumerate(requests)]
    return Workload("plain", sorted(specs, key=lambda s: s.arrival_s), {})


@st.composite
def cases(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    requests = [(draw(st.integers(0, 300)) / 100.0, draw(st.integers(1, 400)), draw(st.integers(1, 60)))
                for _ in range(draw(st.integers(1, 24)))]
    largest = max(math.ceil((p + o) / block_size) for _, p, o in requests)
    limits = {"max_num_batched_tokens": draw(st.integers(4, 256)), "max_num_seqs": draw(st.integers(1, 8)),
              "kv_blocks": draw(st.integers(largest + 1, largest * 2 + 8)), "block_size": block_size,
              "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 32]))}
    cost = CostModel(0.004, draw(st.sampled_from([1e-5, 1e-4])), 0.0, 3e-4, 2e-6)
    schedule = Schedule(draw(st.sampled_from(sorted(KEYS))), draw(st.sampled_from(["ordered", "first"])))
    return _workload(requests), Profile("t", "", "", cost, limits), schedule


def _run(w: Workload, profile: Profile, schedule: Schedule, generic: bool):
    options = schedule.engine_options("vllm")
    if generic:
        def queue(clock, view):
            return ClairvoyantQueue(KEYS[schedule.key], schedule.config(), clock=clock, view=view)

        options = {"queue": queue}
    result = simulate(w, schedule.config(), profile=profile, record_steps=True, **options)
    kind = type(result.node.waiting)
    assert kind is (ClairvoyantQueue if generic else PlainClairvoyantQueue)
    return result


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_the_plain_queue_schedules_as_the_generic_one(case):
    w, profile, schedule = case
    generic = _run(w, profile, schedule, True)
    plain = _run(w, profile, schedule, False)
    assert list(plain.records) == list(generic.records)
    assert [(s.prefill_chunks, s.num_decodes, s.preempted) for s in plain.node.steps] == \
        [(s.prefill_chunks, s.num_decodes, s.preempted) for s in generic.node.steps]
    assert plain.summary == generic.summary and plain.preemptions == generic.preemptions


def test_preemptions_and_several_partials_happen_in_these_cases():
    # the property above covers the plain queue's generic fallbacks too: a preempted request coming back
    w = _workload([(0.0, 300, 40), (0.0, 250, 30), (0.01, 20, 50), (0.02, 390, 20), (0.02, 15, 60), (0.03, 200, 80)])
    profile = Profile("t", "", "", CostModel(0.004, 1e-4, 0.0, 3e-4, 2e-6),
                      {"max_num_batched_tokens": 64, "max_num_seqs": 4, "kv_blocks": 120, "block_size": 4,
                       "long_prefill_token_threshold": 32})
    schedule = Schedule("short-first-srpt")
    generic, plain = _run(w, profile, schedule, True), _run(w, profile, schedule, False)
    assert plain.preemptions == generic.preemptions > 0
    assert max(len(s.prefill_chunks) for s in plain.node.steps) > 1
    assert list(plain.records) == list(generic.records)
