"""The profile's ``frontend_s``: time a served request spends outside the engine steps.

It is in every TTFT and end-to-end latency a client measures and in no step's latency, so the
simulator adds it to each request's first-token and finish times, in every topology, and leaves the
gaps between tokens (ITL, TPOT) and the schedule itself alone. The lower bound includes it too.
"""

from __future__ import annotations

import json

import pytest

from prefillq.sim import CostModel, Profile, simulate
from prefillq.sim.bound import lower_bounds
from prefillq.sim.costs import DEFAULT_LIMITS, ProfileError, load_profile, profile_from_dict
from prefillq.workload import RequestSpec, Workload, scenario

FRONTEND_S = 0.0035


def profile(frontend_s: float = 0.0, frontend_per_seq_s: float = 0.0) -> Profile:
    defaults = dict(DEFAULT_LIMITS)
    defaults["max_num_batched_tokens"] = 256
    return Profile("test", "", "", CostModel(0.002, 2e-5, 1e-8, 5e-5, 2e-7), defaults,
                   kv_transfer={"bytes_per_token": 2048, "link_bytes_per_s": 1e10}, frontend_s=frontend_s,
                   frontend_per_seq_s=frontend_per_seq_s)


def mixed_workload() -> Workload:
    specs = [RequestSpec("long-0", 0.0, 2000, 4, "long")]
    specs += [RequestSpec(f"short-{i}", 0.001 * (i + 1), 40 + i, 6, "short") for i in range(6)]
    return Workload("hand", specs, {})


def test_a_lone_request_gains_exactly_frontend_s_on_ttft_and_e2e() -> None:
    work = Workload("one", [RequestSpec("a", 0.5, 100, 5, "short")], {})
    base = simulate(work, "default", profile=profile()).records[0]
    shifted = simulate(work, "default", profile=profile(FRONTEND_S)).records[0]
    # by hand: one 100-token prefill step, then four decode steps of one sequence
    cost = profile().cost
    prefill = cost.step_latency(100, cost.attention_work(100, 0), 0, 0)
    assert base.ttft_s == pytest.approx(prefill)
    assert shifted.ttft_s == pytest.approx(prefill + FRONTEND_S)
    assert shifted.e2e_s == pytest.approx(base.e2e_s + FRONTEND_S)
    assert shifted.itl_s == pytest.approx(base.itl_s)


@pytest.mark.parametrize("topology, extra", [("mixed", {}), ("mixed", {"fleet": {"replicas": 2}}),
                                              ("1p1d", {})])
@pytest.mark.parametrize("policy", ["default", "hrrn", "short_request_first"])
def test_every_request_shifts_by_frontend_s_and_the_schedule_does_not_change(
        topology: str, extra: dict, policy: str) -> None:
    work = mixed_workload()
    base = simulate(work, policy, profile=profile(), topology=topology, **extra)
    shifted = simulate(work, policy, profile=profile(FRONTEND_S), topology=topology, **extra)
    assert shifted.steps == base.steps
    for before, after in zip(base.records, shifted.records, strict=True):
        assert after.request_id == before.request_id
        assert after.ttft_s == pytest.approx(before.ttft_s + FRONTEND_S, abs=1e-12)
        assert after.e2e_s == pytest.approx(before.e2e_s + FRONTEND_S, abs=1e-12)
        assert after.itl_s == pytest.approx(before.itl_s)
    assert shifted.summary["short_ttft_p50_ms"] == pytest.approx(base.summary["short_ttft_p50_ms"]
                                                                 + FRONTEND_S * 1000)
    assert shifted.summary["short_tpot_p50_ms"] == pytest.approx(base.summary["short_tpot_p50_ms"])


def test_the_per_sequence_term_follows_the_batch_of_the_step_that_produced_the_token() -> None:
    # by hand: r0 (200 tokens) prefills alone in step 0 and decodes from step 1; r1 arrives during
    # step 0 and prefills in step 1 next to r0's decode: batch sizes 1 (r0's first token) and 2 (r1's);
    # both finish (3 output tokens each) in steps whose batches are known from the same count
    per_seq = 0.0004
    work = Workload("two", [RequestSpec("r0", 0.0, 200, 3, "short"), RequestSpec("r1", 0.001, 50, 3, "short")], {})
    base = simulate(work, "default", profile=profile(), record_steps=True)
    shifted = simulate(work, "default", profile=profile(FRONTEND_S, per_seq), record_steps=True)
    steps = base.node.steps
    assert [(len(s.prefill_chunks), s.num_decodes) for s in steps] == [(1, 0), (1, 1), (0, 2), (0, 1)]
    first = {r.request_id: r for r in base.records}
    later = {r.request_id: r for r in shifted.records}
    assert later["r0"].ttft_s == pytest.approx(first["r0"].ttft_s + FRONTEND_S + 1 * per_seq)
    assert later["r1"].ttft_s == pytest.approx(first["r1"].ttft_s + FRONTEND_S + 2 * per_seq)
    assert later["r0"].e2e_s == pytest.approx(first["r0"].e2e_s + FRONTEND_S + 2 * per_seq)  # last token: step 2
    assert later["r1"].e2e_s == pytest.approx(first["r1"].e2e_s + FRONTEND_S + 1 * per_seq)  # step 3, alone
    assert later["r1"].itl_s == pytest.approx(first["r1"].itl_s)


def test_the_bound_includes_frontend_s_and_still_holds() -> None:
    work = scenario("low-load", seed=3, long_tokens=2048, rate=30, duration_s=2)
    base = lower_bounds(work, profile())
    bound = lower_bounds(work, profile(FRONTEND_S))
    for key in ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms"):
        assert bound[key] == pytest.approx(base[key] + FRONTEND_S * 1000, rel=1e-9)
    for policy in ("default", "promote_shortest", "hrrn", "short_request_first"):
        summary = simulate(work, policy, profile=profile(FRONTEND_S)).summary
        for key in ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms"):
            assert summary[key] >= bound[key]


def test_profiles_read_frontend_s_and_reject_bad_values(tmp_path) -> None:
    data = {"name": "p", "step_overhead_s": 0.001, "prefill_token_s": 1e-5}
    assert profile_from_dict(data).frontend_s == 0.0
    assert profile_from_dict({**data, "frontend_s": 0.002}).frontend_s == 0.002
    assert "frontend_s" not in profile_from_dict({**data, "frontend_s": 0.002}).extra
    for key in ("frontend_s", "frontend_per_seq_s"):
        for bad in (-0.001, "2 ms", float("nan"), True):
            with pytest.raises(ProfileError, match=key):
                profile_from_dict({**data, key: bad})
    assert profile_from_dict({**data, "frontend_per_seq_s": 1e-4}).frontend_per_seq_s == 1e-4
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**data, "frontend_s": 0.004}))
    assert load_profile(path).frontend_s == 0.004


def test_the_shipped_profiles_state_their_frontend_time() -> None:
    # the CPU profile is fitted against a served engine and carries its measured front-end time;
    # the published H100 figures were matched without one
    assert load_profile("cpu-tiny-llama").frontend_s > 0
    assert load_profile("h100-qwen3.5-0.8b").frontend_s == 0.0
