"""SPEC §5 at every boundary we own: nothing a client sends can set the internal inference priority.

Boundaries: the workload types and trace readers (what a client sent), the simulator (mixed and 1P1D,
both engine modes), the bench client's payload builder, and the vLLM adapter's view of a request.
Also SPEC §3.4: short_request_first is refused on a decode-only role wherever a role can be given.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from enum import Enum
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.compare import register
from prefillq.config import ConfigError, load_config
from prefillq.sim import simulate
from prefillq.sim.node import queue_view
from prefillq.sim.pd import PdConfig, PdSystem, segment_view
from prefillq.workload import RequestSpec, Workload, load_trace

from .test_pd_topology import profile

CLIENT_PRIORITY = -100  # what a client would send to jump the queue


def workload(*requests: tuple) -> Workload:
    # the client's priority class says the same as its admission flag: neither moves it in FCFS mode
    specs = [RequestSpec(rid, at, prompt, out, "long" if prompt > 100 else "short", admission_priority=admission,
                         priority=admission)
             for rid, at, prompt, out, admission in requests]
    return Workload("tiny", specs, {})


# --- workload: the request as sent --------------------------------------------------------------------


def test_a_request_spec_carries_the_clients_priority_class_and_admission_priority_apart():
    spec = RequestSpec("a", 0.0, 10, 1, "short", priority=CLIENT_PRIORITY)
    assert spec.priority == CLIENT_PRIORITY and spec.admission_priority == 0
    assert RequestSpec("a", 0.0, 10, 1, "short").priority == 0


def test_trace_priority_fields_are_read_as_classes_and_admission_priority_apart(tmp_path):
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text("\n".join(json.dumps(row) for row in [
        {"timestamp": 0, "input_length": 10, "output_length": 2, "priority": CLIENT_PRIORITY},
        {"timestamp": 5, "input_length": 10, "output_length": 2, "admission_priority": 3},
        {"timestamp": 9, "input_length": 10, "output_length": 2, "priority": 7, "admission_priority": -2},
    ]) + "\n")
    w = load_trace(mooncake)
    assert [s.admission_priority for s in w.requests] == [0, 3, -2]
    assert [s.priority for s in w.requests] == [CLIENT_PRIORITY, 0, 7]
    assert w.params["priority_classes"] == [CLIENT_PRIORITY, 0, 7]

    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"scheduled_at": 0.0, "prompt_tokens": 10, "output_tokens": 2,
                                 "priority": CLIENT_PRIORITY}) + "\n")
    assert load_trace(bench).requests[0].admission_priority == 0
    assert load_trace(bench).requests[0].priority == CLIENT_PRIORITY

    azure = tmp_path / "azure.csv"
    azure.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,priority,admission_priority\n"
                     f"0.0,10,2,{CLIENT_PRIORITY},1\n0.5,20,3,,\n")
    w = load_trace(azure)
    assert [s.admission_priority for s in w.requests] == [1, 0]
    assert [s.priority for s in w.requests] == [CLIENT_PRIORITY, 0]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2}) + "\n")
    assert "priority_classes" not in load_trace(plain).params


@pytest.mark.parametrize("value", ["high", 1.5, True])
def test_a_malformed_priority_names_file_and_line(tmp_path, value):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "priority": value}) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:1: priority must be an integer"):
        load_trace(path)


@pytest.mark.parametrize("value", ["high", 1.5, True])
def test_a_malformed_admission_priority_names_file_and_line(tmp_path, value):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2,
                                "admission_priority": value}) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:1: admission_priority must be an integer"):
        load_trace(path)


# --- the simulator: what the policy sees ----------------------------------------------------------------


def late_urgent_workload() -> Workload:
    # C asks for the front (admission priority) and its trace said priority=-100; it arrived last.
    return workload(("A", 0.0, 300, 2, 0), ("B", 0.001, 20, 2, 0), ("C", 0.002, 20, 2, CLIENT_PRIORITY))


def dispatch_order(steps) -> list[str]:
    return list(dict.fromkeys(rid for step in steps for rid, _ in step.prefill_chunks))


@pytest.mark.parametrize("topology", ["mixed", "1p1d"])
def test_the_simulated_queue_orders_by_arrival_not_by_anything_the_client_sent(topology):
    res = simulate(late_urgent_workload(), "default", profile=profile(), budget=100, topology=topology,
                   record_steps=True)
    steps = res.node.steps if topology == "mixed" else res.node.pairs[0].prefill.steps
    assert dispatch_order(steps) == ["A", "B", "C"]


def test_every_view_the_simulator_builds_has_normal_priority_for_first_segments():
    from prefillq.sim.node import SimRequest
    from prefillq.sim.pd import ClientRequest, SegmentRequest

    spec = RequestSpec("c", 0.0, 50, 3, "short", admission_priority=CLIENT_PRIORITY)
    assert queue_view(SimRequest(spec)).priority == 0
    first = SegmentRequest(ClientRequest(spec, 0), 0, 0.0)
    assert segment_view(first).priority == 0
    assert segment_view(first).admission_priority == CLIENT_PRIORITY  # carried, but no policy reads it


def test_lightllm_mode_ranks_by_arrival_too():
    for topology in ("mixed", "1p1d"):
        res = simulate(late_urgent_workload(), "default", profile=profile(), budget=100, mode="lightllm",
                       topology=topology, record_steps=True)
        steps = res.node.steps if topology == "mixed" else res.node.pairs[0].prefill.steps
        assert dispatch_order(steps) == ["A", "B", "C"]


# --- decode-only roles refuse short_request_first -------------------------------------------------------


def test_short_request_first_is_refused_on_the_decode_node_everywhere_a_role_is_given():
    for dialect in ("short_request_first", "srf",
                    {"scheduler_config": {"short_request_first_config": {"enabled": True}}}):
        with pytest.raises(ConfigError, match="decode-only"):
            PdConfig(decode_policy=dialect)
        with pytest.raises(ConfigError, match="decode-only"):
            simulate(late_urgent_workload(), "hrrn", profile=profile(), topology="1p1d",
                     pd={"decode_policy": dialect})
    # ... while the prefill node (kv_producer) may run it
    res = simulate(late_urgent_workload(), "short_request_first", profile=profile(), topology="1p1d")
    assert res.summary["completed"] == 3
    assert PdConfig(decode_policy="fcfs").decode_policy == "default"


def test_compare_refuses_short_request_first_as_decode_policy_with_exit_2():
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    result = CliRunner().invoke(app, ["compare", "--topology", "1p1d", "--decode-policy", "short_request_first"])
    assert result.exit_code == 2
    assert "decode-only" in result.output


def test_pd_system_checks_the_prefill_role_too():
    # a prefill node is kv_producer: every policy is allowed there
    for policy in ("default", "promote_shortest", "hrrn", "short_request_first"):
        PdSystem(policy, profile().cost, *_limits(), profile().transfer_model(), PdConfig(), retry_timeout_s=0.0)


def _limits():
    from prefillq.sim.node import EngineLimits

    limits = EngineLimits(max_num_batched_tokens=64, max_num_seqs=4, kv_blocks=64)
    return limits, limits


# --- the bench client's payload builder ---------------------------------------------------------------


def test_bench_payload_never_carries_a_client_priority_or_the_admission_flag():
    from prefillq.bench.payload import PayloadOptions, build_body, build_payload

    spec = RequestSpec("r", 0.0, 12, 3, "short", admission_priority=CLIENT_PRIORITY)
    options = PayloadOptions(model="m", extra_body={"priority": CLIENT_PRIORITY})
    body = build_body(spec, options, payload_seed=0)
    assert "priority" not in body and "admission_priority" not in body
    assert b"priority" not in build_payload(spec, options, 0).body


# --- the vLLM adapter's view of a request ---------------------------------------------------------------


def _install_vllm_stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Minimal stand-ins for the vLLM names the adapter imports, so its pure functions can be tested
    where vLLM is not installed (the real-engine tests in tests/integration cover the rest)."""
    import abc

    class RequestStatus(Enum):
        WAITING = 1
        PREEMPTED = 2

    class RequestQueue(abc.ABC):  # noqa: B024 - a registration target only
        pass

    names = {
        "vllm": {}, "vllm.v1": {}, "vllm.v1.core": {}, "vllm.v1.core.sched": {},
        "vllm.v1.core.sched.async_scheduler": {"AsyncScheduler": type("AsyncScheduler", (), {})},
        "vllm.v1.core.sched.output": {"SchedulerOutput": type("SchedulerOutput", (), {})},
        "vllm.v1.core.sched.request_queue": {"RequestQueue": RequestQueue},
        "vllm.v1.core.sched.scheduler": {"Scheduler": type("Scheduler", (), {})},
        "vllm.v1.request": {"Request": type("Request", (), {}), "RequestStatus": RequestStatus},
    }
    for name, attributes in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def vllm_adapter(monkeypatch: pytest.MonkeyPatch):
    import prefillq.integrations as integrations

    stand_ins = importlib.util.find_spec("vllm") is None
    if stand_ins:
        _install_vllm_stand_ins(monkeypatch)
        monkeypatch.delitem(sys.modules, "prefillq.integrations.vllm", raising=False)
    adapter = importlib.import_module("prefillq.integrations.vllm")
    yield adapter
    if stand_ins:  # do not leave an adapter built on stand-ins behind for other tests
        sys.modules.pop("prefillq.integrations.vllm", None)
        if getattr(integrations, "vllm", None) is adapter:
            delattr(integrations, "vllm")


def fake_vllm_request(adapter, priority: int) -> SimpleNamespace:
    return SimpleNamespace(request_id="r", num_prompt_tokens=100, num_computed_tokens=0, num_output_tokens=0,
                           status=adapter.RequestStatus.WAITING, num_preemptions=0, priority=priority)


def test_vllm_adapter_ignores_the_client_priority_unless_the_operator_trusts_it(vllm_adapter):
    request = fake_vllm_request(vllm_adapter, CLIENT_PRIORITY)
    view = vllm_adapter.request_view(request, trust_priority=False)
    assert view.priority == 0 and view.segment_index == 0 and view.admission_priority == 0
    assert vllm_adapter.request_view(request, trust_priority=True).priority == CLIENT_PRIORITY
    # the default configuration does not trust it
    assert load_config("hrrn").trust_request_priority is False


def test_vllm_adapter_refuses_short_request_first_on_a_kv_consumer(vllm_adapter):
    def vllm_config(kv_role):
        return SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_role=kv_role),
                               scheduler_config=SimpleNamespace(policy="fcfs"))

    with pytest.raises(ConfigError, match="decode-only"):
        vllm_adapter._check_deployment(vllm_config("kv_consumer"), load_config("srf"))
    vllm_adapter._check_deployment(vllm_config("kv_producer"), load_config("srf"))
    vllm_adapter._check_deployment(vllm_config("kv_consumer"), load_config("hrrn"))
