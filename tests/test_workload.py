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


def test_the_six_published_scenarios_and_multi_turn_exist():
    assert set(scenario_names()) == {
        "long-first", "interleaved", "sustained", "long-then-stream", "overload", "low-load", "multi-turn",
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
        ("time,prompt\n0,5\n", 1, "unknown trace format"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n', 2, "not valid JSON"),
        ('{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 3}\n', 1, "input_length"),
        ('[1, 2]\n', 1, "JSON object"),
        ('{"foo": 1}\n', 1, "unknown trace format"),
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


# --- streaming readers (issue 12: million-request traces) ------------------------------------------------


def _reference_azure(text: str, *, start_s: float = 0.0, duration_s: float | None = None, limit: int | None = None,
                     rate_scale: float = 1.0, threshold: int) -> list[tuple]:
    """A naive whole-file reader of the Azure CSV format: the records load_trace must produce."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split(",")
    rows = []
    for line in lines[1:]:
        fields = dict(zip(header, line.split(","), strict=True))
        admission = int(fields["admission_priority"]) if fields.get("admission_priority") else 0
        rows.append((float(fields["arrived_at"]), int(fields["num_prefill_tokens"]), int(fields["num_decode_tokens"]),
                     admission))
    rows.sort(key=lambda row: row[0])
    end = float("inf") if duration_s is None else start_s + duration_s
    window = [row for row in rows if start_s <= row[0] < end][:limit]
    return [(f"trace-{i:07d}", round((a - start_s) / rate_scale, 9), p, o, "short" if p <= threshold else "long", adm)
            for i, (a, p, o, adm) in enumerate(window)]


HAND_WRITTEN_CSV = """arrived_at,num_prefill_tokens,num_decode_tokens,admission_priority,priority

0.50,300,20,,7
0.10,5000,2,-1,7
0.10,120,9,2,
2.25,64,1,,

1.75,9000,30,0,1
3.00,2048,4,,
"""


@pytest.mark.parametrize("window", [{}, {"start_s": 0.1, "duration_s": 2.0}, {"limit": 3, "rate_scale": 2.0},
                                    {"start_s": 0.2, "rate_scale": 0.5}])
def test_streamed_azure_csv_gives_the_whole_file_readers_requests(tmp_path, window):
    path = tmp_path / "hand.csv"
    path.write_text(HAND_WRITTEN_CSV)
    w = load_trace(path, long_threshold=1000, **window)
    got = [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.klass, r.admission_priority)
           for r in w.requests]
    assert got == _reference_azure(HAND_WRITTEN_CSV, threshold=1000, **window)
    by_prompt = {300: 7, 5000: 7, 120: 0, 64: 0, 9000: 1, 2048: 0}  # the CSV's priority column (empty: 0)
    assert [r.priority for r in w.requests] == [by_prompt[r.prompt_tokens] for r in w.requests]
    assert w.params.get("priority_classes") == (sorted({r.priority for r in w.requests})
                                                if any(r.priority for r in w.requests) else None)


def test_streamed_jsonl_formats_give_the_hand_computed_requests(tmp_path):
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 2000, "input_length": 10, "output_length": 3}\n\n'
                    '{"timestamp": 500, "input_length": 4000, "output_length": 1, "admission_priority": -2}\n')
    w = load_trace(moon, long_threshold=100)
    assert [(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.klass, r.admission_priority)
            for r in w.requests] == [("trace-0000000", 0.5, 4000, 1, "long", -2),
                                     ("trace-0000001", 2.0, 10, 3, "short", 0)]
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"scheduled_at": 1.0, "prompt_tokens": 7, "output_tokens": 2, "klass": "long", '
                     '"request_id": "x"}\n'
                     '{"scheduled_at": 0.5, "prompt_tokens": 9, "output_tokens": 1, "klass": "short"}\n')
    w = load_trace(bench)
    assert [(r.request_id, r.arrival_s, r.klass) for r in w.requests] == [("trace-0000000", 0.5, "short"),
                                                                          ("x", 1.0, "long")]
    assert w.params["split"]["method"] == "recorded"


def test_trace_requests_read_like_a_list(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text(HAND_WRITTEN_CSV)
    w = load_trace(path, long_threshold=1000)
    listed = list(w.requests)
    assert len(w) == len(listed) == 6
    assert w.requests[-1] == listed[-1] and w.requests[1:3] == listed[1:3]
    assert w.requests == listed and listed == w.requests
    assert w.duration_s == 3.0
    with pytest.raises(IndexError):
        w.requests[6]


def test_trace_rows_parse_a_record_before_the_rest_of_the_file_exists():
    from prefillq.workload.traces import trace_rows

    handed_out: list[tuple] = []

    def source():
        yield "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        yield "0.5,100,3\n"
        assert handed_out, "the reader asked for line 3 before handing out the record of line 2"
        yield "not,a,number\n"

    trace_format, rows = trace_rows("pipe.csv", source())
    assert trace_format == "azure-csv"
    handed_out.append(next(rows))
    assert handed_out == [(0.5, 100, 3, None, None, 0, 2, None, 0)]
    with pytest.raises(WorkloadError, match=r"pipe\.csv:3"):
        next(rows)


def test_load_trace_never_holds_the_file_text(tmp_path):
    """A whole-file read holds the text (and its lines) at once; a streamed one a few dozen bytes a
    record: the traced peak stays far below the file's size."""
    import tracemalloc

    path = tmp_path / "padded.csv"
    padding = "x" * 800
    with path.open("w") as handle:
        handle.write("arrived_at,num_prefill_tokens,num_decode_tokens,note\n")
        handle.writelines(f"{i * 0.01:.2f},{100 + i % 900},{1 + i % 50},{padding}\n" for i in range(20_000))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        w = load_trace(path, long_threshold=500)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(w) == 20_000
    assert peak < size / 4, f"peak {peak:,} bytes while reading a {size:,}-byte trace"


def test_a_duplicate_id_is_reported_after_an_earlier_malformed_line_as_before(tmp_path):
    path = tmp_path / "dups.jsonl"
    path.write_text('{"scheduled_at": 0, "prompt_tokens": 5, "output_tokens": 1, "request_id": "a"}\n'
                    '{"scheduled_at": 1, "prompt_tokens": 5, "output_tokens": 1, "request_id": "a"}\n'
                    '{"scheduled_at": 2, "prompt_tokens": 0, "output_tokens": 1}\n')
    with pytest.raises(WorkloadError, match=r"dups.jsonl:3: prompt_tokens"):
        load_trace(path)
