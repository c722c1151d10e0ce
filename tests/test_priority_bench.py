"""bench sends each request's priority class (a trace's ``priority``) as vLLM's request ``priority``, and reports
short/long TTFT, TPOT and counts per class (terminal table, JSON, HTML, a TTFT figure per class)."""

from __future__ import annotations

import asyncio
import json

import pytest
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


# --- bench reports per-class figures (issue 29) -------------------------------------------------------------

def _class_trace(path, n=12):
    """Every third request interactive (0), the rest batch (1); one in four long."""
    path.write_text("\n".join(json.dumps({"timestamp": 15 * i, "input_length": 48 if i % 4 == 0 else 4,
                                          "output_length": 3, "priority": 0 if i % 3 == 1 else 1})
                              for i in range(n)) + "\n")
    return path


def _bench(*args):
    from typer.testing import CliRunner

    from tests.test_bench_cli import _app

    return CliRunner().invoke(_app(), ["bench", *args])


LOAD_PROOF = ["--lateness-limit-ms", "1000000", "--throughput-drop", "1"]


def test_bench_reports_short_and_long_ttft_tpot_and_counts_per_priority_class(tmp_path):
    import numpy as np

    from prefillq.metrics import RequestRecord, median

    trace = _class_trace(tmp_path / "classes.jsonl")
    specs = {spec.request_id: spec for spec in load_trace(trace).requests}
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as a, MockServer(MockBehaviour(token_interval_s=0.002)) as b:
        result = _bench("--url", a.url, "--url", b.url, "--policies", "default,hrrn", "--trace", str(trace),
                        "--reps", "2", "--warmup", "0", "--out", str(out), *LOAD_PROOF)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    classes = summary["priority_classes"]
    assert classes["classes"] == [0, 1]

    def reference(policy, klass, kind, q, what="ttft"):
        """The median over the measured rounds of the class's q-th percentile, from the request files."""
        per_round = []
        for path in sorted((out / "requests").glob(f"measured*-{policy}.jsonl")):
            records = [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
            chosen = [r for r in records if specs[r.request_id].priority == klass and r.ok
                      and (kind is None or r.klass == kind)]
            if what == "ttft":
                values = [1000 * r.ttft_s for r in chosen]
            else:  # time per output token after the first
                values = [1000 * (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in chosen]
            per_round.append(float(np.percentile(values, q)) if values else None)
        return median(per_round)

    for policy in ("default", "hrrn"):
        for klass in (0, 1):
            figures = classes["by_row"][policy][str(klass)]
            for kind, name in (("short", "short"), ("long", "long"), (None, "")):
                for q in ((50, 95) if kind else (95,)):
                    key = f"{name}_ttft_p{q}_ms".lstrip("_")
                    assert figures[key] == pytest.approx(reference(policy, klass, kind, q)), (policy, klass, key)
                    assert summary["policies"][policy][f"priority_{klass}_{key}"] == figures[key]
            assert figures["short_tpot_p50_ms"] == pytest.approx(reference(policy, klass, "short", 50, "tpot"))
            members = sum(spec.priority == klass for spec in specs.values())
            assert figures["completed"] == 2 * members and figures["failed"] == 0  # counts add up over rounds
    paired = summary["intervals"]["hrrn_vs_default"]["metrics"]
    assert paired["priority_0_short_ttft_p95_ms"]["n"] == 2 and "priority_1_long_ttft_p95_ms" in paired
    # The terminal table, the HTML report and a figure per class show them too.
    assert "class 0: short TTFT p95 (ms)" in result.output and "class 1: completed / failed" in result.output
    html = (out / "report.html").read_text()
    assert "class 1: TTFT p95, all (ms)" in html and "ttft_cdf_priority_1.png" in html
    for klass in (0, 1):
        assert (out / f"ttft_cdf_priority_{klass}.png").stat().st_size > 1000
    # --format json carries the same block; `report` rebuilds it from the folder.
    rerun = _report(out, "--format", "json")
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.stdout)["priority_classes"] == classes


def _report(folder, *args):
    from typer.testing import CliRunner

    from tests.test_bench_cli import _app

    return CliRunner().invoke(_app(), ["report", str(folder), "--no-plots", *args])


def test_a_workload_without_classes_reports_no_class_figures(tmp_path):
    trace = tmp_path / "plain.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": 10 * i, "input_length": 4, "output_length": 2})
                               for i in range(4)) + "\n")
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = _bench("--url", server.url, "--trace", str(trace), "--reps", "1", "--warmup", "0", "--out", str(out),
                        "--no-plots", *LOAD_PROOF)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert "priority_classes" not in summary and "class 0:" not in result.output
    assert not any(key.startswith("priority_") for key in summary["policies"]["default"])
    assert all(len(entry) == 5 for entry in json.loads((out / "bench.json").read_text())["schedule"])


def test_the_schedule_keeps_each_requests_class_and_classes_make_another_schedule(tmp_path):
    import hashlib

    from prefillq.bench.results import workload_fingerprint, workload_from_header
    from prefillq.bench.run import schedule_entries
    from prefillq.workload import Workload

    specs = [RequestSpec(f"r{i}", 0.01 * i, 8, 2, "short", priority=i % 2) for i in range(4)]
    with_classes = Workload("w", specs)
    header = {"scenario": "w", "schedule": schedule_entries(with_classes)}
    assert [entry[5] for entry in header["schedule"]] == [0, 1, 0, 1]
    assert [s.priority for s in workload_from_header(header).requests] == [0, 1, 0, 1]
    plain = Workload("w", [RequestSpec(s.request_id, s.arrival_s, 8, 2, "short") for s in specs])
    assert workload_fingerprint(plain) != workload_fingerprint(with_classes)
    # A schedule without classes keeps the fingerprint it had before classes existed (old folders extend).
    digest = hashlib.sha256()
    for s in plain.requests:
        digest.update(f"{s.request_id},{s.arrival_s!r},{s.prompt_tokens},{s.output_tokens},{s.klass};".encode())
    assert workload_fingerprint(plain) == digest.hexdigest()[:16]
    assert [len(entry) for entry in schedule_entries(plain)] == [5] * 4


def test_report_keeps_the_baseline_and_pairs_the_bench_was_given(tmp_path):
    """A study labels its rows itself (stock_fcfs, ...): report's intervals are those the bench printed."""
    trace = _class_trace(tmp_path / "classes.jsonl", n=6)
    out = tmp_path / "res"
    behaviour = MockBehaviour(token_interval_s=0.001)
    with MockServer(behaviour) as a, MockServer(behaviour) as b, MockServer(behaviour) as c:
        result = _bench("--url", a.url, "--url", b.url, "--url", c.url, "--policies", "fcfs_row,prio_row,auto_row",
                        "--baseline", "fcfs_row", "--pair", "prio_row:auto_row", "--trace", str(trace), "--reps", "2",
                        "--warmup", "0", "--out", str(out), "--no-plots", *LOAD_PROOF)
    assert result.exit_code == 0, result.output
    measured = json.loads((out / "summary.json").read_text())["intervals"]
    assert set(measured) == {"prio_row_vs_fcfs_row", "auto_row_vs_fcfs_row", "auto_row_vs_prio_row"}
    again = json.loads(_report(out, "--format", "json").stdout)
    assert again["baseline"] == "fcfs_row" and set(again["intervals"]) == set(measured)
    assert json.loads(_report(out, "--format", "json", "--baseline", "prio_row").stdout)["baseline"] == "prio_row"
