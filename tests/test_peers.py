"""Other engines' own queue options (policies/peers/, docs/peers.md): each test restates one documented rule."""

from __future__ import annotations

import pytest

from prefillq import QueuedRequest, load_config, make_queue
from prefillq.config import PEER_POLICIES
from prefillq.policies.peers.sglang import SORT_LIMIT
from prefillq.policies.peers.trtllm import STARVATION_ITERATIONS
from prefillq.policies.registry import QUEUES
from prefillq.sim import simulate

from .test_sim_engine import profile, workload


def ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def queue_of(policy: str, *requests: QueuedRequest):
    queue = make_queue({"policy": policy, "stats_interval_s": 0})
    for request in requests:
        queue.add_request(request)
    return queue


def test_every_peer_is_registered_under_its_engine_name_with_hyphens_or_underscores():
    for name in PEER_POLICIES:
        assert name in QUEUES
        assert load_config(name.replace("_", "-")).policy == name
        assert make_queue(name).policy == name


# --- SGLang hrrn -------------------------------------------------------------------------------------

def test_sglang_hrrn_orders_by_waited_tokens_over_uncached_tokens():
    long, short = QueuedRequest("a-long", 1000), QueuedRequest("b-short", 100)
    queue = queue_of("sglang-hrrn", long)
    queue.on_prefill_submitted(1000)  # long has waited 1000 tokens: ratio 1
    queue.add_request(short)
    queue.on_prefill_submitted(50)    # long 1050/1000 = 1.05 > short 50/100 = 0.5
    assert ids(queue) == ["a-long", "b-short"]
    queue.on_prefill_submitted(100)   # long 1150/1000 = 1.15 < short 150/100 = 1.5
    assert ids(queue) == ["b-short", "a-long"]


def test_sglang_hrrn_recomputes_the_cost_every_pass():
    # Unlike our hrrn (cost frozen when first ranked), a cache hit that appears later moves the request up.
    a, b = QueuedRequest("a", 1000), QueuedRequest("b", 500)
    queue = queue_of("sglang-hrrn", a, b)
    queue.on_prefill_submitted(1000)
    assert ids(queue) == ["b", "a"]          # b 1000/500 = 2 > a 1000/1000 = 1
    a.cached_tokens = 900
    queue.refresh_request(a)
    queue.on_prefill_submitted(0)
    assert ids(queue) == ["a", "b"]          # a 1000/100 = 10
    frozen = queue_of("hrrn", QueuedRequest("a", 1000), QueuedRequest("b", 500))
    frozen.on_prefill_submitted(1000)
    a2 = next(r for r in frozen if r.request_id == "a")
    a2.cached_tokens = 900
    frozen.refresh_request(a2)
    assert ids(frozen) == ["b", "a"]


def test_sglang_hrrn_stops_sorting_once_more_than_128_requests_wait():
    # SGLang: with more than 128 waiting, hrrn falls back to FCFS: the list is not re-sorted; a newcomer
    # joins at the back however short it is. At 128 it is still sorted.
    requests = [QueuedRequest(f"r{i:03d}", 1000) for i in range(SORT_LIMIT - 1)]
    queue = queue_of("sglang-hrrn", *requests)
    queue.on_prefill_submitted(100)
    queue.add_request(QueuedRequest("zz-tiny", 1))  # 128 waiting: sorted at the next pass
    queue.on_prefill_submitted(100)
    assert ids(queue)[0] == "zz-tiny"
    queue.add_request(QueuedRequest("zz-tiny-2", 1))  # 129 waiting: no sort, it stays at the back
    queue.on_prefill_submitted(100)
    assert ids(queue)[0] == "zz-tiny" and ids(queue)[-1] == "zz-tiny-2"
    queue.pop_request()                      # back to 128: sorted again at the next pass
    queue.on_prefill_submitted(100)
    assert ids(queue)[0] == "zz-tiny-2"


def test_sglang_hrrn_sends_a_fully_cached_request_first_and_breaks_ties_by_request_id():
    queue = queue_of("sglang-hrrn", QueuedRequest("b", 10), QueuedRequest("a", 10),
                     QueuedRequest("c", 500, cached_tokens=500))
    assert ids(queue) == ["c", "a", "b"]


# --- SGLang shortest-prefill-first -------------------------------------------------------------------

def test_sglang_spf_runs_least_prefill_work_first_and_never_ages():
    queue = queue_of("sglang-spf", QueuedRequest("long", 5000))
    for step in range(200):  # a stream of shorter prompts: the long one never overtakes them
        queue.add_request(QueuedRequest(f"s{step}", 100))
        queue.on_prefill_submitted(4096)
        assert queue.pop_request().request_id == f"s{step}"
    assert ids(queue) == ["long"]


def test_sglang_spf_counts_output_and_cache_hits_in_the_work():
    queue = queue_of("sglang-spf", QueuedRequest("resumed", 100, output_tokens=300),
                     QueuedRequest("cached", 1000, cached_tokens=900), QueuedRequest("plain", 300))
    assert ids(queue) == ["cached", "plain", "resumed"]  # work 100, 300, 400 (ties by arrival)


def test_sglang_spf_caps_a_running_chunk_to_leave_room_for_shorter_waiters():
    # shortest_prefill_chunk_limit: budget 1000, a partial prefill with 5000 left; waiting work 100, 200,
    # 6000: the two shorter ones are reserved (300), the walk stops at 6000 (not shorter); cap 700.
    queue = queue_of("sglang-spf", QueuedRequest("w1", 100), QueuedRequest("w2", 200), QueuedRequest("w3", 6000))
    partial = QueuedRequest("p", 9000, cached_tokens=4000)
    assert queue.plan_step([partial], 1000, free_seats=8) == {"p": 700}
    # Nothing shorter waiting: no cap. A reservation that would leave the chunk under one page stops the walk.
    assert queue_of("sglang-spf", QueuedRequest("big", 9000)).plan_step([partial], 1000, free_seats=8) == {"p": 1000}
    tight = queue_of("sglang-spf", QueuedRequest("w", 999))
    assert tight.plan_step([QueuedRequest("q", 5000)], 1000, free_seats=8) == {"q": 1}
    assert tight.plan_step([QueuedRequest("q", 5000)], 999, free_seats=8) == {"q": 999}


# --- TensorRT-LLM shortest_uncached_first + context_starvation_iterations ------------------------------

def test_trtllm_suf_admits_fewest_uncached_tokens_first():
    queue = queue_of("trtllm-suf", QueuedRequest("a", 1000), QueuedRequest("b", 800, cached_tokens=700),
                     QueuedRequest("c", 300))
    assert ids(queue) == ["b", "c", "a"]  # uncached 100, 300, 1000


def test_trtllm_suf_starvation_counter_counts_iterations_not_tokens():
    queue = queue_of("trtllm-suf", QueuedRequest("long", 9000))
    for step in range(STARVATION_ITERATIONS):  # waited 1..N iterations: not starved yet
        queue.add_request(QueuedRequest(f"s{step}", 10))
        queue.on_prefill_submitted(0 if step % 2 else 10000)  # whatever the steps carry
        assert queue.peek_request().request_id == f"s{step}"
        queue.pop_request()
    queue.add_request(QueuedRequest("late", 10))
    queue.on_prefill_submitted(0)  # N + 1 iterations: it goes first
    assert ids(queue) == ["long", "late"]


def test_trtllm_suf_keeps_a_request_s_iteration_count_when_it_is_handed_back():
    queue = queue_of("trtllm-suf", QueuedRequest("long", 9000))
    queue.on_prefill_submitted(0, steps=STARVATION_ITERATIONS)
    long = queue.pop_request()  # popped, then skipped and handed back: still the same request
    queue.prepend_request(long)
    queue.add_request(QueuedRequest("short", 10))
    queue.on_prefill_submitted(0)
    assert ids(queue) == ["long", "short"]


# --- Dynamo wspt ---------------------------------------------------------------------------------------

def test_dynamo_wspt_orders_by_uncached_input_frozen_when_queued():
    # key = 1 / max(1, input - cached) at enqueue, higher first; equal keys by arrival.
    a, b = QueuedRequest("a", 1000, cached_tokens=100), QueuedRequest("b", 950)
    queue = queue_of("dynamo-wspt", a, b, QueuedRequest("c", 900))
    assert ids(queue) == ["a", "c", "b"]  # 900 (first), 900, 950
    b.cached_tokens = 900                 # a later cache hit does not re-key a queued request
    queue.refresh_request(b)
    assert ids(queue) == ["a", "c", "b"]
    elevated = QueuedRequest("vip", 5000, priority=-1)  # a strict tier ahead of the policy
    queue.add_request(elevated)
    assert ids(queue)[0] == "vip"


# --- all of them in the simulator -------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["vllm", "lightllm"])
@pytest.mark.parametrize("policy", PEER_POLICIES)
def test_the_simulator_runs_every_peer_in_both_engine_modes(policy, mode):
    w = workload(("L", 0.0, 3000, 2), ("S1", 0.001, 50, 2), ("S2", 0.002, 60, 2))
    res = simulate(w, policy, profile=profile(c0=0.01, c1=1e-5), budget=1024, mode=mode)
    assert len(res.records) == 3 and all(r.ttft_s > 0 for r in res.records)
    ttft = {r.request_id: r.ttft_s for r in res.records}
    assert ttft["S1"] < ttft["L"]  # each of them puts the short prompts first here


def test_sglang_spf_chunk_cap_applies_where_the_simulator_plans_partial_prefills():
    # A 3000-token prompt is running; a 50-token one arrives: with the cap it fits beside the chunk.
    w = workload(("L", 0.0, 3000, 1), ("S", 0.015, 50, 1))
    kwargs = dict(profile=profile(c0=0.01, c1=1e-5), budget=1024, mode="vllm", record_steps=True)
    capped = simulate(w, {"policy": "sglang_spf", "partial_prefills": "ordered"}, **kwargs)
    plain = simulate(w, "sglang_spf", **kwargs)
    first = {r.request_id: r.ttft_s for r in capped.records}
    assert first["S"] <= {r.request_id: r.ttft_s for r in plain.records}["S"]
    assert any(("S", 50) in step.prefill_chunks and any(rid == "L" for rid, _ in step.prefill_chunks)
               for step in capped.node.steps)


# --- compare --policies peers ---------------------------------------------------------------------------------

def test_the_peers_group_is_default_auto_and_every_peer_with_spf_s_chunk_cap_modelled_in_vllm_mode():
    from prefillq.sim.compare import comparison_rows

    rows = comparison_rows(["peers"], mode="vllm")
    assert list(rows) == ["default", "auto:partial_prefills=ordered", "sglang_hrrn",
                          "sglang_spf:partial_prefills=ordered", "trtllm_suf", "dynamo_wspt"]
    assert rows["sglang_spf:partial_prefills=ordered"] == load_config(
        {"policy": "sglang_spf", "partial_prefills": "ordered"})
    assert {config.policy for config in rows.values()} == {"default", "auto", *PEER_POLICIES}
    lightllm = comparison_rows(["peers"], mode="lightllm")  # LightLLM mode has no chunk cap to model
    assert list(lightllm) == ["default", "auto", "sglang_hrrn", "sglang_spf", "trtllm_suf", "dynamo_wspt"]


def test_the_peers_group_sits_in_a_list_where_it_is_named_and_adds_no_row_twice():
    from prefillq.sim.compare import comparison_rows

    rows = comparison_rows(["hrrn", "default", " PEERS ", "trtllm_suf"], mode="vllm")
    assert list(rows) == ["hrrn", "default", "auto:partial_prefills=ordered", "sglang_hrrn",
                          "sglang_spf:partial_prefills=ordered", "trtllm_suf", "dynamo_wspt"]
    both = comparison_rows(["default", "auto", "peers"], mode="vllm")
    assert both["auto"].partial_prefills == "first"
    assert both["auto:partial_prefills=ordered"].partial_prefills == "ordered"


def test_peers_is_a_group_for_policies_not_a_policy_spec():
    from prefillq.sim.compare import CompareError, comparison_rows

    with pytest.raises(CompareError, match=r"group of rows.*--policies"):
        comparison_rows(None, ["peers"])
