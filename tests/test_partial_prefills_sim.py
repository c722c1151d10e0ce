"""SPEC §3.6 in the simulator: vLLM mode with ``partial_prefills="ordered"`` (hand case, conservation,
no preemption caused, decodes never delayed) and LightLLM mode's order agreeing with the core's plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq import QueuedRequest, Ranker, make_queue
from prefillq.sim import EngineLimits, simulate
from prefillq.sim.costs import CostModel
from tests.test_prefix_cache import hashed, ids
from tests.test_sim_engine import POLICIES, _profile_for, by_id, profile, small_cases, workload


def ordered(policy: str, **options) -> dict:
    return {"policy": policy, "partial_prefills": "ordered", "stats_interval_s": 0, **options}


def test_short_request_gets_the_budget_ahead_of_a_partial_long_prefill_by_hand():
    # c0 = 10 ms per step, c1 = 1 ms per prefill token, budget 100; A (300) long, B (20) short arrives
    # during step 0. "first": A keeps the budget until its last chunk (B's TTFT .359, see test_sim_engine).
    # "ordered" srf: step 1 [.11,.22] runs A 80 + B 20 (B ranks ahead of the partial A, which gets
    # what B leaves); step 2 A 100; step 3 A's last 20 tokens [.33, .36].
    res = simulate(workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1)), ordered("short_request_first"),
                   profile=profile(), budget=100, record_steps=True)
    recs = by_id(res)
    assert recs["B"].ttft_s == pytest.approx(0.22 - 0.001)
    assert recs["A"].ttft_s == pytest.approx(0.36)
    assert [step.prefill_chunks for step in res.node.steps] == [
        [("A", 100)], [("A", 80), ("B", 20)], [("A", 100)], [("A", 20)]]


def test_first_is_the_engine_rule_by_hand():
    res = simulate(workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1)),
                   {"policy": "short_request_first", "partial_prefills": "first"}, profile=profile(), budget=100)
    assert by_id(res)["B"].ttft_s == pytest.approx(0.33 + 0.03 - 0.001)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cases(), st.sampled_from([0.0, 20.0]))
def test_ordered_conserves_and_respects_the_limits(case, wait_ms):
    w, lim, policy, cost = case
    res = simulate(w, ordered(policy, long_max_wait_ms=wait_ms), profile=_profile_for(cost, lim),
                   record_steps=True)
    node = res.node
    assert sorted(r.request_id for r in node.finished) == sorted(s.request_id for s in w.requests)
    for rec in res.records:
        assert rec.error is None and len(rec.itl_s) + 1 == rec.output_tokens
    steps = node.steps
    assert all(0 < sum(c for _, c in s.prefill_chunks) + s.num_decodes <= lim.max_num_batched_tokens for s in steps)
    assert all(s.running <= lim.max_num_seqs and 0 <= s.used_blocks <= lim.kv_blocks for s in steps)
    chunk_total = sum(c for s in steps for _, c in s.prefill_chunks)
    if res.preemptions == 0:
        assert chunk_total == sum(s.prompt_tokens for s in w.requests)  # every token prefilled once
    assert node.free_blocks == lim.kv_blocks


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cases())
def test_ordered_causes_no_preemption_and_never_delays_a_decode(case):
    """With KV for everything, nothing is preempted and every decode gets its token every step
    (the budget covers all decodes: max_num_seqs <= budget), so a holding-back plan never delays one."""
    w, lim, policy, cost = case
    need = sum(math.ceil((s.prompt_tokens + s.output_tokens) / lim.block_size) for s in w.requests)
    lim = EngineLimits(max(lim.max_num_batched_tokens, lim.max_num_seqs), lim.max_num_seqs, need + 1,
                       lim.block_size, lim.long_prefill_token_threshold)
    res = simulate(w, ordered(policy), profile=_profile_for(cost, lim), record_steps=True)
    assert res.preemptions == 0
    per_request: dict[str, int] = {}
    for step in res.node.steps:
        for rid, chunk in step.prefill_chunks:
            per_request[rid] = per_request.get(rid, 0) + chunk
    assert per_request == {s.request_id: s.prompt_tokens for s in w.requests}  # nothing recomputed
    for r in res.node.finished:
        assert len(r.token_runs) == 1  # one uninterrupted run of steps from first token to last
        first, last = r.token_runs[0]
        assert last - first + 1 == r.output_tokens


def test_ordered_with_long_prefill_token_threshold_keeps_it_as_a_ceiling():
    res = simulate(workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1)), ordered("short_request_first"),
                   profile=profile(long_prefill_token_threshold=60), budget=100, record_steps=True)
    assert all(chunk <= 60 for step in res.node.steps for _, chunk in step.prefill_chunks)
    assert res.node.steps[1].prefill_chunks == [("A", 60), ("B", 20)]


def test_default_policy_is_unchanged_by_ordered():
    w = workload(*[(f"r{i}", i * 0.003, 90 + 70 * (i % 3), 4) for i in range(12)])
    first = simulate(w, {"policy": "default"}, profile=profile(), budget=100).records
    same = simulate(w, ordered("default"), profile=profile(), budget=100).records
    assert [(r.request_id, r.ttft_s, r.e2e_s) for r in first] == [(r.request_id, r.ttft_s, r.e2e_s) for r in same]


@st.composite
def kv_tight_cases(draw):
    """Workloads whose KV cache holds only a few requests at once, so that decodes preempt partial prefills."""
    n = draw(st.integers(2, 12))
    block_size = draw(st.sampled_from([4, 16]))
    rows = [(f"r{i}", draw(st.integers(0, 30)) / 100.0, draw(st.integers(1, 400)), draw(st.integers(1, 40)))
            for i in range(n)]
    largest = max(math.ceil((p + o) / block_size) for _, _, p, o in rows)
    lim = EngineLimits(draw(st.integers(16, 256)), draw(st.integers(1, 8)), draw(st.integers(largest + 1, largest * 2)),
                       block_size, draw(st.sampled_from([0, 0, 48])))
    return workload(*rows), lim


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_tight_cases())
def test_default_policy_is_unchanged_by_ordered_under_preemption(case):
    """SPEC §3.6: `default` with "ordered" schedules exactly as with "first", preempted requests (which
    come back to the front of the queue) included: identical steps and records."""
    w, lim = case
    cost = CostModel(0.005, 1e-4, 0.0, 1e-4, 1e-6)
    runs = [simulate(w, {"policy": "default", "partial_prefills": mode, "stats_interval_s": 0},
                     profile=_profile_for(cost, lim), record_steps=True) for mode in ("first", "ordered")]
    first, same = ([(s.prefill_chunks, s.num_decodes, s.running) for s in r.node.steps] for r in runs)
    assert first == same
    assert runs[0].preemptions == runs[1].preemptions
    assert [(r.request_id, r.ttft_s, r.e2e_s) for r in runs[0].records] == \
        [(r.request_id, r.ttft_s, r.e2e_s) for r in runs[1].records]


def test_default_unchanged_by_ordered_covers_preemption():
    """The fuzz above is not vacuous: a KV-tight case of it preempts."""
    w = workload(("a", 0.0, 300, 30), ("b", 0.0, 300, 30), ("c", 0.01, 200, 30))
    lim = EngineLimits(64, 4, 30, 16, 0)
    res = simulate(w, ordered("default"), profile=_profile_for(CostModel(0.005, 1e-4, 0.0, 1e-4, 1e-6), lim))
    assert res.preemptions > 0


@pytest.mark.parametrize("policy", ["short_request_first", "promote_shortest"])
def test_a_shared_prefix_filled_in_the_same_step_leaves_no_budget_idle(policy):
    """Issue 20 item 3: a 400-token partial P and a 100-token short S sharing 96 tokens, budget 64. S
    ranks ahead; P's chunk caches shared blocks before S is admitted, so S hits more than the plan's
    first estimate: the plan must count that, and the step uses all 64 tokens (48 before the fix)."""
    w = hashed(("P", 0.0, 400, 1, ids(0, 25)), ("S", 0.001, 100, 1, (*ids(0, 6), 900)))
    res = simulate(w, ordered(policy), budget=64, record_steps=True)
    steps = [dict(step.prefill_chunks) for step in res.node.steps]
    assert steps[1] == {"P": 60, "S": 4}
    assert all(sum(chunks.values()) == 64 for chunks in steps[:-1])


# --- LightLLM mode re-ranks partial prefills with the waiting ones: the same order as the core's plan --

@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "default"])  # default: no plan (below)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([20, 90, 150, 400, 2000]), min_size=2, max_size=12),
       started=st.integers(1, 4), progress=st.lists(st.integers(0, 380), min_size=4, max_size=4),
       tokens=st.integers(0, 5000), dt=st.sampled_from([0.0, 0.01, 1.0]))
def test_lightllm_ranking_agrees_with_the_core_plan_order(policy, sizes, started, progress, tokens, dt):
    now = [0.0]
    config = {"policy": policy, "threshold": 100, "long_max_wait_ms": 5.0, "stats_interval_s": 0}
    queue = make_queue({**config, "partial_prefills": "ordered"}, clock=lambda: now[0])
    ranker = Ranker(config, clock=lambda: now[0])
    requests = [QueuedRequest(f"r{i:02d}", size) for i, size in enumerate(sizes)]
    for request in requests:
        queue.add_request(request)
    ranker.rank(requests)
    # The core dispatches its first requests in the step; LightLLM runs the same ones (its order).
    partials = []
    order = ranker.rank(requests)
    for i in range(min(started, len(requests) - 1)):
        request = queue.pop_request()
        assert request is order[i]
        request.cached_tokens = min(request.prompt_tokens - 1, progress[i])
        partials.append(request)
    queue.on_prefill_submitted(tokens)
    ranker.on_prefill_submitted(tokens)
    now[0] += dt
    lightllm = [r.request_id for r in ranker.rank(requests)]
    asked: list[str] = []
    queue.plan_step(partials, 10**9, free_seats=10**6, demand=lambda r, left: asked.append(r.request_id) or 1)
    # the plan stops at the last partial prefill: compare that prefix of LightLLM's order
    assert asked == lightllm[:len(asked)]
    assert set(p.request_id for p in partials) <= set(asked)


def test_lightllm_mode_runs_partial_prefills_in_policy_order():
    """LightLLM mode has no "first" rule to override: the option does not change its results."""
    w = workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1), ("C", 0.002, 150, 2))
    base = simulate(w, "hrrn", profile=profile(), budget=100, mode="lightllm").records
    same = simulate(w, ordered("hrrn"), profile=profile(), budget=100, mode="lightllm").records
    assert [r.ttft_s for r in base] == [r.ttft_s for r in same]




def test_long_first_directions_on_the_h100_profile():
    """The issue's simulated targets, vLLM mode, budget 1024 (figures in docs/partial-prefills.md)."""
    from prefillq.sim.bound import lower_bounds
    from prefillq.workload import scenario

    w = scenario("long-first", seed=0)
    runs = {(p, m): simulate(w, {"policy": p, "partial_prefills": m}, profile="h100-qwen3.5-0.8b",
                               budget=1024).summary
            for p in POLICIES for m in ("first", "ordered")}
    bound = lower_bounds(w, "h100-qwen3.5-0.8b", budget=1024)["short_ttft_mean_ms"]
    for policy in ("hrrn", "short_request_first"):
        assert runs[policy, "ordered"]["short_ttft_mean_ms"] <= 0.5 * runs[policy, "first"]["short_ttft_mean_ms"]
    assert min(runs[p, "ordered"]["short_ttft_mean_ms"] for p in ("hrrn", "short_request_first")) <= 2 * bound
    base = runs["default", "first"]
    assert runs["promote_shortest", "ordered"]["short_ttft_p50_ms"] <= 0.1 * base["short_ttft_p50_ms"]
    for policy in ("promote_shortest", "hrrn", "short_request_first"):
        treated = runs[policy, "ordered"]
        assert treated["output_tokens_per_s"] >= 0.98 * base["output_tokens_per_s"]
        assert treated["long_ttft_p95_ms"] <= 1.05 * base["long_ttft_p95_ms"]
