"""Disaggregated prefill/decode (1P1D) in the simulator: hand-computed timing, KV-transfer accounting,
continuation segments, and conservation across the two nodes (randomized)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq.sim import CostModel, Profile, SimulationError, simulate
from prefillq.sim.costs import DEFAULT_LIMITS, KvTransfer, ProfileError, load_profile
from prefillq.sim.pd import PdConfig, SegmentRequest, segment_view, token_times
from prefillq.workload import RequestSpec, Workload, scenario

POLICIES = ["default", "promote_shortest", "hrrn", "short_request_first"]
BYTES_PER_TOKEN = 1000.0
LINK = 1e6  # bytes/s: 150 tokens of KV take 0.15 s


def profile(c0=0.01, c1=0.001, *, bytes_per_token=BYTES_PER_TOKEN, link=LINK, bytes_per_request=0.0,
            **limits) -> Profile:
    defaults = dict(DEFAULT_LIMITS)
    defaults.update(limits)
    return Profile("test", "", "", CostModel(c0, c1), defaults,
                   kv_transfer={"bytes_per_token": bytes_per_token, "link_bytes_per_s": link,
                                "bytes_per_request": bytes_per_request})


def workload(*requests: tuple[str, float, int, int]) -> Workload:
    specs = [RequestSpec(rid, at, prompt, out, "long" if prompt > 100 else "short")
             for rid, at, prompt, out in requests]
    return Workload("tiny", sorted(specs, key=lambda s: s.arrival_s), {})


def pd_run(w: Workload, policy: str = "default", prof: Profile | None = None, budget: int = 100, **pd):
    return simulate(w, policy, profile=prof or profile(), budget=budget, topology="1p1d", pd=pd or None,
                    record_steps=True)


def by_id(result):
    return {r.request_id: r for r in result.records}


# --- hand-computed ------------------------------------------------------------------------------------


def test_ttft_is_the_prefill_nodes_token_and_e2e_spans_transfer_and_decode_by_hand():
    # Prefill node: step [0, .11] chunk 100, step [.11, .17] chunk 50 -> first token at .17 (TTFT).
    # Decode node admits it at .17; 150 tokens x 1000 B at 1 MB/s = .15 s on the link -> KV there at .32.
    # Decode steps [.32, .33] and [.33, .34] produce tokens 2 and 3.
    res = pd_run(workload(("A", 0.0, 150, 3)))
    rec = res.records[0]
    assert rec.ttft_s == pytest.approx(0.17)
    assert rec.e2e_s == pytest.approx(0.34)
    assert rec.itl_s == pytest.approx([0.16, 0.01])
    assert res.pd["transfers"] == 1
    assert res.pd["transfer_bytes"] == pytest.approx(150_000)
    assert res.pd["transfer_ms_max"] == pytest.approx(150.0)


def test_prefill_node_never_decodes_and_decode_node_never_prefills():
    res = pd_run(workload(("A", 0.0, 150, 5), ("B", 0.0, 60, 4), ("C", 0.2, 30, 3)), "hrrn")
    pair = res.node.pairs[0]
    assert all(step.num_decodes == 0 for step in pair.prefill.steps)
    assert all(not step.prefill_chunks for step in pair.decode.steps)
    assert sum(step.num_decodes for step in pair.decode.steps) == (5 - 1) + (4 - 1) + (3 - 1)
    assert sum(c for step in pair.prefill.steps for _, c in step.prefill_chunks) == 150 + 60 + 30


def test_the_prefill_node_reports_every_step_to_its_queue():
    res = simulate(scenario("long-then-stream", duration_s=0.5), "hrrn", topology="1p1d", record_steps=True)
    prefill = res.node.pairs[0].prefill
    stats = prefill.waiting.stats()
    assert stats["steps"] == prefill.step_index  # on_prefill_submitted once per step
    assert stats["processed_prefill_tokens"] == sum(c for step in prefill.steps for _, c in step.prefill_chunks)
    decode = res.node.pairs[0].decode
    assert decode.waiting.stats()["processed_prefill_tokens"] == 0  # the decode node prefills nothing


def test_one_token_allowance_finishes_on_the_prefill_node_without_a_transfer():
    res = pd_run(workload(("A", 0.0, 50, 1)))
    assert res.records[0].ttft_s == pytest.approx(0.06)
    assert res.records[0].e2e_s == pytest.approx(0.06)
    assert res.pd["transfers"] == 0


def test_kv_transfer_accounting_bytes_time_and_one_transfer_at_a_time_per_link():
    prof = profile(bytes_per_request=5000.0)
    w = workload(("A", 0.0, 40, 4), ("B", 0.0, 60, 3), ("C", 0.0, 20, 2), ("D", 0.3, 90, 5))
    res = pd_run(w, "default", prof)
    transfer = prof.transfer_model()
    segments = [s for c in res.node.clients for s in c.segments]
    expected_bytes = sum(BYTES_PER_TOKEN * s.prompt_tokens + 5000.0 for s in segments)
    assert res.pd["transfer_bytes"] == pytest.approx(expected_bytes)
    intervals = sorted((s.transfer_start_s, s.transfer_end_s) for s in segments)
    for s in segments:
        assert s.transfer_end_s - s.transfer_start_s == pytest.approx(transfer.seconds(s.prompt_tokens))
        assert s.transfer_start_s >= s.first_token_s - 1e-12  # the KV exists only after the prefill
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end - 1e-12  # one link, one transfer at a time
    for client in res.node.clients:
        times = token_times(client)
        seg = client.segments[0]
        assert times[1] > seg.transfer_end_s  # decoding starts after the KV arrived


def test_a_faster_link_changes_e2e_but_never_ttft():
    w = scenario("long-then-stream", duration_s=1.0)
    slow = simulate(w, "hrrn", topology="1p1d", pd={"link_bytes_per_s": 2e9})
    fast = simulate(w, "hrrn", topology="1p1d", pd={"link_bytes_per_s": 1e12})
    assert [r.ttft_s for r in slow.records] == [r.ttft_s for r in fast.records]
    assert slow.summary["long_e2e_p95_ms"] > fast.summary["long_e2e_p95_ms"]


def test_profile_kv_transfer_is_documented_and_validated():
    prof = load_profile("h100-qwen3.5-0.8b")
    model = prof.transfer_model()
    assert model.bytes_per_token == 6 * 2 * 2 * 256 * 2  # full-attention layers x K,V x KV heads x dim x bf16
    assert model.link_bytes_per_s > 0
    assert "NCCL" in prof.kv_transfer["source"]
    with pytest.raises(ProfileError, match="link_bytes_per_s"):
        KvTransfer(bytes_per_token=1.0, link_bytes_per_s=0.0)
    no_transfer = Profile("bare", "", "", CostModel(0.01, 0.001))
    with pytest.raises(ProfileError, match="kv_transfer"):
        simulate(workload(("A", 0.0, 10, 2)), "default", profile=no_transfer, topology="1p1d")


# --- continuation segments ----------------------------------------------------------------------------


def cut_workload() -> Workload:
    # Decode KV of 8 blocks (128 tokens) cannot hold both A and B to the end (5 blocks each): the newer
    # one is cut when a decode needs a block; its continuation re-prefills prompt + generated tokens.
    return workload(("A", 0.0, 40, 40), ("B", 0.0, 40, 40))


def test_decode_node_out_of_kv_cuts_the_newest_and_the_router_continues_it_on_the_same_pair():
    res = pd_run(cut_workload(), decode_kv_blocks=8)
    assert res.pd["continuations"] >= 1
    recs = by_id(res)
    assert all(r.ok for r in recs.values())
    clients = {c.spec.request_id: c for c in res.node.clients}
    cut = [c for c in clients.values() if len(c.segments) > 1]
    assert cut
    for client in cut:
        first = client.segments[0]
        generated = 0
        for index, segment in enumerate(client.segments):
            assert segment.segment_index == index
            assert segment.generated_before == generated
            assert segment.prompt_tokens == client.spec.prompt_tokens + generated
            assert segment.output_tokens == client.spec.output_tokens - generated
            generated += segment.num_output
        assert generated == client.spec.output_tokens
        rec = recs[client.spec.request_id]
        times = token_times(client)
        assert len(times) == client.spec.output_tokens  # one record, every token of every segment
        assert rec.ttft_s == pytest.approx(first.first_token_s - client.arrival_s)
        assert rec.e2e_s == pytest.approx(times[-1] - client.arrival_s)
        assert all(later >= earlier for earlier, later in itertools.pairwise(times))


def test_only_continuation_segments_get_elevated_priority():
    res = pd_run(cut_workload(), decode_kv_blocks=8)
    segments = [s for c in res.node.clients for s in c.segments]
    assert any(s.segment_index > 0 for s in segments)
    for segment in segments:
        assert segment_view(segment).priority == (-1 if segment.segment_index > 0 else 0)
        assert segment_view(segment).segment_index == segment.segment_index


def test_a_first_segment_with_cached_tokens_is_not_promoted():
    from prefillq.sim.pd import ClientRequest

    client = ClientRequest(RequestSpec("x", 0.0, 1000, 10, "long"), 0)
    first = SegmentRequest(client, 0, 0.0)
    first.num_computed = 900  # a prefix-cache hit (or computed chunks) as the policy sees it
    view = segment_view(first)
    assert view.cached_tokens == 900 and view.resumed
    assert view.priority == 0
    client.generated = 3
    continuation = SegmentRequest(client, 1, 1.0)
    assert segment_view(continuation).priority == -1
    assert segment_view(continuation).output_tokens == 3


def test_preempted_first_segments_on_the_prefill_node_stay_at_normal_priority():
    # A small prefill KV forces preemption (recompute) on the prefill node: resumed, never promoted.
    w = workload(("A", 0.0, 150, 2), ("B", 0.0, 150, 2), ("C", 0.0, 150, 2))
    res = pd_run(w, "hrrn", profile(kv_blocks=14), budget=100)
    assert res.pd["prefill_preemptions"] > 0
    for client in res.node.clients:
        for segment in client.segments:
            assert segment_view(segment).priority == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_continuations_overtake_waiting_first_segments_in_the_prefill_queue(policy):
    # A and B decode on a decode node too small for both; short one-token requests keep a backlog on
    # the prefill node. The continuation of the cut request goes ahead of every first segment that was
    # waiting when it arrived, whatever the policy.
    shorts = [(f"s{i:02d}", 0.001 + 0.02 * i, 50, 1) for i in range(40)]
    res = pd_run(workload(("A", 0.0, 40, 40), ("B", 0.0, 40, 40), *shorts), policy, decode_kv_blocks=8)
    segments = [s for c in res.node.clients for s in c.segments]
    continuations = [s for s in segments if s.segment_index > 0]
    assert continuations
    overtaken = 0
    for continuation in continuations:
        for first in segments:
            if first.segment_index == 0 and first.arrival_s <= continuation.arrival_s < first.first_scheduled_s:
                assert first.first_scheduled_s >= continuation.first_scheduled_s
                overtaken += 1
    assert overtaken > 0  # the backlog was really there


def test_request_larger_than_the_decode_cache_is_a_clear_error():
    with pytest.raises(SimulationError, match="decode node"):
        pd_run(workload(("A", 0.0, 200, 2)), decode_kv_blocks=4)


# --- conservation across the two nodes (randomized) ---------------------------------------------------


request_lists = st.lists(
    st.tuples(st.floats(0.0, 0.5), st.integers(1, 120), st.integers(1, 40)), min_size=1, max_size=14)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=request_lists, policy=st.sampled_from(POLICIES), budget=st.integers(16, 160),
       pairs=st.integers(1, 3), decode_kv=st.integers(12, 40), prefill_kv=st.integers(10, 60),
       prefill_seats=st.integers(1, 8), decode_seats=st.integers(1, 6), retry=st.sampled_from([0.0, 0.05, 1.0]),
       waiting_limit=st.sampled_from([None, 1, 3]), mode=st.sampled_from(["vllm", "lightllm"]))
def test_every_request_finishes_once_tokens_are_conserved_and_limits_hold(
        requests, policy, budget, pairs, decode_kv, prefill_kv, prefill_seats, decode_seats, retry, waiting_limit,
        mode):
    w = workload(*[(f"r{i}", at, prompt, out) for i, (at, prompt, out) in enumerate(requests)])
    prof = profile(kv_blocks=prefill_kv, max_num_seqs=prefill_seats)
    pd = PdConfig(pairs=pairs, decode_kv_blocks=decode_kv, decode_max_num_seqs=decode_seats,
                  busy_retry_timeout_s=retry, prefill_waiting_limit=waiting_limit)
    try:
        res = simulate(w, policy, profile=prof, budget=budget, topology="1p1d", pd=pd, record_steps=True, mode=mode)
    except SimulationError as exc:  # only a request that cannot fit a node at all may stop a run
        assert "KV" in str(exc) and "prompt tokens" in str(exc)
        return
    system = res.node
    assert system.finished == len(w.requests)  # one FINISH per client request, never two
    assert sorted(r.request_id for r in res.records) == sorted(s.request_id for s in w.requests)
    assert all(r.ok for r in res.records)
    for client in system.clients:
        times = token_times(client)
        assert len(times) == client.spec.output_tokens
        assert times[0] == client.first_token_s and times[-1] == client.finish_s
        assert all(later >= earlier for earlier, later in itertools.pairwise(times))
        assert client.dispatched_s >= client.arrival_s
        if retry == 0 or pairs == 1:
            assert client.pair == client.home  # retry is off: nobody moves
        else:
            # the retry window bounds the retrying: a request goes to another pair only within it, and
            # waits longer only at home, held there by the waiting limit (without one, never)
            within = client.dispatched_s - client.arrival_s <= retry + 1e-9
            if client.pair != client.home:
                assert within
            if not within:
                assert waiting_limit is not None and client.pair == client.home
        assert sum(s.num_output for s in client.segments) == client.spec.output_tokens
        for segment in client.segments:  # every segment on the pair the router chose (continuations too)
            assert segment.prefill_node is system.pairs[client.pair].prefill
            assert segment.decode_node in (None, system.pairs[client.pair].decode)
            assert segment_view(segment).priority == (-1 if segment.segment_index > 0 else 0)
    # both nodes of every pair give back every block and seat
    for pair in system.pairs:
        prefill, decode = pair.prefill, pair.decode
        assert prefill.awaiting_transfer == 0
        if mode == "vllm":
            assert prefill.free_blocks == prof.limit("kv_blocks")
            assert all(step.used_blocks <= prof.limit("kv_blocks") for step in prefill.steps)
        else:
            assert prefill.reserved_tokens == 0
        assert all(step.running <= prefill_seats for step in prefill.steps)
        assert all(step.num_decodes == 0 for step in prefill.steps)
        assert decode.free_blocks == decode_kv and decode.in_transfer == 0 and not decode.arrived
        assert decode.max_seats_used <= decode_seats
        assert all(step.used_blocks <= decode_kv and step.num_decodes <= decode_seats for step in decode.steps)
    total_prefill = sum(c for pair in system.pairs for step in pair.prefill.steps for _, c in step.prefill_chunks)
    assert total_prefill >= sum(s.prompt_tokens for c in system.clients for s in c.segments)


def test_published_1p1d_scenarios_run_and_complete():
    for name in ("long-then-stream", "overload"):
        for budget in (1024, 4096):
            res = simulate(scenario(name), "hrrn", topology="1p1d", budget=budget)
            assert res.summary["failed"] == 0
            assert res.summary["completed"] == len(scenario(name).requests)
            assert res.pd["transfers"] == res.pd["segments"]  # every segment moved its KV exactly once


# --- the headline: policies on a dedicated prefill node -----------------------------------------------


def short_p95(policy: str, mode: str) -> float:
    options = {"template_tokens": 12} if mode == "lightllm" else {}
    res = simulate(scenario("long-then-stream"), policy, topology="1p1d", budget=1024, mode=mode, **options)
    return res.summary["short_ttft_p95_ms"]


def test_long_then_stream_1p1d_hrrn_and_promote_shortest_halve_short_ttft_p95_on_the_published_engine():
    # The published 1P1D study ran LightLLM nodes (re-ranked ready list): both policies cut short TTFT
    # P95 by far more than half against default at budget 1024.
    base = short_p95("default", "lightllm")
    assert short_p95("hrrn", "lightllm") < 0.5 * base
    assert short_p95("promote_shortest", "lightllm") < 0.5 * base


def test_long_then_stream_1p1d_hrrn_halves_short_ttft_p95_on_a_vllm_prefill_node():
    assert short_p95("hrrn", "vllm") < 0.5 * short_p95("default", "vllm")
