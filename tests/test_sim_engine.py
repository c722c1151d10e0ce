"""The simulated engines: hand-computed tiny cases, conservation, and a naive reference model."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import make_queue
from prefillq.requests import QueuedRequest
from prefillq.sim import CostModel, EngineLimits, Profile, simulate
from prefillq.sim.costs import DEFAULT_LIMITS
from prefillq.sim.lightllm import ADDED_OUTPUT_LEN, SCHEDULES
from prefillq.workload import RequestSpec, Workload

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first", "auto"]


def profile(c0=0.01, c1=0.001, c2=0.0, c3=0.0, c4=0.0, **limits) -> Profile:
    defaults = dict(DEFAULT_LIMITS)
    defaults.update(limits)
    return Profile("test", "", "", CostModel(c0, c1, c2, c3, c4), defaults)


def workload(*requests: tuple[str, float, int, int]) -> Workload:
    specs = [RequestSpec(rid, at, prompt, out, "long" if prompt > 100 else "short")
             for rid, at, prompt, out in requests]
    return Workload("tiny", sorted(specs, key=lambda s: s.arrival_s), {})


def by_id(result):
    return {r.request_id: r for r in result.records}


# --- hand-computed cases --------------------------------------------------------------------------


def test_fcfs_chunked_prefill_by_hand():
    # c0 = 10 ms per step, c1 = 1 ms per prefill token, budget 100.
    # step 0 [0, .11]: A chunk 100. step 1 [.11, .22]: A chunk 50 (running first), then B 50 from waiting.
    # A and B sample their first token at .22; B (1 output token) is done; A decodes at .23 and .24.
    res = simulate(workload(("A", 0.0, 150, 3), ("B", 0.0, 50, 1)), "default", profile=profile(), budget=100)
    recs = by_id(res)
    assert recs["A"].ttft_s == pytest.approx(0.22)
    assert recs["B"].ttft_s == pytest.approx(0.22)
    assert recs["B"].e2e_s == pytest.approx(0.22)
    assert recs["A"].e2e_s == pytest.approx(0.24)
    assert recs["A"].itl_s == pytest.approx([0.01, 0.01])
    assert res.steps == 4


def test_promote_shortest_lets_the_short_one_go_first_by_hand():
    # step 0: B (50) promoted, then A gets the remaining 50; B done at .11.
    # step 1: A 100 more -> first token at .22; decodes at .23, .24.
    res = simulate(workload(("A", 0.0, 150, 3), ("B", 0.0, 50, 1)), "promote_shortest", profile=profile(),
                   budget=100)
    recs = by_id(res)
    assert recs["B"].ttft_s == pytest.approx(0.11)
    assert recs["A"].ttft_s == pytest.approx(0.22)
    assert recs["A"].e2e_s == pytest.approx(0.24)


def test_arrival_during_a_step_waits_for_the_next_step_and_idle_engine_jumps():
    # A (100) runs [0, .11]; C arrives at .05, is admitted at .11 and runs [.11, .16] (10 ms + 40 tokens).
    # D arrives at 5 s on an idle engine: its step runs [5, 5.03].
    res = simulate(workload(("A", 0.0, 100, 1), ("C", 0.05, 40, 1), ("D", 5.0, 20, 1)), "default",
                   profile=profile(), budget=100)
    recs = by_id(res)
    assert recs["A"].ttft_s == pytest.approx(0.11)
    assert recs["C"].ttft_s == pytest.approx(0.16 - 0.05)
    assert recs["D"].ttft_s == pytest.approx(0.03)


def test_running_prefill_is_scheduled_before_waiting_requests_in_vllm_mode():
    # vLLM: the long request admitted first keeps the budget (running requests first) even under hrrn;
    # the short one arriving during step 0 only gets in when A's prefill leaves room.
    res = simulate(workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1)), "hrrn", profile=profile(), budget=100)
    recs = by_id(res)
    # steps of A: [0,.11], [.11,.22], [.22,.33]: B cannot join before step 3 (budget spent on A)
    assert recs["A"].ttft_s == pytest.approx(0.33)
    assert recs["B"].ttft_s == pytest.approx(0.33 + 0.03 - 0.001)


def test_lightllm_mode_skips_a_chunk_that_does_not_fit_and_keeps_walking():
    # chunk = budget = 100. Step 0: A 100 (full). Step 1: A 100. Step 2: A's last 10 tokens leave 90:
    # B (50) fits, C (60) is skipped. Step 3: C. Costs: .11, .11, .07, .07.
    res = simulate(workload(("A", 0.0, 210, 1), ("B", 0.0, 50, 1), ("C", 0.0, 60, 1)), "default",
                   profile=profile(), budget=100, mode="lightllm")
    recs = by_id(res)
    assert recs["A"].ttft_s == pytest.approx(0.29)
    assert recs["B"].ttft_s == pytest.approx(0.29)
    assert recs["C"].ttft_s == pytest.approx(0.36)


def test_decode_and_attention_terms_of_the_cost_model():
    # c2 = 1e-6 per token^2, c4 = 1e-4 per decode context token, c3 = 1 ms per decode.
    # prefill 10 tokens: .01 + .01 + 1e-6 * 10 * 5 = .02005; decode (context 11): .01 + .001 + .0011.
    prof = profile(c0=0.01, c1=0.001, c2=1e-6, c3=0.001, c4=1e-4)
    res = simulate(workload(("A", 0.0, 10, 2)), "default", profile=prof, budget=100)
    rec = res.records[0]
    assert rec.ttft_s == pytest.approx(0.02005)
    assert rec.itl_s == pytest.approx([0.01 + 0.001 + 11 * 1e-4])


def test_budget_below_one_and_unknown_mode_or_topology_are_errors():
    w = workload(("A", 0.0, 10, 1))
    with pytest.raises(ValueError, match="budget"):
        simulate(w, "default", profile=profile(), budget=0)
    with pytest.raises(ValueError, match="mode"):
        simulate(w, "default", profile=profile(), mode="sglang")
    with pytest.raises(ValueError, match="topology"):
        simulate(w, "default", profile=profile(), topology="2p2d")


# --- a naive reference of the vLLM step loop (per request, no aggregates) -------------------------


class RefRequest:
    def __init__(self, spec: RequestSpec) -> None:
        self.request_id = spec.request_id
        self.spec = spec
        self.prompt = spec.prompt_tokens
        self.computed = 0
        self.out = 0
        self.target = spec.prompt_tokens
        self.blocks = 0
        self.preempted = 0
        self.prefilling = True
        self.times: list[float] = []


def reference_run(w: Workload, policy: str, cost: CostModel, lim: EngineLimits) -> dict[str, list[float]]:
    state = {"now": 0.0}

    def view(r: RefRequest) -> QueuedRequest:
        return QueuedRequest(r.request_id, r.prompt, r.computed, r.out,
                             resumed=r.preempted > 0 or r.out > 0 or r.computed > 0)

    waiting = make_queue(policy, clock=lambda: state["now"], view=view)
    running: list[RefRequest] = []
    free = lim.kv_blocks
    bs = lim.block_size
    pending = [RefRequest(s) for s in w.requests]
    done: dict[str, list[float]] = {}
    now = 0.0
    while pending or waiting or running:
        while pending and pending[0].spec.arrival_s <= now:
            r = pending.pop(0)
            state["now"] = r.spec.arrival_s
            waiting.add_request(r)
        state["now"] = now
        budget = lim.max_num_batched_tokens
        scheduled: list[tuple[RefRequest, int]] = []
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            n = r.target - r.computed
            if r.prefilling and lim.long_prefill_token_threshold:
                n = min(n, lim.long_prefill_token_threshold)
            n = min(n, budget)
            if n <= 0:
                i += 1
                continue
            need = math.ceil((r.computed + n) / bs) - r.blocks
            gave_up = False
            while need > free:
                v = running.pop()
                free += v.blocks
                v.blocks, v.computed, v.target, v.prefilling = 0, 0, v.prompt + v.out, True
                v.preempted += 1
                waiting.prepend_request(v)
                preempted = True
                if v is r:
                    gave_up = True
                    break
            if gave_up:
                break
            free -= need
            r.blocks += need
            scheduled.append((r, n))
            budget -= n
            i += 1
        if not preempted:
            while budget > 0 and waiting and len(running) < lim.max_num_seqs:
                r = waiting.peek_request()
                n = r.target - r.computed
                if lim.long_prefill_token_threshold:
                    n = min(n, lim.long_prefill_token_threshold)
                n = min(n, budget)
                need = math.ceil((r.computed + n) / bs) - r.blocks
                if need > free:
                    break
                assert waiting.pop_request() is r
                free -= need
                r.blocks += need
                running.append(r)
                scheduled.append((r, n))
                budget -= n
        prefill_tokens = sum(n for r, n in scheduled if r.prefilling)
        waiting.on_prefill_submitted(prefill_tokens)
        if not scheduled:
            now = pending[0].spec.arrival_s
            continue
        attention = sum(cost.attention_work(n, r.computed) for r, n in scheduled if r.prefilling)
        decodes = [r for r, n in scheduled if not r.prefilling]
        context = sum(r.computed + 1 for r in decodes)
        now += cost.step_latency(prefill_tokens, attention, len(decodes), context)
        for r, n in scheduled:
            r.computed += n
            if r.computed == r.target:
                r.out += 1
                r.times.append(now)
                r.prefilling = False
                r.target = r.prompt + r.out
                if r.out == r.spec.output_tokens:
                    running.remove(r)
                    free += r.blocks
                    done[r.request_id] = r.times
    assert free == lim.kv_blocks
    return done


@st.composite
def small_cases(draw):
    n = draw(st.integers(1, 10))
    block_size = draw(st.sampled_from([1, 4, 16]))
    requests = []
    for i in range(n):
        requests.append((f"r{i}", draw(st.integers(0, 40)) / 100.0, draw(st.integers(1, 300)),
                         draw(st.integers(1, 12))))
    largest = max(math.ceil((p + o) / block_size) for _, _, p, o in requests)
    kv_blocks = draw(st.integers(largest + 1, largest * 4 + 8))
    lim = EngineLimits(
        max_num_batched_tokens=draw(st.integers(4, 256)),
        max_num_seqs=draw(st.integers(1, 6)),
        kv_blocks=kv_blocks,
        block_size=block_size,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 32])),
    )
    policy = draw(st.sampled_from(POLICIES))
    cost = CostModel(0.005, draw(st.sampled_from([1e-4, 1e-3])), draw(st.sampled_from([0.0, 1e-7])), 1e-4, 1e-6)
    return workload(*requests), lim, policy, cost


def _profile_for(cost: CostModel, lim: EngineLimits) -> Profile:
    return Profile("t", "", "", cost, {"max_num_batched_tokens": lim.max_num_batched_tokens,
                                       "max_num_seqs": lim.max_num_seqs, "kv_blocks": lim.kv_blocks,
                                       "block_size": lim.block_size,
                                       "long_prefill_token_threshold": lim.long_prefill_token_threshold})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cases())
def test_vllm_engine_matches_the_naive_reference_and_conserves(case):
    w, lim, policy, cost = case
    res = simulate(w, policy, profile=_profile_for(cost, lim), record_steps=True)
    node = res.node
    reference = reference_run(w, policy, cost, lim)
    # every request finishes exactly once, with every output token, at the reference's times
    assert sorted(r.request_id for r in node.finished) == sorted(s.request_id for s in w.requests)
    for rec, spec in zip(sorted(res.records, key=lambda r: r.request_id),
                         sorted(w.requests, key=lambda s: s.request_id), strict=True):
        assert rec.error is None
        assert len(rec.itl_s) + 1 == spec.output_tokens
        times = reference[rec.request_id]
        assert rec.ttft_s == pytest.approx(times[0] - spec.arrival_s, abs=1e-9)
        assert rec.e2e_s == pytest.approx(times[-1] - spec.arrival_s, abs=1e-9)
        assert rec.itl_s == pytest.approx([b - a for a, b in itertools.pairwise(times)], abs=1e-9)
    # limits hold in every step; KV is all returned at the end
    prompt_total = sum(s.prompt_tokens for s in w.requests)
    chunk_total = 0
    for step in node.steps:
        tokens = sum(c for _, c in step.prefill_chunks) + step.num_decodes
        assert 0 < tokens <= lim.max_num_batched_tokens
        assert step.running <= lim.max_num_seqs
        assert 0 <= step.used_blocks <= lim.kv_blocks
        chunk_total += sum(c for _, c in step.prefill_chunks)
    assert chunk_total >= prompt_total
    if res.preemptions == 0:
        assert chunk_total == prompt_total
    assert node.free_blocks == lim.kv_blocks
    assert node.decode_context == 0 and not any(node.block_boundary)


@settings(max_examples=80, deadline=None)
@given(small_cases(), st.sampled_from(SCHEDULES), st.booleans(), st.sampled_from([0.0, 0.03]))
def test_lightllm_engine_conserves(case, schedule, gate, tick):
    w, lim, policy, cost = case
    # LightLLM's router admits a request only if its estimated peak (prompt + output + 2 per chunk
    # + 16 tokens of slack, get_tuple_tokens) is below the capacity: give every request room for that.
    chunk = min(lim.long_prefill_token_threshold or lim.max_num_batched_tokens, lim.max_num_batched_tokens)
    slack = max(2 * math.ceil(r.prompt_tokens / chunk) + ADDED_OUTPUT_LEN + 1 for r in w.requests)
    lim = dataclasses.replace(lim, kv_blocks=lim.kv_blocks + math.ceil(slack / lim.block_size))
    res = simulate(w, policy, profile=_profile_for(cost, lim), mode="lightllm", record_steps=True,
                   schedule=schedule, prefill_token_gate=gate, router_tick_s=tick)
    node = res.node
    assert sorted(r.request_id for r in node.finished) == sorted(s.request_id for s in w.requests)
    assert len(node.finished) == len(w.requests)
    for rec in res.records:
        assert rec.error is None and len(rec.itl_s) + 1 == rec.output_tokens
        assert rec.ttft_s > 0 and rec.e2e_s >= rec.ttft_s
    chunk_total = 0
    for step in node.steps:
        assert sum(c for _, c in step.prefill_chunks) <= lim.max_num_batched_tokens
        assert step.running <= lim.max_num_seqs
        assert step.used_blocks <= lim.kv_blocks
        chunk_total += sum(c for _, c in step.prefill_chunks)
    assert chunk_total == sum(s.prompt_tokens for s in w.requests)
    assert node.reserved_tokens == 0
    # Naive replay of the recorded steps: every decoding request gets one token in each step that
    # carries decodes (all of them at once), from the step after its prefill until its output is done.
    spec = {r.request_id: r for r in w.requests}
    computed = dict.fromkeys(spec, 0)
    times: dict[str, list[float]] = {rid: [] for rid in spec}
    decoding: list[str] = []
    for step in node.steps:
        assert step.num_decodes in (0, len(decoding))
        if step.num_decodes:
            for rid in decoding:
                times[rid].append(step.end_s)
        decoding = [rid for rid in decoding if len(times[rid]) < spec[rid].output_tokens]
        for rid, chunk in step.prefill_chunks:
            computed[rid] += chunk
            if computed[rid] == spec[rid].prompt_tokens:
                times[rid].append(step.end_s)
                if spec[rid].output_tokens > 1:
                    decoding.append(rid)
    assert not decoding
    for rec in res.records:
        expected = times[rec.request_id]
        assert rec.ttft_s == pytest.approx(expected[0] - spec[rec.request_id].arrival_s)
        assert rec.itl_s == pytest.approx([b - a for a, b in itertools.pairwise(expected)])


def test_kv_pressure_preempts_the_newest_and_everything_still_finishes():
    # 4 requests of 64 prompt + 64 output tokens with room for ~2.5 of them: decodes must preempt.
    w = workload(*[(f"r{i}", 0.0, 64, 64) for i in range(4)])
    prof = profile(kv_blocks=20, block_size=16, max_num_batched_tokens=512)
    res = simulate(w, "default", profile=prof, record_steps=True)
    assert res.preemptions > 0
    assert res.summary["completed"] == 4
    assert all(step.used_blocks <= 20 for step in res.node.steps)
    assert res.node.free_blocks == 20


def test_request_larger_than_the_kv_cache_is_a_clear_error():
    from prefillq.sim import SimulationError

    with pytest.raises(SimulationError, match=r"needs .* KV blocks"):
        simulate(workload(("A", 0.0, 1000, 1)), "default", profile=profile(kv_blocks=4, block_size=16))
