"""Workloads: published scenario defaults, seeded generation, overrides, trace readers and their errors."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from prefillq.metrics import RequestRecord
from prefillq.workload import SCENARIOS, WorkloadError, load_trace, scenario, scenario_names
from tests.traces import bench_records_trace, two_lengths_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def test_the_six_published_scenarios_exist():
    assert set(scenario_names()) == {
        "long-first", "interleaved", "sustained", "long-then-stream", "overload", "low-load",
    }
    assert set(SCENARIOS) == set(scenario_names())


def test_long_first_matches_the_published_schedule():
    w = scenario("long-first")
    longs = [r for r in w.requests if r.klass == "long"]
    shorts = [r for r in w.requests if r.klass == "short"]
    assert [round(r.arrival_s * 1000, 6) for r in longs] == list(range(48))
    assert [round(r.arrival_s * 1000, 6) for r in shorts] == list(range(60, 108))
    assert {r.prompt_tokens for r in longs} == {16384}
    assert {r.prompt_tokens for r in shorts} == {128}
    assert {r.output_tokens for r in w.requests} == {128}
    assert scenario("burst").requests == w.requests


def test_interleaved_is_192_requests_at_500_per_s_one_long_in_four():
    w = scenario("interleaved")
    assert len(w) == 192
    assert [round(r.arrival_s * 1000, 6) for r in w.requests] == [2 * i for i in range(192)]
    for group_start in range(0, 192, 4):
        group = w.requests[group_start:group_start + 4]
        assert [r.klass for r in group].count("long") == 1
    assert round(w.duration_s * 1000) == 382


@pytest.mark.parametrize(
    ("name", "rate", "long_tokens", "long_share"),
    [("sustained", 60, 8192, 0.25), ("overload", 120, 16384, 0.10), ("low-load", 20, 4096, 0.25)],
)
def test_rate_scenarios_have_published_rate_length_and_share(name, rate, long_tokens, long_share):
    w = scenario(name, duration_s=200.0)  # long window: the sample rate converges to the parameter
    assert len(w) / 200.0 == pytest.approx(rate, rel=0.05)
    longs = [r for r in w.requests if r.klass == "long"]
    assert {r.prompt_tokens for r in longs} == {long_tokens}
    assert len(longs) / len(w) == pytest.approx(long_share, abs=0.02)
    assert all(0 <= r.arrival_s < 200.0 for r in w.requests)


def test_long_then_stream_sends_16_long_first_then_a_short_stream():
    w = scenario("long-then-stream")
    assert [r.klass for r in w.requests[:16]] == ["long"] * 16
    assert all(r.klass == "short" for r in w.requests[16:])
    assert len(w.requests[16:]) / 8.0 == pytest.approx(120, rel=0.1)


def test_seeded_and_reproducible():
    assert scenario("sustained", seed=3).requests == scenario("sustained", seed=3).requests
    assert scenario("sustained", seed=3).requests != scenario("sustained", seed=4).requests


def test_arrivals_sorted_and_ids_unique():
    for name in scenario_names():
        w = scenario(name)
        times = [r.arrival_s for r in w.requests]
        assert times == sorted(times)
        assert len({r.request_id for r in w.requests}) == len(w)


def test_gamma_arrivals_have_the_requested_burstiness():
    w = scenario("sustained", arrival="gamma", gamma_cv=3.0, duration_s=400.0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(w.requests, w.requests[1:], strict=False)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(3.0, rel=0.15)
    assert len(w) / 400.0 == pytest.approx(60, rel=0.1)
    poisson = scenario("sustained", duration_s=400.0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(poisson.requests, poisson.requests[1:], strict=False)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.1)


def test_every_parameter_is_overridable():
    w = scenario("long-first", leading_long=2, num_requests=3, short_tokens=64, long_tokens=1000,
                 output_tokens=7, stream_start_ms=10.0)
    assert [(r.klass, r.prompt_tokens, r.output_tokens) for r in w.requests] == [
        ("long", 1000, 7), ("long", 1000, 7), ("short", 64, 7), ("short", 64, 7), ("short", 64, 7)]
    assert w.requests[2].arrival_s == pytest.approx(0.010)
    assert w.params["short_tokens"] == 64


def test_unknown_scenario_and_parameter_are_clear_errors():
    with pytest.raises(WorkloadError, match=r"unknown scenario 'nope'.*long-first"):
        scenario("nope")
    with pytest.raises(WorkloadError, match="unknown parameter 'rat'"):
        scenario("sustained", rat=3)
    with pytest.raises(WorkloadError, match="rate"):
        scenario("sustained", rate=0)
    with pytest.raises(WorkloadError, match="arrival"):
        scenario("sustained", arrival="weibull")
    with pytest.raises(WorkloadError, match="long_fraction"):
        scenario("sustained", long_fraction=1.5)


def test_azure_trace_reads_all_rows():
    w = load_trace(TRACES / "azure-2023-code.csv")
    assert len(w) == 8819
    assert w.requests[0].prompt_tokens == 4808 and w.requests[0].output_tokens == 10
    assert w.requests[1].arrival_s == pytest.approx(0.052)
    assert {r.klass for r in w.requests} == {"short", "long"}
    threshold = w.params["long_threshold"]
    assert all((r.prompt_tokens > threshold) == (r.klass == "long") for r in w.requests)


def test_trace_window_limit_and_rate_scale():
    w = load_trace(TRACES / "azure-2023-conv.csv", start_s=100.0, duration_s=50.0, rate_scale=2.0)
    assert w.requests and all(0 <= r.arrival_s < 25.0 for r in w.requests)
    assert len(load_trace(TRACES / "azure-2023-conv.csv", limit=10)) == 10
    w = load_trace(TRACES / "azure-2023-conv.csv", limit=5, long_threshold=500)
    assert [r.klass for r in w.requests] == ["short", "short", "long", "short", "short"]


def test_mooncake_jsonl(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 6000, "output_length": 20, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1500, "input_length": 100, "output_length": 5}\n\n'
    )
    w = load_trace(path, long_threshold=1000)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.klass) for r in w.requests] == [
        (0.0, 6000, 20, "long"), (1.5, 100, 5, "short")]


def test_bench_records_round_trip(tmp_path):
    records = [
        RequestRecord("a", "long", 4000, 8, 0.5, 0.51, 1.0, 2.0, [0.1] * 7),
        RequestRecord("b", "short", 100, 8, 0.0, 0.01, 0.1, 0.4, [0.05] * 7),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    w = load_trace(path)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.klass) for r in w.requests] == [
        ("b", 0.0, 100, "short"), ("a", 0.5, 4000, "long")]


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.1,abc,5\n", 3, "num_prefill_tokens"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n\n0.2,10\n", 4, "expected 3 fields"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n-1,10,5\n", 2, "arrived_at"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,0,5\n", 2, "num_prefill_tokens"),
        ("time,prompt\n0,5\n", 1, "header lacks"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n', 2, "not valid JSON"),
        ('{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 3}\n', 1, "input_length"),
        ('[1, 2]\n', 1, "JSON object"),
        ('{"foo": 1}\n', 1, "unrecognised"),
    ],
)
def test_malformed_trace_lines_name_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "bad.trace"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=message) as info:
        load_trace(path)
    assert f"{path}:{line}:" in str(info.value)


def test_missing_and_empty_trace(tmp_path):
    with pytest.raises(WorkloadError, match="no such trace file"):
        load_trace(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(WorkloadError, match="empty trace"):
        load_trace(tmp_path / "empty.csv")


# --- the default short/long split of a trace -----------------------------------------------------

def test_a_trace_splits_at_the_threshold_tune_would_choose(tmp_path):
    from prefillq.tune import choose_threshold

    w = load_trace(two_lengths_trace(tmp_path / "two.csv"))
    choice = choose_threshold([r.prompt_tokens for r in w.requests])
    assert w.params["split"] == {"threshold": choice.threshold, "method": "kde_valley"}
    assert w.params["long_threshold"] == choice.threshold and 100 <= choice.threshold < 5000
    assert sum(r.klass == "short" for r in w.requests) == 70
    assert sum(r.klass == "long" for r in w.requests) == 30


def test_the_azure_trace_splits_where_tune_puts_the_threshold():
    from prefillq.tune import choose_threshold

    w = load_trace(TRACES / "azure-2023-conv.csv")
    choice = choose_threshold([r.prompt_tokens for r in w.requests])
    assert w.params["split"] == {"threshold": choice.threshold, "method": choice.method}


def test_a_trace_without_a_valley_splits_at_the_percentile_fallback(tmp_path):
    path = tmp_path / "flat.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{i * 0.1:.1f},{100 + 10 * i},8\n" for i in range(100)))
    w = load_trace(path)
    assert w.params["split"]["method"] == "percentile_fallback_p80"
    threshold = w.params["split"]["threshold"]
    assert all((r.klass == "short") == (r.prompt_tokens <= threshold) for r in w.requests)


def test_a_given_threshold_is_the_users_and_a_prompt_at_it_is_short(tmp_path):
    w = load_trace(two_lengths_trace(tmp_path / "two.csv"), long_threshold=100)
    assert w.params["split"] == {"threshold": 100, "method": "user"}
    assert {r.klass for r in w.requests if r.prompt_tokens == 100} == {"short"}
    assert {r.klass for r in w.requests if r.prompt_tokens == 5000} == {"long"}


def test_the_split_rule_is_short_request_firsts(tmp_path):
    from prefillq.config import PolicyConfig
    from prefillq.policies import make_queue
    from prefillq.requests import QueuedRequest

    w = load_trace(two_lengths_trace(tmp_path / "two.csv"), long_threshold=100)
    queue = make_queue(PolicyConfig("short_request_first", threshold=100))
    for r in w.requests:
        queue.add_request(QueuedRequest(request_id=r.request_id, prompt_tokens=r.prompt_tokens))
    lanes = queue.stats()["lanes"]
    assert lanes["short"] == sum(r.klass == "short" for r in w.requests)
    assert lanes["long"] == sum(r.klass == "long" for r in w.requests)


def test_bench_records_keep_their_recorded_classes_and_say_so(tmp_path):
    records = [RequestRecord("a", "long", 40, 8, 0.5, 0.51, 1.0, 2.0, []),
               RequestRecord("b", "short", 100, 8, 0.0, 0.01, 0.1, 0.4, [])]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    w = load_trace(path)
    assert [r.klass for r in w.requests] == ["short", "long"]
    assert w.params["split"] == {"threshold": None, "method": "recorded"}


# --- request ids --------------------------------------------------------------------------------

def test_generated_ids_never_collide_with_explicit_ones(tmp_path):
    # the third record has no id; the one it would get (trace-0000002) is taken, and so is its first
    # alternative, by records that come before and after it
    path = bench_records_trace(tmp_path / "ids.jsonl",
                               ["trace-0000002", "a", None, "trace-0000002-1", None])
    w = load_trace(path)
    ids = [r.request_id for r in w.requests]
    assert len(set(ids)) == len(ids) == 5
    assert ids[0] == "trace-0000002" and ids[1] == "a" and ids[3] == "trace-0000002-1"
    assert ids[2] not in ("trace-0000002", "trace-0000002-1") and ids[4] == "trace-0000004"


def test_a_repeated_explicit_id_is_an_error_naming_both_lines(tmp_path):
    path = bench_records_trace(tmp_path / "dup.jsonl", ["a", "b", None, "a"])
    with pytest.raises(WorkloadError, match="request_id 'a'") as info:
        load_trace(path)
    message = str(info.value)
    assert f"{path}:4:" in message and "line 1" in message and "\n" not in message
