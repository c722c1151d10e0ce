"""Million-request traces (issue 12): compact simulated records give the same numbers, and memory per
request stays small (traced allocations, not wall clock)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.metrics import RequestRecord, summarize
from prefillq.sim import simulate
from prefillq.workload import load_trace, scenario

ROOT = Path(__file__).resolve().parents[1]


def _plain(records):
    """The same records as plain RequestRecord objects (what build_records used to return)."""
    return [RequestRecord(**record.to_dict()) for record in records]


@pytest.mark.parametrize(("name", "policy", "mode", "options"), [
    ("long-first", "default", "vllm", {}),
    ("overload", "hrrn", "vllm", {}),
    ("sustained", "short_request_first", "lightllm", {"template_tokens": 12}),
    ("long-first", "promote_shortest", "vllm", {"kv_blocks": 1300}),          # preemptions: split token runs
    ("overload", "hrrn", "vllm", {"kv_blocks": 1500, "budget": 512}),
])
def test_columnar_records_summarize_exactly_like_the_records_one_by_one(name, policy, mode, options):
    result = simulate(scenario(name, seed=1), policy, mode=mode, **options)
    plain = _plain(result.records)
    assert summarize(result.records) == summarize(plain) == result.summary  # bit for bit, every key
    if "kv_blocks" in options:
        assert result.preemptions > 0
    for record in plain:
        assert record.ok and len(record.itl_s) + 1 == record.output_tokens


def test_records_read_like_a_list_of_request_records():
    result = simulate(scenario("long-first", seed=1), "hrrn")
    records = result.records
    first, last = records[0], records[-1]
    assert isinstance(first, RequestRecord) and first == _plain([first])[0]
    assert last.request_id == list(records)[-1].request_id == scenario("long-first", seed=1).requests[-1].request_id
    assert [r.request_id for r in records[2:5]] == [r.request_id for r in list(records)[2:5]]
    assert json.loads(json.dumps(first.to_dict()))["ttft_s"] == first.ttft_s
    with pytest.raises(IndexError):
        records[len(records)]


def test_a_trace_simulation_keeps_a_few_hundred_bytes_per_request(tmp_path):
    """Per-request Python objects (a SimRequest kept after it finished, a record with a list of token
    gaps) would cost kilobytes per request; the run keeps columns instead. (The bounds include what
    the policy queue remembers of popped requests, at most its MEMORY_LIMIT of them, and imports.)"""
    path = tmp_path / "t.csv"
    with path.open("w") as handle:
        handle.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        handle.writelines(f"{i / 20:.3f},{200 + (i * 7919) % 2000},{20 + (i * 104729) % 300}\n" for i in range(10_000))
    workload = load_trace(path, long_threshold=1024)
    tracemalloc.start()
    try:
        result = simulate(workload, "default", profile="h100-qwen3.5-0.8b")  # the bounds were set on its step count
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.summary["completed"] == 10_000
    assert peak / 10_000 < 1000, f"{peak / 10_000:.0f} bytes per request at the peak"
    assert kept / 10_000 < 700, f"{kept / 10_000:.0f} bytes per request kept"


def test_big_trace_benchmark_runs_and_reports_each_size(tmp_path):
    spec = importlib.util.spec_from_file_location("big_trace", ROOT / "benchmarks" / "big_trace.py")
    big_trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(big_trace)
    trace = tmp_path / "small.csv"
    big_trace.write_trace(trace, 500, rate=20.0, seed=3)
    workload = load_trace(trace)
    assert len(workload) == 500 and workload.params["format"] == "azure-csv"
    out = tmp_path / "big.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "big_trace.py"), "--sizes", "300,600",
                           "--runs", "1", "--json", str(out)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert [r["requests"] for r in results] == [300, 600]
    for r in results:
        assert r["completed"] == r["requests"] and r["peak_rss_mb"] > 0 and r["wall_s"] > 0
        assert r["mb_per_1k_requests"] == pytest.approx(r["peak_rss_mb"] / (r["requests"] / 1000))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0.01, 2)), min_size=1, max_size=40),
       st.lists(st.tuples(st.floats(0.01, 8), st.integers(0, 42)), min_size=1, max_size=30))
def test_remembered_at_least_answers_as_most_within_does(jobs, queries):
    """The bound's memo (grids computed only as far as the answer needs) against most_within itself."""
    from prefillq.sim.bound import _remembered_at_least, most_within

    jobs.sort()
    arrivals = [a for a, _ in jobs]
    works = [w for _, w in jobs]
    isolated = [w * 1.5 for w in works]
    at_least = _remembered_at_least(arrivals, works, isolated, 1.0)
    for flow, rank in queries + queries[::-1]:  # asked again, in another order: the memo answers
        assert at_least(flow, rank) == (most_within(arrivals, works, isolated, flow) >= rank)
