"""bench sends each request's priority class (a trace's ``priority``) as vLLM's request ``priority``."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.bench.client import run_load
from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.payload import PayloadOptions, build_body, build_payload
from prefillq.workload import RequestSpec, load_trace


@settings(max_examples=60, deadline=None)
@given(priority=st.integers(-3, 3), extra=st.sampled_from([None, -7, 9]), forward=st.booleans())
def test_a_body_carries_the_requests_class_and_the_extra_body_only_with_the_opt_in(priority, extra, forward):
    spec = RequestSpec("x", 0.0, 8, 2, "short", priority=priority)
    options = PayloadOptions(model="m", extra_body={} if extra is None else {"priority": extra},
                             forward_priority=forward)
    body = build_body(spec, options, 0)
    if priority:
        expected = priority  # the request's own class wins
    elif extra is not None and forward:
        expected = extra
    else:
        expected = None
    assert body.get("priority") == expected


def test_the_mock_server_receives_each_requests_priority_from_the_trace(tmp_path):
    trace = tmp_path / "classes.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": 5 * i, "input_length": 8, "output_length": 2,
                                           **({"priority": i % 3} if i % 3 else {})}) for i in range(6)) + "\n")
    specs = list(load_trace(trace).requests)
    options = PayloadOptions(model="mock-model")
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        records = asyncio.run(run_load([build_payload(spec, options, 0) for spec in specs], server.url)).records
        received = {r.headers.get("x-request-id"): r.body for r in server.received
                    if r.body is not None and "prompt" in r.body}
    assert all(record.ok for record in records)
    for spec in specs:
        assert received[spec.request_id].get("priority", 0) == spec.priority
    assert {spec.priority for spec in specs} == {0, 1, 2}
