"""Fleets in the simulator: N replicas behind a router, the gateway queue, and what each must reproduce."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq.sim import simulate
from prefillq.sim.fleet import ROUTERS, FleetConfig, LeastOutstandingTokens
from prefillq.workload import RequestSpec, Workload, scenario

MODES = ["vllm", "lightllm"]


def small_mixed(seed: int = 0) -> Workload:
    """Poisson traffic with shorts and longs, busy enough that queues form."""
    return scenario("sustained", seed=seed, rate=40.0, duration_s=2.0, long_tokens=4096)


def _copies(workload: Workload, replicas: int, offset_s: float = 0.0) -> Workload:
    """Every request ``replicas`` times (copy k at ``k * offset_s`` after the original): N x the load."""
    requests = [dataclasses.replace(r, request_id=f"{r.request_id}#{k}", arrival_s=r.arrival_s + k * offset_s)
                for r in workload.requests for k in range(replicas)]
    return Workload(f"{workload.name}x{replicas}", requests, dict(workload.params))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("policy", ["default", "short_request_first"])
def test_one_replica_reproduces_the_single_engine_for_every_router(router: str, mode: str, policy: str) -> None:
    workload = small_mixed()
    single = simulate(workload, policy, mode=mode)
    fleet = simulate(workload, policy, mode=mode, fleet=FleetConfig(replicas=1, router=router))
    assert list(fleet.records) == list(single.records)
    assert fleet.summary == single.summary
    assert fleet.steps == single.steps
    assert fleet.fleet["per_replica"][0]["requests"] == len(workload.requests)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_at_n_times_the_load_equals_one_replica_per_replica(replicas: int, mode: str) -> None:
    workload = small_mixed(seed=3)
    single = simulate(workload, "hrrn", mode=mode)
    fleet = simulate(_copies(workload, replicas), "hrrn", mode=mode,
                     fleet=FleetConfig(replicas=replicas, router="round_robin"))
    for k in range(replicas):
        per_replica = fleet.fleet["per_replica"][k]
        assert per_replica["requests"] == len(workload.requests)
        assert per_replica["summary"] == single.summary
    assert [r.ttft_s for r in fleet.records[::replicas]] == [r.ttft_s for r in single.records]
    assert fleet.fleet["token_imbalance"] == 1.0


def test_round_robin_with_evenly_interleaved_arrivals_matches_one_replica() -> None:
    """Arrivals 0.25 s apart at 1x; at 2x the copies land halfway in between, one per replica."""
    base = Workload("even", [RequestSpec(f"r{i}", i * 0.25, 3000 if i % 4 == 0 else 200, 20,
                                         "long" if i % 4 == 0 else "short") for i in range(40)])
    single = simulate(base, "short_request_first")
    fleet = simulate(_copies(base, 2, offset_s=0.125), "short_request_first",
                     fleet=FleetConfig(replicas=2, router="round_robin"))
    first, second = fleet.fleet["per_replica"]
    assert first["summary"] == single.summary  # the same arrival times: bit for bit
    for key, value in single.summary.items():  # shifted by 0.125 s: equal up to float rounding
        if isinstance(value, float):
            assert second["summary"][key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
        else:
            assert second["summary"][key] == value, key


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("router", ROUTERS)
def test_a_default_gateway_with_unbounded_inflight_equals_no_gateway(router: str, mode: str) -> None:
    workload = small_mixed(seed=1)
    plain = simulate(workload, "hrrn", mode=mode, fleet=FleetConfig(replicas=3, router=router))
    gated = simulate(workload, "hrrn", mode=mode,
                     fleet=FleetConfig(replicas=3, router=router, gateway_policy="default"))
    assert gated.records == plain.records
    assert gated.fleet["per_replica"] == plain.fleet["per_replica"]
    assert gated.fleet["gateway"]["held"] == 0


def test_the_gateway_releases_in_its_policy_order() -> None:
    """One slot: a burst of longs then shorts; short-first at the gateway lets every short overtake."""
    requests = [RequestSpec(f"long{i}", i * 0.001, 8000, 4, "long") for i in range(6)]
    requests += [RequestSpec(f"short{i}", 0.01 + i * 0.001, 100, 4, "short") for i in range(6)]
    workload = Workload("burst", requests)
    srf = {"policy": "short_request_first", "threshold": 1000, "long_max_wait_ms": 0}
    fleet = FleetConfig(replicas=1, gateway_policy=srf, max_inflight_per_replica=1)
    result = simulate(workload, "default", fleet=fleet, record_steps=True)
    system = result.node
    order = [r.request_id for r in sorted(system.requests, key=lambda r: r.first_scheduled_s)]
    assert order == ["long0"] + [f"short{i}" for i in range(6)] + [f"long{i}" for i in range(1, 6)]
    fifo = simulate(workload, "default", fleet=dataclasses.replace(fleet, gateway_policy="default"))
    assert result.summary["short_ttft_p95_ms"] < fifo.summary["short_ttft_p95_ms"]
    assert result.fleet["gateway"]["max_held"] == 11


def test_the_inflight_limit_holds() -> None:
    workload = small_mixed(seed=2)
    fleet = FleetConfig(replicas=2, router="least_outstanding_tokens", gateway_policy="default",
                        max_inflight_per_replica=3)
    result = simulate(workload, "default", fleet=fleet, record_steps=True)
    for replica in result.node.replicas:
        assert max(point[2] + point[1] for point in replica.node.timeline) <= 3  # running + waiting
    assert all(record.ok for record in result.records)


def _naive_outstanding(prompt: int, output: int, steps: list, token_steps: list[int], rid: str, before: int) -> int:
    """A request's outstanding tokens on a replica that has computed its steps ``0..before-1``, counted from
    the step log alone: its tokens (prompt with template, then output) less the prompt tokens its chunks
    in those steps prefilled and the output tokens those steps produced (no preemption: the log holds none)."""
    prefilled = sum(chunk for step in steps[:before] for chunk_id, chunk in step.prefill_chunks if chunk_id == rid)
    produced = sum(1 for index in token_steps if index < before)
    return prompt + output - prefilled - produced


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    replicas=st.integers(2, 4),
    mode=st.sampled_from(MODES),
    inflight=st.one_of(st.none(), st.integers(1, 4)),
    template=st.sampled_from([0, 7]),
    requests=st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(1, 3000), st.integers(1, 40)),
                      min_size=1, max_size=30),
)
def test_least_outstanding_tokens_picks_the_least_loaded_replica_by_a_naive_count(
        replicas: int, mode: str, inflight: int | None, template: int, requests: list[tuple[float, int, int]]) -> None:
    specs = sorted((RequestSpec(f"q{i}", round(t, 4), p, o, "long" if p > 1000 else "short")
                    for i, (t, p, o) in enumerate(requests)), key=lambda spec: spec.arrival_s)
    decisions: list[tuple[object, list[tuple[int, int]], int]] = []  # (request, [(replica, its step index)], chosen)
    original = LeastOutstandingTokens.choose

    def recorded(self, r, spec, candidates):
        chosen = original(self, r, spec, candidates)
        decisions.append((r, [(c.index, c.node.step_index) for c in candidates], chosen.index))
        return chosen

    fleet = FleetConfig(replicas=replicas, router="least_outstanding_tokens",
                        gateway_policy=None if inflight is None else "default", max_inflight_per_replica=inflight)
    LeastOutstandingTokens.choose = recorded
    try:
        result = simulate(Workload("random", specs), "default", mode=mode, budget=512, fleet=fleet,
                          template_tokens=template, record_steps=True)
    finally:
        LeastOutstandingTokens.choose = original
    assert all(record.ok for record in result.records)
    assert len(decisions) == len(specs) and result.preemptions == 0
    by_id = {spec.request_id: spec for spec in specs}
    nodes = [replica.node for replica in result.node.replicas]
    sent: dict[int, list] = {k: [] for k in range(replicas)}
    for r, candidates, chosen in decisions:
        loads = {}
        for index, before in candidates:
            loads[index] = sum(
                _naive_outstanding(by_id[q.request_id].prompt_tokens + template, by_id[q.request_id].output_tokens,
                                   nodes[index].steps, [step for first, last in q.token_runs
                                                        for step in range(first, last + 1)], q.request_id, before)
                for q in sent[index])
        assert chosen == min(loads, key=lambda index: (loads[index], index)), (loads, chosen)
        sent[chosen].append(r)


def test_least_outstanding_tokens_counts_lightllm_decodes_by_the_steps_that_carry_them() -> None:
    # LightLLM runs prefill-only steps between decode steps: at 0.5 s q2 (3 output tokens) has had its
    # prefill step and one decode step, so one token is still to come and the idle replica 1 takes q1.
    specs = [RequestSpec("q0", 0.0, 1, 2, "short"), RequestSpec("q2", 0.46875, 1, 3, "short"),
             RequestSpec("q1", 0.5, 1, 1, "short")]
    result = simulate(Workload("hand", specs), "default", mode="lightllm", budget=512, record_steps=True,
                      fleet=FleetConfig(replicas=2, router="least_outstanding_tokens"))
    assert result.node.assignment == [0, 0, 1]


@pytest.mark.parametrize(("settings_", "words"), [
    ({"replicas": 0}, "replicas"),
    ({"router": "fastest"}, "round_robin"),
    ({"gateway_policy": "fastest"}, "fastest"),
    ({"max_inflight_per_replica": 0}, "max_inflight_per_replica"),
    ({"colour": 1}, "colour"),
])
def test_bad_fleet_settings_name_the_problem(settings_: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FleetConfig.from_value(settings_)


def test_traces_carry_sessions_and_prefix_hashes(tmp_path) -> None:
    from prefillq.workload import load_trace

    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [7, 8]}\n'
                     '{"timestamp": 5, "input_length": 100, "output_length": 4, "session_id": "abc"}\n'
                     '{"timestamp": 9, "input_length": 100, "output_length": 4}\n')
    assert [r.session for r in load_trace(jsonl).requests] == ["prefix:7", "abc", None]
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,conversation_id\n0,100,4,c1\n1,100,4,\n")
    assert [r.session for r in load_trace(csv).requests] == ["c1", None]


def test_prefix_affinity_sends_one_session_to_one_replica_and_spreads_sessions() -> None:
    requests = [RequestSpec(f"r{i}", i * 0.5, 200, 4, "short", session=f"s{i % 8}") for i in range(64)]
    result = simulate(Workload("sessions", requests), "default",
                      fleet=FleetConfig(replicas=4, router="prefix_affinity"), record_steps=True)
    replicas_of: dict[str, set[int]] = {}
    for spec, replica in zip(requests, result.node.assignment, strict=True):
        replicas_of.setdefault(spec.session, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in replicas_of.values())
    assert len(set().union(*replicas_of.values())) > 1
    assert result.fleet["affinity_overflowed"] == 0  # light load: never over the cap
