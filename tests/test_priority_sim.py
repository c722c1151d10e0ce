"""vLLM's priority scheduling in the simulator, compare and the fleet gateway (issue 29).

The simulated vLLM node with ``scheduling_policy="priority"`` serves strict tiers of the requests' priority
class (the policy inside each tier) and, when KV blocks run short, preempts the running request with the
worst (priority, arrival), as vLLM 0.34's ``schedule()`` does; in FCFS mode the classes are ignored.
"""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from prefillq.cli.compare import register
from prefillq.sim import simulate
from prefillq.sim.fleet import FleetConfig
from prefillq.sim.vllm import VllmNode
from prefillq.sim.vllm_priority import victim_key
from prefillq.workload import RequestSpec, Workload, scenario
from tests.cli_app import cli_app
from tests.test_pd_topology import profile


def workload(*requests: tuple) -> Workload:
    specs = [RequestSpec(rid, at, prompt, out, "long" if prompt > 100 else "short", priority=priority)
             for rid, at, prompt, out, priority in requests]
    return Workload("tiny", sorted(specs, key=lambda s: s.arrival_s), {})


def dispatch_order(steps) -> list[str]:
    return list(dict.fromkeys(rid for step in steps for rid, _ in step.prefill_chunks))


def late_urgent() -> Workload:
    return workload(("A", 0.0, 300, 2, 1), ("B", 0.001, 20, 2, 1), ("C", 0.002, 20, 2, 0))


@pytest.mark.parametrize("policy", ["default", "auto", "hrrn"])
def test_priority_mode_serves_the_lower_class_first_and_fcfs_mode_ignores_classes(policy):
    fcfs = simulate(late_urgent(), policy, profile=profile(), budget=100, record_steps=True)
    assert dispatch_order(fcfs.node.steps) == ["A", "B", "C"]
    tiers = simulate(late_urgent(), policy, profile=profile(), budget=100, record_steps=True,
                     scheduling_policy="priority")
    assert dispatch_order(tiers.node.steps) == ["A", "C", "B"]


def kv_short() -> Workload:
    # L (batch) runs first, H (interactive) joins; their decodes outgrow 10 blocks of 16 tokens
    return workload(("L", 0.0, 40, 60, 1), ("H", 0.001, 40, 60, 0))


def first_victim(scheduling_policy: str) -> str:
    res = simulate(kv_short(), "default", profile=profile(), budget=256, kv_blocks=10, record_steps=True,
                   scheduling_policy=scheduling_policy)
    victims = [rid for step in res.node.steps for rid in step.preempted]
    assert victims and res.summary["completed"] == 2
    return victims[0]


def test_kv_shortage_preempts_the_newest_under_fcfs_and_the_worst_priority_under_priority():
    assert first_victim("fcfs") == "H"       # vLLM: self.running.pop(), the newest
    assert first_victim("priority") == "L"   # vLLM: max(running, key=(priority, arrival_time))


@pytest.mark.parametrize("policy", ["default", "auto", "auto:partial_prefills=ordered", "short_request_first"])
@pytest.mark.parametrize("seed", range(6))
def test_every_victim_is_the_worst_running_request_and_every_request_finishes(monkeypatch, policy, seed):
    """Randomized: at each preemption the victim has the largest (priority, arrival) of the running
    requests at that moment (a naive scan of them), and every request still completes exactly once."""
    from prefillq.config import parse_policy_spec

    rng = random.Random(seed)
    specs = [(f"r{i:03d}", round(i * rng.uniform(0.001, 0.02), 6), rng.choice([20, 60, 150, 400]),
              rng.choice([5, 40, 120]), rng.choice([0, 1, 2])) for i in range(40)]
    checked: list[str] = []
    original = VllmNode._preempt

    def watched(node, r, step, extra_blocks=0):
        if node.by_priority:
            running = [*node.decoding.values(), *(p for p in node.prefilling)]
            worst = max(sorted(running, key=lambda x: x.seq), key=victim_key)
            assert victim_key(r) == victim_key(worst)
            checked.append(r.request_id)
        return original(node, r, step, extra_blocks)

    monkeypatch.setattr(VllmNode, "_preempt", watched)
    res = simulate(workload(*specs), parse_policy_spec(policy)[1], profile=profile(), budget=256, kv_blocks=48,
                   scheduling_policy="priority")
    assert res.summary["completed"] == len(specs) and res.summary["failed"] == 0
    assert res.preemptions == len(checked) > 0


def test_per_class_figures_are_in_the_summary():
    w = scenario("sustained", interactive_share=0.2, duration_s=1.5)
    res = simulate(w, "auto", scheduling_policy="priority")
    assert res.summary["priority_0_completed"] + res.summary["priority_1_completed"] == len(w.requests)
    assert res.summary["priority_0_long_ttft_p95_ms"] is None  # interactive requests are all short
    assert res.summary["priority_1_long_ttft_p95_ms"] is not None


def test_the_interactive_share_is_drawn_from_short_requests_by_seed():
    w = scenario("sustained", interactive_share=0.2, duration_s=8.0, seed=3)
    assert all(r.klass == "short" for r in w.requests if r.priority == 0)
    share = sum(r.priority == 0 for r in w.requests) / len(w.requests)
    assert 0.12 < share < 0.28
    assert [r.priority for r in w.requests] == [r.priority for r in scenario(
        "sustained", interactive_share=0.2, duration_s=8.0, seed=3).requests]
    plain = scenario("sustained", duration_s=8.0, seed=3)
    assert [(r.arrival_s, r.prompt_tokens) for r in plain.requests] == [(r.arrival_s, r.prompt_tokens)
                                                                        for r in w.requests]
    assert all(r.priority == 0 for r in plain.requests) and "priority_classes" not in plain.params
    with pytest.raises(ValueError, match="interactive_share"):
        scenario("sustained", interactive_share=0.9)


def test_the_gateway_orders_by_class_then_policy():
    # one replica, one request in flight at a time: the gateway's order is the dispatch order
    w = workload(("A", 0.0, 50, 30, 1), ("B", 0.001, 400, 2, 1), ("C", 0.002, 30, 2, 1), ("D", 0.003, 300, 2, 0))
    fleet = FleetConfig(replicas=1, gateway_policy="auto", max_inflight_per_replica=1)
    res = simulate(w, "default", profile=profile(), budget=1024, fleet=fleet)
    arrival = {spec.request_id: spec.arrival_s for spec in w.requests}
    first = {rec.request_id: rec.ttft_s + arrival[rec.request_id] for rec in res.records}
    assert sorted(first, key=first.get) == ["A", "D", "C", "B"]


def run_compare(*args: str):
    return CliRunner().invoke(cli_app(register), ["compare", *args], env={"COLUMNS": "80"})


def test_compare_reports_each_class_and_writes_them_to_json(tmp_path):
    out = tmp_path / "s.json"
    result = run_compare("--scenario", "sustained", "--set", "interactive_share=0.2", "--set", "duration_s=1.5",
                         "--scheduling-policy", "priority", "--policies", "default,auto", "--no-achievable",
                         "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "per priority class" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines() if "vllm serve" not in line)
    assert "--scheduling-policy priority" in result.output
    data = json.loads(out.read_text())
    assert data["scheduling_policy"] == "priority"
    classes = data["priority_classes"]
    assert classes["classes"] == [0, 1] and set(classes["by_row"]) == {"default", "auto"}
    assert classes["by_row"]["auto"]["0"]["short_ttft_p95_ms"] > 0


def test_compare_refuses_priority_scheduling_where_it_is_not_modelled():
    for extra in (["--mode", "lightllm"], ["--policies", "default,sglang_hrrn"]):
        result = run_compare("--scenario", "sustained", "--set", "duration_s=1", "--scheduling-policy", "priority",
                             "--no-achievable", *extra)
        assert result.exit_code == 2, result.output
        assert "priority" in result.output
