"""The LightLLM engine mode: hand-computed cases for each rule read from LightLLM's code (sim/lightllm.py)."""

from __future__ import annotations

import itertools

import pytest

from prefillq.sim import load_profile, simulate
from prefillq.sim.costs import CostModel, ProfileError, profile_from_dict
from prefillq.sim.lightllm import LightLLMNode, lightllm_cost
from prefillq.sim.node import EngineLimits, SimRequest
from prefillq.workload import RequestSpec

from .test_sim_engine import by_id, profile, workload


def chunk_schedule(result) -> list[list[tuple[str, int]]]:
    return [step.prefill_chunks for step in result.node.steps]


def test_hrrn_binds_a_lone_requests_arrival_counter_when_it_is_first_ranked():
    # SPEC HRRN: a request's arrival counter and frozen cost are bound when the queue first sees it.
    # A (4096 tokens) is alone in step 0, so it is seen with counter 0 and cost 4096; B (2500 tokens)
    # is seen in step 1 with counter 1024. Budget = chunk = 1024; the walk orders by
    # (counter - arrival) / cost, higher first:
    #   step 1, counter 1024: A 1024/4096 > B 0            -> A
    #   step 2, counter 2048: A 2048/4096 = .50 > B 1024/2500 = .41 -> A
    #   step 3, counter 3072: A .75 < B 2048/2500 = .82      -> B, and B stays ahead (steps 4, 5);
    #   step 5: B's last 452 tokens, A's 1024-token chunk does not fit the rest (skipped); step 6: A.
    # Bound late (at step 1: counter 1024, cost 3072), A would lose step 2 to B (1024/3072 < 1024/2500).
    w = workload(("A", 0.0, 4096, 1), ("B", 0.001, 2500, 1))
    # (router_tick_s=0: the router admits at every step start, so B is seen at step 1, as above.)
    res = simulate(w, "hrrn", profile=profile(c0=0.01, c1=1e-5), budget=1024, mode="lightllm", record_steps=True,
                   router_tick_s=0)
    assert chunk_schedule(res) == [[("A", 1024)], [("A", 1024)], [("A", 1024)], [("B", 1024)], [("B", 1024)],
                                   [("B", 452)], [("A", 1024)]]



def step_kinds(result) -> list[tuple[list[tuple[str, int]], int]]:
    return [(step.prefill_chunks, step.num_decodes) for step in result.node.steps]


def test_router_admits_on_its_30ms_timer():
    # RouterManager.loop_for_fwd: a batch is formed every 30 ms. A arrives at 10 ms; the idle backend
    # picks it up at the 30 ms tick: TTFT = 20 ms wait + one step (.01 + .001 * 10 = .02).
    w = workload(("A", 0.010, 10, 1))
    ticked = simulate(w, "default", profile=profile(), budget=100, mode="lightllm")
    instant = simulate(w, "default", profile=profile(), budget=100, mode="lightllm", router_tick_s=0)
    assert ticked.records[0].ttft_s == pytest.approx(0.040)
    assert instant.records[0].ttft_s == pytest.approx(0.020)
    # A busy backend sees requests only at its next step after the tick. A (prompt 90) runs from 0
    # to .1; B arrives at .02, is admitted at the .03 tick, joins at the step starting at .1.
    w = workload(("A", 0.0, 90, 1), ("B", 0.02, 20, 1), ("C", 0.105, 20, 1))
    res = by_id(simulate(w, "default", profile=profile(), budget=100, mode="lightllm"))
    assert res["B"].ttft_s == pytest.approx(0.1 + 0.03 - 0.02)
    # B's step runs .1-.13. C reached the router at .105, after the .09 tick; the step starting at .13
    # acts on the .12 tick, which admits C: its step ends at .16.
    assert res["C"].ttft_s == pytest.approx(0.13 + 0.03 - 0.105)


# A (100-token prompt, 3 output tokens) and B (2000-token prompt, 1 output token) arrive together;
# budget = chunk = 1024. Step 0: A 100, B's 1024-token chunk does not fit the 924 left (skipped).
SCHEDULE_CASE = (("A", 0.0, 100, 3), ("B", 0.0, 2000, 1))


@pytest.mark.parametrize(("schedule", "expected"), [
    # ControlState._agressive_way: a step with a prefill runs no decodes; A decodes after B's prefill.
    ("prefill-first", [([("A", 100)], 0), ([("B", 1024)], 0), ([("B", 976)], 0), ([], 1), ([], 1)]),
    # --enable_prefill_decode_mixed: the decode joins when prefill tokens + decodes <= budget (976 + 1).
    ("mixed", [([("A", 100)], 0), ([("B", 1024)], 0), ([("B", 976)], 1), ([], 1)]),
    # _normal_way with router_max_wait_tokens 1: one decode step, then one prefill step.
    ("alternate", [([("A", 100)], 0), ([], 1), ([("B", 1024)], 0), ([], 1), ([("B", 976)], 0)]),
    # not a LightLLM mode: every step carries every decode
    ("always-mixed", [([("A", 100)], 0), ([("B", 1024)], 1), ([("B", 976)], 1)]),
])
def test_step_types_follow_lightllm_control_state(schedule, expected):
    res = simulate(workload(*SCHEDULE_CASE), "default", profile=profile(c0=0.01, c1=1e-5), budget=1024,
                   mode="lightllm", router_tick_s=0, schedule=schedule, record_steps=True)
    assert step_kinds(res) == expected
    steps = res.node.step_end_s
    a = by_id(res)["A"]
    produced = [i for i, (chunks, decodes) in enumerate(expected) if ("A", 100) in chunks or decodes]
    assert a.ttft_s == pytest.approx(steps[produced[0]])
    assert a.itl_s == pytest.approx([steps[j] - steps[i] for i, j in itertools.pairwise(produced)])


def test_prefill_first_decode_steps_pay_no_prefill_and_prefill_steps_no_decode_context():
    # c4 = 1e-3 per decode context token: a prefill-only step must not pay A's context (101 tokens).
    prof = profile(c0=0.01, c1=1e-5, c4=1e-3)
    res = simulate(workload(*SCHEDULE_CASE), "default", profile=prof, budget=1024, mode="lightllm",
                   router_tick_s=0, record_steps=True)
    durations = [s.end_s - s.start_s for s in res.node.steps]
    assert durations[1] == pytest.approx(0.01 + 1024e-5)
    assert durations[3] == pytest.approx(0.01 + 101e-3)   # A's context: prompt + first token
    assert durations[4] == pytest.approx(0.01 + 102e-3)


def test_chunk_size_is_separate_from_the_step_budget():
    # chunked_prefill_size 512, batch_max_tokens 1024: two 1024-token prompts share every step.
    w = workload(("A", 0.0, 1024, 1), ("B", 0.0, 1024, 1))
    res = simulate(w, "default", profile=profile(), budget=1024, mode="lightllm", router_tick_s=0,
                   chunk_size=512, record_steps=True)
    assert chunk_schedule(res) == [[("A", 512), ("B", 512)], [("A", 512), ("B", 512)]]


def node_with(kv_blocks: int, **options) -> LightLLMNode:
    limits = EngineLimits(max_num_batched_tokens=1024, max_num_seqs=256, kv_blocks=kv_blocks, block_size=16)
    return LightLLMNode("default", CostModel(0.01, 1e-5), limits, router_tick_s=0, **options)


def test_kv_peak_estimate_by_hand():
    # get_tuple_tokens of a 2000-token prompt with 10 outputs, nothing computed, chunk 1024,
    # router_max_wait_tokens 1: a = 2001, b = ceil(2000/1024) * 2 + 10 - 1 + 16 = 29.
    # Two of them: max(29 * 1 + 2001, 29 * 2 + 4002) = 4060 tokens.
    node = node_with(254)  # 4064 tokens: 4060 < 4064 admits both
    a, b = (SimRequest(RequestSpec(rid, 0.0, 2000, 10, "long")) for rid in "AB")
    assert node._kv_tuple(a) == (2001, 29)
    node.add_request(a, 0.0)
    node.add_request(b, 0.0)
    assert node.kv_peak(a) == 2030
    node.step(0.0)
    # both admitted (4060 < 4064); after A's first chunk its b is ceil(976/1024) * 2 + 9 + 16 = 27:
    # max(29 + 2001, 27 * 2 + 4002) = 4056
    assert node.router_head == 2 and node.kv_peak() == 4056
    node = node_with(253)  # 4048 tokens: B waits (FCFS break)
    a, b = (SimRequest(RequestSpec(rid, 0.0, 2000, 10, "long")) for rid in "AB")
    node.add_request(a, 0.0)
    node.add_request(b, 0.0)
    node.step(0.0)
    assert node.router_head == 1 and node.kv_peak(b) == 4056  # still >= 4048 after A's first chunk
    # A decodes after its prefill: with 3 tokens out a = 2000 + 3 + 1, b = 10 - 3 - 1 + 16 = 22.
    for _ in range(3):
        node.step(node.now)
    assert a.status == "decode" and node._kv_tuple(a) == (2004, 22)


def test_kv_peak_sorts_by_remaining_length():
    # x: prompt 9, 83 outputs: a = 10, b = 1 * 2 + 83 - 1 + 16 = 100; y: prompt 999, 1 output:
    # a = 1000, b = 2 + 0 + 16 = 18. Sorted by b descending: max(100 * 1 + 10, 18 * 2 + 1010) = 1046
    # (in arrival order y, x it would read max(18 + 1000, 100 * 2 + 1010) = 1210).
    node = node_with(1000)
    x = SimRequest(RequestSpec("x", 0.0, 9, 83, "short"))
    y = SimRequest(RequestSpec("y", 0.0, 999, 1, "long"))
    node.add_request(y, 0.0)
    node.add_request(x, 0.0)
    node._tick(0.0)
    assert node.router_head == 2 and node.kv_peak() == 1046


def test_prefill_token_gate_keeps_later_requests_in_the_router():
    # ok_prefill (on): next chunks in flight + first chunks of new ones <= 2 * 1024. A, B, C have
    # 4000-token prompts (chunks 1024, 1024, 1024, 928), S 90 tokens, one output token each.
    w = workload(("A", 0.0, 4000, 1), ("B", 0.0, 4000, 1), ("C", 0.0, 4000, 1), ("S", 0.0, 90, 1))
    off = simulate(w, "default", profile=profile(), budget=1024, mode="lightllm", router_tick_s=0,
                   record_steps=True)
    # off: S fills the 96 tokens A's last chunk leaves (step 3)
    assert chunk_schedule(off)[3] == [("A", 928), ("S", 90)]
    on = simulate(w, "default", profile=profile(), budget=1024, mode="lightllm", router_tick_s=0,
                  prefill_token_gate=True, record_steps=True)
    # on: A + B = 2048 admitted; C waits, and S behind it. At step 4 A is done: B 1024 + C 1024 = 2048
    # admits C, S (+90) waits; at step 7 B's last chunk needs 928: 928 + 1024 + 90 = 2042 admits S.
    assert chunk_schedule(on) == [[("A", 1024)]] * 3 + [[("A", 928)]] + [[("B", 1024)]] * 3 + \
        [[("B", 928), ("S", 90)]] + [[("C", 1024)]] * 3 + [[("C", 928)]]


def test_the_profile_refits_the_lightllm_step_overhead_only():
    prof = load_profile("h100-qwen3.5-0.8b")
    assert lightllm_cost(prof).step_overhead_s == 0.016
    assert prof.cost.step_overhead_s == 0.0128  # vLLM mode keeps its fit
    assert lightllm_cost(prof).prefill_token_s == prof.cost.prefill_token_s
    bad = profile_from_dict({"step_overhead_s": 0.01, "prefill_token_s": 1e-5, "lightllm": {"c0": 1}})
    with pytest.raises(ProfileError, match=r"lightllm\.c0 is not a cost coefficient"):
        lightllm_cost(bad)


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="unknown LightLLM schedule 'fast'; valid schedules: prefill-first"):
        simulate(workload(("A", 0.0, 10, 1)), "default", profile=profile(), mode="lightllm", schedule="fast")


@pytest.mark.parametrize(("schedule", "counted"), [
    # SPEC §3.3: a mixed prefill/decode batch advances the counter by all its tokens, merged decodes included.
    # Steps as in test_step_types_follow_lightllm_control_state; decode-only steps advance nothing.
    ("mixed", [100, 1024, 976 + 1, 0]),
    ("always-mixed", [100, 1024 + 1, 976 + 1]),
    ("prefill-first", [100, 1024, 976, 0, 0]),  # no mixed batch: prefill tokens only
    ("alternate", [100, 0, 1024, 0, 976]),
])
def test_mixed_batches_advance_the_hrrn_counter_by_every_token(schedule, counted):
    res = simulate(workload(*SCHEDULE_CASE), "hrrn", profile=profile(c0=0.01, c1=1e-5), budget=1024,
                   mode="lightllm", router_tick_s=0, schedule=schedule, record_steps=True)
    assert len(res.node.steps) == len(counted)
    assert res.node.ranker.processed_tokens == sum(counted)


def test_a_request_whose_prefill_completed_leaves_the_ranker():
    # LightLLM mode tells the ranker when a request leaves the ready list for good, so nothing is kept
    # for a return that never comes (SPEC §3.0).
    res = simulate(workload(*SCHEDULE_CASE), "hrrn", profile=profile(), budget=1024, mode="lightllm",
                   router_tick_s=0, record_steps=True)
    ranker = res.node.ranker
    assert len(ranker.queue) == 0 and not ranker._away and not ranker._tracked
