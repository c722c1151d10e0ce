"""The load generator against the in-process mock: metric definitions on known timings, schedule
adherence, error/timeout/broken-stream accounting, JSONL that survives an interruption, pre-flight."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from prefillq.bench.analysis import vllm_style_metrics
from prefillq.bench.client import (
    Endpoint,
    JsonlWriter,
    ServerUnreachable,
    check_server,
    fit_text_prompts,
    run_load,
)
from prefillq.bench.launch import free_port
from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.payload import PayloadOptions, build_payload
from prefillq.bench.stream import Measurement
from prefillq.metrics import summarize, tpot_s
from prefillq.workload import RequestSpec

OPTIONS = PayloadOptions(model="mock-model")


def _specs(count: int, spacing_s: float = 0.005, output_tokens: int = 4, prompt_tokens: int = 8) -> list[RequestSpec]:
    return [RequestSpec(f"r{i:03d}", i * spacing_s, prompt_tokens, output_tokens, "long" if i % 4 == 0 else "short")
            for i in range(count)]


def _run(server: MockServer, specs: list[RequestSpec], **kwargs):
    payloads = [build_payload(spec, OPTIONS, 0) for spec in specs]
    return asyncio.run(run_load(payloads, server.url, **kwargs))


# --- metric definitions on known timings ---------------------------------------------------------

def test_record_from_known_event_times():
    """TTFT = first token - send; E2E = last token - send; ITL = gaps; TPOT = (E2E - TTFT) / (n - 1)."""
    spec = RequestSpec("a", 0.25, 100, 4, "short")
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.25)
    run_start = 1000.0
    measurement.sent_at = 1000.26  # 10 ms late
    for at in (1000.36, 1000.38, 1000.41, 1000.45):
        measurement.on_event(b'{"choices":[{"text":"x"}]}', at)
    measurement.on_event(b'{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":4}}', 1000.46)
    measurement.on_event(b"[DONE]", 1000.46)
    record = measurement.record(run_start)
    assert record.sent_at == pytest.approx(0.26)
    assert record.scheduled_at == 0.25
    assert record.ttft_s == pytest.approx(0.10)
    assert record.e2e_s == pytest.approx(0.19)  # the last token, not the usage event
    assert record.itl_s == pytest.approx([0.02, 0.03, 0.04])
    assert record.output_tokens == 4
    assert tpot_s(record) == pytest.approx(0.03)
    assert record.error is None


def test_output_tokens_fall_back_to_counted_events_without_usage():
    spec = RequestSpec("a", 0.0, 10, 8, "short")
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.0, sent_at=5.0)
    for at in (5.1, 5.2, 5.3):
        measurement.on_event(b'{"choices": [{"text": "x"}]}', at)  # spaced JSON: the parsing path
    record = measurement.record(5.0)
    assert record.output_tokens == 3
    assert record.ttft_s == pytest.approx(0.1) and record.e2e_s == pytest.approx(0.3)


def test_chunks_carrying_several_tokens_are_counted_by_the_running_usage():
    """vLLM may put several tokens in one event: the output count is the server's, each ITL gap is one
    chunk, and the tokens each chunk carried are the growth of the running usage total."""
    spec = RequestSpec("a", 0.0, 10, 7, "short")
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.0, sent_at=1.0)
    for at, total in ((1.1, 3), (1.2, 6), (1.25, 7)):
        measurement.on_event(json.dumps({"choices": [{"text": "x"}],
                                         "usage": {"prompt_tokens": 10, "completion_tokens": total}}).encode(), at)
    measurement.on_event(b'{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":7}}', 1.25)
    record = measurement.record(1.0)
    assert record.output_tokens == 7
    assert record.itl_s == pytest.approx([0.1, 0.05])
    assert measurement.chunk_tokens == [3, 3, 1] and measurement.chunks_counted
    assert tpot_s(record) == pytest.approx((0.25 - 0.1) / 6)


def test_without_running_usage_the_final_usage_still_gives_the_token_count():
    spec = RequestSpec("a", 0.0, 10, 7, "short")
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.0, sent_at=1.0)
    for at in (1.1, 1.2):
        measurement.on_event(b'{"choices":[{"text":"x y z"}],"usage":null}', at)
    measurement.on_event(b'{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":7}}', 1.2)
    record = measurement.record(1.0)
    assert record.output_tokens == 7 and len(record.itl_s) == 1
    assert not measurement.chunks_counted


def test_multi_token_chunks_from_the_mock_end_to_end():
    details: dict[str, dict] = {}
    with MockServer(MockBehaviour(tokens_per_chunk=3, token_interval_s=0.002)) as server:
        result = _run(server, _specs(4, output_tokens=7),
                      on_record=lambda record, extra: details.__setitem__(record.request_id, extra))
    assert result.errors == 0
    for record in result.records:
        assert record.output_tokens == 7 and len(record.itl_s) == 2  # 3 + 3 + 1 tokens in 3 chunks
        assert details[record.request_id]["chunk_tokens"] == [3, 3, 1]
        assert tpot_s(record) == pytest.approx((record.e2e_s - record.ttft_s) / 6)


def test_stream_without_tokens_is_an_error():
    spec = RequestSpec("a", 0.0, 10, 8, "short")
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.0, sent_at=1.0)
    measurement.on_event(b"[DONE]", 1.1)
    record = measurement.record(1.0)
    assert record.error == "stream ended without a token"
    assert record.ttft_s is None and not record.ok


def test_metrics_against_the_mock_respect_its_delays():
    """Each token leaves the mock no earlier than its delay, so the measured times are bounded below; the
    definitions tie them together exactly (TTFT + sum(ITL) = E2E)."""
    behaviour = MockBehaviour(first_token_delay_s=0.03, token_interval_s=0.01)
    with MockServer(behaviour) as server:
        result = _run(server, _specs(6, spacing_s=0.01, output_tokens=5))
    assert len(result.records) == 6 and result.errors == 0
    for record in result.records:
        assert record.output_tokens == 5
        assert record.ttft_s >= 0.03
        assert record.e2e_s >= 0.03 + 4 * 0.01
        assert len(record.itl_s) == 4
        assert record.ttft_s + sum(record.itl_s) == pytest.approx(record.e2e_s)
        assert tpot_s(record) == pytest.approx((record.e2e_s - record.ttft_s) / 4)
    summary = summarize(result.records)
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["output_tokens"] == 30


# --- the two clock definitions ---------------------------------------------------------------------

def _timed_measurement(measure: str) -> Measurement:
    """Due at 1000.00, written at 1000.03 (a 30 ms connect), token bytes read at .10/.12/.15 and each
    event parsed 1, 2 and 3 ms after its read."""
    spec = RequestSpec("a", 0.0, 10, 3, "short")
    parsed = iter([1000.101, 1000.122, 1000.153])
    measurement = Measurement(payload=build_payload(spec, OPTIONS, 0), scheduled_at=0.0, due_at=1000.0,
                              sent_at=1000.03, measure=measure, stamp=lambda: next(parsed))
    for at in (1000.10, 1000.12, 1000.15):
        measurement.on_event(b'{"choices":[{"text":"x"}]}', at)
    measurement.on_event(b'{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3}}', 1000.16)
    return measurement


def test_prefillq_clock_runs_from_the_write_to_the_bytes_read():
    record = _timed_measurement("prefillq").record(1000.0)
    assert record.sent_at == pytest.approx(0.03)
    assert record.ttft_s == pytest.approx(0.07) and record.e2e_s == pytest.approx(0.12)
    assert record.itl_s == pytest.approx([0.02, 0.03])


def test_vllm_bench_clock_runs_from_due_to_the_event_parsed():
    """vllm bench serve's clock: started before the connection is taken (here 30 ms of connect inside
    it), read after each event is parsed: 31 ms more TTFT than ours on the same timings."""
    record = _timed_measurement("vllm-bench").record(1000.0)
    assert record.sent_at == pytest.approx(0.0)
    assert record.ttft_s == pytest.approx(0.101) and record.e2e_s == pytest.approx(0.153)
    assert record.itl_s == pytest.approx([0.021, 0.031])
    assert tpot_s(record) == pytest.approx(0.026)


@pytest.mark.parametrize("measure", ["prefillq", "vllm-bench"])
def test_a_slow_connect_is_inside_the_vllm_bench_clock_only(monkeypatch, measure):
    """Every connect takes 50 ms more (injected). vllm-bench opens none ahead and starts its clock when a
    request is due, so a request that connects has the 50 ms inside its TTFT; prefillq opens connections
    before the clock starts, and starts each request's clock at the write."""
    from prefillq.bench.connection import Pool

    real_open = Pool.open

    async def slow_open(self):
        await asyncio.sleep(0.05)
        return await real_open(self)

    monkeypatch.setattr(Pool, "open", slow_open)
    details: dict[str, dict] = {}
    with MockServer(MockBehaviour(first_token_delay_s=0.02, token_interval_s=0.002)) as server:
        result = _run(server, _specs(3, spacing_s=0.3, output_tokens=3), measure=measure,
                      on_record=lambda record, extra: details.__setitem__(record.request_id, extra))
    assert result.errors == 0
    first = result.records[0]
    send_after_due = details[first.request_id]["send_after_due_s"]
    if measure == "vllm-bench":
        assert result.prewarmed_connections == 0
        assert send_after_due >= 0.05  # it connected on its own clock
        assert first.ttft_s >= send_after_due + 0.02
    else:
        assert result.prewarmed_connections >= 1  # opened before the clock started
    for record in result.records:  # from the write, the server's 20 ms are always there
        extra = details[record.request_id]["send_after_due_s"]
        assert (record.ttft_s - (extra if measure == "vllm-bench" else 0.0)) >= 0.02


def test_unknown_measure_is_refused():
    with MockServer() as server, pytest.raises(ValueError, match="measure must be one of"):
        _run(server, _specs(1), measure="wall")


# --- schedule adherence ---------------------------------------------------------------------------

def test_sends_follow_the_schedule_never_early_and_in_order():
    specs = _specs(60, spacing_s=0.004)
    with MockServer(MockBehaviour(token_interval_s=0.002)) as server:
        result = _run(server, specs)
    records = result.records
    assert [r.request_id for r in records] == [s.request_id for s in specs]
    assert all(r.sent_at >= r.scheduled_at for r in records)  # absolute targets: never before time
    by_send = sorted(records, key=lambda r: r.sent_at)
    assert [r.request_id for r in by_send] == [s.request_id for s in specs]
    assert len(server.received) == 60
    assert [r.headers["x-request-id"] for r in server.received] == [s.request_id for s in specs]


def test_at_a_high_rate_every_record_is_written_and_sends_keep_schedule_order(tmp_path):
    """800 streamed requests 0.2 ms apart (5,000 a second, more than this client parses on time, so
    reads wait for sends): one record per request, each with all its tokens, every one on disk, and the
    sends in schedule order (all on connections opened before the run: a send that has to connect first
    goes out after the connect, behind later ones)."""
    specs = _specs(800, spacing_s=0.0002, output_tokens=4)
    path = tmp_path / "run.jsonl"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server, path.open("w") as stream:
        result = _run(server, specs, on_record=JsonlWriter(stream), timeout_s=60)
    records = result.records
    assert [r.request_id for r in records] == [s.request_id for s in specs]
    assert result.errors == 0
    assert all(r.output_tokens == 4 and len(r.itl_s) == 3 for r in records)
    assert [r.sent_at for r in records] == sorted(r.sent_at for r in records)  # sent in schedule order
    assert all(r.sent_at >= r.scheduled_at for r in records)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["request_id"] for line in lines) == [s.request_id for s in specs]
    assert all(line["error"] is None and line["output_tokens"] == 4 for line in lines)
    assert len(server.received) == 800


@pytest.mark.parametrize("guard_s", [0.0, 0.002, 10.0])
def test_holding_reads_for_sends_changes_no_record(guard_s):
    """Whether reads are parsed at once (0), held near a send (2 ms) or held while any send is to come
    (10 s), the records carry the same requests, tokens and errors."""
    faults = {"r003": "http500", "r005": "break:2"}
    specs = _specs(40, spacing_s=0.002, output_tokens=6)
    with MockServer(MockBehaviour(faults=faults, token_interval_s=0.001)) as server:
        result = _run(server, specs, guard_s=guard_s)
    seen = [(r.request_id, r.output_tokens if r.ok else None, len(r.itl_s), (r.error or "")[:13])
            for r in result.records]
    expected = [(s.request_id, None if s.request_id in faults else 6, 0 if s.request_id in faults else 5,
                 {"r003": "HTTP 500: inj", "r005": "stream broken"}.get(s.request_id, "")) for s in specs]
    assert seen == expected


def test_identical_arrival_times_all_go_out():
    specs = [RequestSpec(f"b{i}", 0.0, 4, 2, "short") for i in range(20)]  # one burst
    with MockServer() as server:
        result = _run(server, specs)
    assert result.errors == 0 and len(result.records) == 20


def test_lateness_summary_shape():
    with MockServer() as server:
        result = _run(server, _specs(10))
    late = result.lateness_summary()
    assert set(late) == {"send_lateness_p50_ms", "send_lateness_p99_ms", "send_lateness_max_ms"}
    assert 0 <= late["send_lateness_p50_ms"] <= late["send_lateness_p99_ms"] <= late["send_lateness_max_ms"]


# --- faults are recorded, counted, never raised ----------------------------------------------------

def test_errors_timeouts_and_broken_streams_are_counted():
    faults = {"r001": "http500", "r002": "break:2", "r003": "close", "r004": "hang", "r005": "bad-json",
              "r006": "break:0"}
    with MockServer(MockBehaviour(faults=faults, token_interval_s=0.002)) as server:
        result = _run(server, _specs(10), timeout_s=1.0)
    errors = {r.request_id: r.error for r in result.records}
    assert errors["r000"] is None and errors["r007"] is None
    assert errors["r001"] == "HTTP 500: injected failure"
    assert errors["r002"].startswith("stream broken")
    assert errors["r003"].startswith("connection closed before the response")
    assert errors["r004"] == "timeout after 1 s"
    assert errors["r005"].startswith("malformed event")
    assert errors["r006"].startswith("stream broken")
    assert result.errors == 6
    failed = [r for r in result.records if r.error]
    assert all(r.ttft_s is None and r.e2e_s is None and r.itl_s == [] for r in failed)
    assert summarize(result.records)["failed"] == 6
    assert vllm_style_metrics(result.records)["failed"] == 6
    assert vllm_style_metrics(result.records)["completed"] == 4


def test_http_error_body_is_kept_short_and_readable():
    with MockServer(MockBehaviour(vocab_size=10)) as server:  # our ids go up to 1000: the server refuses
        result = _run(server, _specs(2))
    assert all(r.error.startswith("HTTP 400: token id") for r in result.records)


def test_server_going_away_mid_run_is_recorded():
    server = MockServer(MockBehaviour(token_interval_s=0.05)).start()
    specs = _specs(5, spacing_s=0.01, output_tokens=20)

    async def scenario():
        task = asyncio.create_task(run_load([build_payload(s, OPTIONS, 0) for s in specs], server.url,
                                            timeout_s=5))
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
        return await task

    result = asyncio.run(scenario())
    assert len(result.records) == 5
    assert all(r.error for r in result.records)


# --- nothing measured is lost ----------------------------------------------------------------------

def test_jsonl_lines_are_flushed_as_requests_finish_and_survive_cancellation(tmp_path):
    """Cancel mid-run (what Ctrl-C does): finished requests are on disk, in-flight ones are recorded as
    interrupted, not-yet-sent ones are absent; every line is complete JSON with the documented keys.

    The cancel is driven by events, not by a fixed sleep: it comes once the three fast requests are on
    disk and the mock has received both slow ones (whose streams cannot end before the test does). A
    fixed sleep flaked on a loaded machine: the run's pre-clock work (opening connections, a full
    garbage collection over a test session's big heap) outlasted it and the cancel landed before any send.
    """
    path = tmp_path / "run.jsonl"
    specs = [RequestSpec(f"f{i}", 0.0, 4, 2, "short") for i in range(3)]
    specs += [RequestSpec(f"s{i}", 0.05, 4, 100_000, "long") for i in range(2)]  # 100000 tokens x 20 ms
    specs += [RequestSpec("late", 3600.0, 4, 2, "short")]  # never sent
    seen_on_disk: list[int] = []

    with MockServer(MockBehaviour(token_interval_s=0.02)) as server, path.open("w") as stream:
        writer = JsonlWriter(stream, {"policy": "default"})

        def on_record(record, details):
            writer(record, details)
            seen_on_disk.append(len(path.read_text().splitlines()))  # already flushed

        async def scenario():
            task = asyncio.create_task(run_load([build_payload(s, OPTIONS, 0) for s in specs], server.url,
                                                on_record=on_record))
            for _ in range(6000):  # a safety net only (60 s); the condition is what ends the wait
                if len(seen_on_disk) >= 3 and len(server.received) >= 5:
                    break
                assert not task.done()
                await asyncio.sleep(0.01)
            assert len(seen_on_disk) == 3 and len(server.received) == 5
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(scenario())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert seen_on_disk == list(range(1, len(lines) + 1))
    by_id = {line["request_id"]: line for line in lines}
    assert set(by_id) == {"f0", "f1", "f2", "s0", "s1"}
    assert all(by_id[f"f{i}"]["error"] is None for i in range(3))
    assert by_id["s0"]["error"] == "interrupted" and by_id["s1"]["error"] == "interrupted"
    for line in lines:
        assert {"request_id", "klass", "prompt_tokens", "output_tokens", "scheduled_at", "sent_at", "ttft_s",
                "e2e_s", "itl_s", "error", "policy"} <= set(line)


# --- pre-flight ------------------------------------------------------------------------------------

def test_check_server_finds_the_model_and_reports_problems():
    with MockServer(MockBehaviour(model="tiny")) as server:
        assert check_server(server.url) == "tiny"
        assert check_server(server.url + "/v1") == "tiny"
        with pytest.raises(ServerUnreachable, match="does not serve model 'other'"):
            check_server(server.url, model="other")
    with pytest.raises(ServerUnreachable, match="cannot reach"):
        check_server(f"http://127.0.0.1:{free_port()}", timeout_s=1)


def test_endpoint_parsing():
    assert Endpoint.parse("http://h:81/v1").url == "http://h:81"
    assert Endpoint.parse("127.0.0.1:9000").port == 9000
    assert Endpoint.parse("https://example.org/prefix/").base_path == "/prefix"
    with pytest.raises(ValueError):
        Endpoint.parse("ftp://x")


def test_text_prompts_are_fitted_with_tokenize():
    specs = _specs(3, prompt_tokens=17)
    options = PayloadOptions(model="mock-model", text_prompts=True)
    with MockServer() as server:
        texts, exact = fit_text_prompts(server.url, options, specs, 0)
        assert exact
        assert all(len(texts[s.request_id].split()) == 17 for s in specs)
        payloads = [build_payload(s, options, 0, text=texts[s.request_id]) for s in specs]
        result = asyncio.run(run_load(payloads, server.url))
    assert result.errors == 0
    assert not math.isnan(result.records[0].ttft_s)
