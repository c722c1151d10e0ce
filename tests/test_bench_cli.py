"""``prefillq bench`` and ``prefillq report`` end to end against mock servers: output files, the summary
JSON, pairing across invocations, launched servers, bad input, Ctrl-C, and SPEC §5's priority rule."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.bench.launch import free_port
from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.results import ResultsDir
from prefillq.cli.bench import register

# Rounds of six tiny requests are judged "disturbed" by send lateness or a throughput dip whenever the
# test machine is busy; tests that are not about that rule switch it off (a later flag overrides these).
LOAD_PROOF = ["--lateness-limit-ms", "1000000", "--throughput-drop", "1"]
SMALL = ["--scenario", "long-first", "--set", "leading_long=4", "--set", "num_requests=6", "--set", "long_tokens=64",
         "--set", "short_tokens=4", "--set", "output_tokens=3", *LOAD_PROOF]
COMPARE_JSON_KEYS = {"short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "long_e2e_p95_ms",
                     "short_tpot_p50_ms", "output_tokens_per_s", "completed"}
RECORD_KEYS = {"request_id", "klass", "prompt_tokens", "output_tokens", "scheduled_at", "sent_at", "ttft_s",
               "e2e_s", "itl_s", "error"}


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps the commands sub-commands, as in the real CLI
        pass

    register(app)
    return app


def run(*args: str):
    return CliRunner().invoke(_app(), list(args))


def test_one_server_writes_records_summary_and_plots(tmp_path):
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = run("bench", "--url", server.url, *SMALL, "--reps", "2", "--warmup", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "short TTFT p50 (ms)" in result.output
    files = sorted(p.name for p in (out / "requests").iterdir())
    assert files == ["measured00-default.jsonl", "measured01-default.jsonl", "warmup00-default.jsonl"]
    lines = [json.loads(x) for x in (out / "requests" / "measured00-default.jsonl").read_text().splitlines()]
    assert len(lines) == 10
    assert all(set(line) >= RECORD_KEYS and line["klass"] in ("short", "long") for line in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]["default"]) >= COMPARE_JSON_KEYS
    assert summary["policies"]["default"]["completed"] == 20
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms",
                "output_throughput", "request_throughput", "total_input_tokens", "duration"):
        assert key in summary["policies"]["default"]
    assert summary["intervals"] == {}  # one policy: nothing to pair yet
    for png in ("ttft_cdf.png", "rounds.png", "send_lateness.png"):
        assert (out / png).stat().st_size > 1000


def test_second_label_on_the_same_folder_pairs_up_and_report_rerenders(tmp_path):
    out = tmp_path / "res"
    # The mock runs each policy on the simulated engine; a long prompt (64 tokens) takes 4 steps of 16,
    # and with threshold 32 the 64-token prompts are the long ones.
    limits = {"max_num_batched_tokens": 16}
    # The H100 profile's steps (12.8 ms each) make the effect far larger than the timing noise of a loaded machine.
    fcfs = MockBehaviour(engine_policy="default", engine_limits=limits, engine_profile="h100-qwen3.5-0.8b")
    shortest = MockBehaviour(engine_policy={"policy": "short_request_first", "threshold": 32}, engine_limits=limits,
                             engine_profile="h100-qwen3.5-0.8b")
    common = [*SMALL, "--reps", "2", "--warmup", "0", "--out", str(out), "--no-plots"]
    with MockServer(fcfs) as server:
        assert run("bench", "--url", server.url, *common).exit_code == 0
        again = run("bench", "--url", server.url, *common)
        assert again.exit_code == 2 and "already holds run measured00-default" in again.output
    with MockServer(shortest) as server:
        second = run("bench", "--url", server.url, "--policy-label", "short_request_first", *common)
    assert second.exit_code == 0, second.output
    summary = json.loads((out / "summary.json").read_text())
    interval = summary["intervals"]["short_request_first_vs_default"]["metrics"]["short_ttft_p50_ms"]
    assert interval["n"] == 2
    # One long prompt fills a step: under default the shorts wait behind the 4 longs (FCFS), under
    # short_request_first they are admitted first. A large effect by construction.
    assert interval["change"] < -0.3
    report = run("report", str(out), "--pair", "short_request_first:default")
    assert report.exit_code == 0, report.output
    assert "default vs short_request_first" in report.output
    assert (out / "intervals.png").exists()
    rerendered = json.loads((out / "summary.json").read_text())
    assert rerendered["intervals"]["short_request_first_vs_default"] == \
        summary["intervals"]["short_request_first_vs_default"]
    # --format: the same table for an issue or a notebook, on stdout only
    markdown = run("report", str(out), "--no-plots", "--format", "markdown").stdout
    assert "| metric | default | short_request_first |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| short TTFT p50 (ms)"))
    assert "[" in row and "]" in row  # the paired interval, two rounds
    rows = list(csv.reader(io.StringIO(run("report", str(out), "--no-plots", "--format", "csv").stdout)))
    assert rows[0] == ["metric", "default", "short_request_first"] and len(rows) == 10
    assert json.loads(run("report", str(out), "--no-plots", "--format", "json").stdout)["intervals"]


def test_a_bench_whose_every_round_was_disturbed_says_so_in_one_line(tmp_path):
    """A send-lateness limit no real send meets (1 ns): every round is disturbed. The figures are still
    shown (from the disturbed rounds), with one warning line and the flag in summary.json."""
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = run("bench", "--url", server.url, *SMALL, "--reps", "2", "--warmup", "0", "--out", str(out),
                     "--no-plots", "--lateness-limit-ms", "0.000001")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: every measured round (2) was disturbed")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["all_rounds_disturbed"] is True and len(summary["warnings"]) == 1


def test_measure_vllm_bench_is_recorded_and_not_mixed_with_the_other_clock(tmp_path):
    out = tmp_path / "res"
    common = [*SMALL, "--reps", "1", "--warmup", "0", "--out", str(out), "--no-plots"]
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = run("bench", "--url", server.url, "--measure", "vllm-bench", *common)
        assert result.exit_code == 0, result.output
        mixed = run("bench", "--url", server.url, "--policy-label", "hrrn", *common)
    assert mixed.exit_code == 2 and "was measured with --measure vllm-bench" in mixed.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["measure"] == "vllm-bench"
    assert all(run["measure"] == "vllm-bench" and run["prewarmed_connections"] == 0 for run in summary["runs"])
    assert run("report", str(out), "--no-plots").exit_code == 0
    assert json.loads((out / "summary.json").read_text())["settings"]["measure"] == "vllm-bench"


def test_several_urls_with_policies_rotate_and_compare(tmp_path):
    out = tmp_path / "res"
    with MockServer() as a, MockServer() as b:
        result = run("bench", "--url", a.url, "--url", b.url, "--policies", "default,hrrn", *SMALL, "--reps", "2",
                     "--warmup", "0", "--out", str(out), "--no-plots")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [row["order"] for row in summary["rounds"]] == [["default", "hrrn"], ["hrrn", "default"]]
    assert set(summary["intervals"]["hrrn_vs_default"]["metrics"]) >= {"short_ttft_p50_ms", "long_ttft_p95_ms"}


def test_priority_in_extra_body_is_not_forwarded_unless_the_operator_asks(tmp_path):
    """SPEC §5: a client cannot set the engine's internal priority."""
    with MockServer() as server:
        result = run("bench", "--url", server.url, *SMALL, "--reps", "1", "--warmup", "0", "--no-plots",
                     "--out", str(tmp_path / "a"), "--extra-body", '{"priority": -100, "top_p": 1.0}')
        assert result.exit_code == 0, result.output
        assert "is not forwarded" in result.output
        assert all("priority" not in r.body and r.body["top_p"] == 1.0 for r in server.received)
        server.received.clear()
        result = run("bench", "--url", server.url, *SMALL, "--reps", "1", "--warmup", "0", "--no-plots",
                     "--out", str(tmp_path / "b"), "--extra-body", '{"priority": 3}', "--forward-priority")
        assert result.exit_code == 0, result.output
        assert server.received and all(r.body["priority"] == 3 for r in server.received)


def test_unreachable_server_is_a_clear_error_before_anything_is_sent(tmp_path):
    out = tmp_path / "res"
    result = run("bench", "--url", f"http://127.0.0.1:{free_port()}", *SMALL, "--out", str(out))
    assert result.exit_code == 2
    assert "error: cannot reach" in result.output
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--launch", "vllm"], "--launch vllm needs --model"),
    (["--launch", "docker"], "--launch must be"),
    ([], "give either --url"),
    (["--url", "http://x", "--launch", "mock"], "give either --url"),
    (["--url", "http://x", "--scenario", "nope"], "unknown scenario"),
    (["--url", "http://x", "--set", "bogus=1"], "unknown parameter 'bogus'"),
    (["--url", "http://x", "--set", "noequals"], "--set expects KEY=VALUE"),
    (["--url", "http://x", "--url", "http://y"], "need --policies"),
    (["--url", "http://x", "--policies", "a,b"], "names 2 policies but 1 --url"),
    (["--launch", "mock", "--policies", "default,nonsense"], "unknown policy 'nonsense'"),
    (["--url", "http://x", "--reps", "0"], "--reps must be >= 1"),
    (["--url", "http://x", "--extra-body", "[1]"], "--extra-body must be a JSON object"),
    (["--url", "http://x", "--pair", "ab"], "--pair expects"),
    (["--url", "http://x", "--measure", "wall"], "--measure must be one of prefillq, vllm-bench"),
    (["--url", "http://x", "--policy", "hrrn"], "--policy SPEC configures a server we launch"),
    (["--launch", "mock", "--policy", "hrrn:partial_prefills=sorted"], "valid choices: first, ordered"),
    (["--launch", "mock", "--policy", "hrrn:partial_prefill=ordered"], "did you mean 'partial_prefills'"),
    (["--launch", "mock", "--policies", "hrrn", "--policy", "hrrn"], "policies repeat"),
    (["--launch", "mock", "--policy", "hrrn:partial_prefills=ordered", "--policy",
      "hrrn:partial_prefills=ordered "], "share the file name 'hrrn_partial_prefills=ordered'"),
])
def test_bad_input_exits_2_with_a_message(args, message):
    result = run("bench", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_report_of_a_folder_that_is_not_a_bench_folder(tmp_path):
    result = run("report", str(tmp_path))
    assert result.exit_code == 2 and "not a prefillq bench results folder" in result.output


@pytest.fixture(scope="module")
def finished_folder(tmp_path_factory):
    """A real bench results folder (one run on the mock), copied by the tests that damage it."""
    out = tmp_path_factory.mktemp("bench") / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = run("bench", "--url", server.url, *SMALL, "--reps", "1", "--warmup", "0", "--out", str(out),
                     "--no-plots")
    assert result.exit_code == 0, result.output
    return out


def _without_policy(path):
    first, *rest = path.read_text().splitlines()
    line = json.loads(first)
    del line["policy"]
    path.write_text("\n".join([json.dumps(line), *rest]) + "\n")


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "runs.jsonl").write_text('{"run": "x", garbage\n' + (d / "runs.jsonl").read_text()),
     "runs.jsonl line 1 is corrupt"),
    (lambda d: (d / "runs.jsonl").write_text("[1, 2]\n"), "runs.jsonl line 1 is not a JSON object"),
    (lambda d: _without_policy(d / "runs.jsonl"), "runs.jsonl line 1 has no 'policy'"),
    (lambda d: (d / "bench.json").write_text("{not json"), "bench.json is corrupt"),
    (lambda d: (d / "bench.json").write_text('{"invocations": [{"settings": 3}]}'), "bench.json is corrupt"),
])
def test_report_of_a_corrupt_folder_is_one_line_and_exit_2(finished_folder, tmp_path, damage, message):
    folder = tmp_path / "copy"
    shutil.copytree(finished_folder, folder)
    damage(folder)
    result = run("report", str(folder), "--no-plots")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_report_skips_a_last_line_a_crash_cut_short_and_a_resumed_bench_starts_a_new_line(finished_folder,
                                                                                         tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(finished_folder, folder)
    with (folder / "runs.jsonl").open("a") as stream:
        stream.write('{"run": "measured01-default", "pol')  # the crash
    assert run("report", str(folder), "--no-plots").exit_code == 0
    ResultsDir(folder).append_run({"run": "extra", "policy": "default", "phase": "warmup", "round": 0})
    lines = (folder / "runs.jsonl").read_text().splitlines()
    assert lines[-2].endswith('"pol') and json.loads(lines[-1])["run"] == "extra"
    assert run("report", str(folder), "--no-plots").exit_code == 0


def test_out_that_cannot_be_a_folder_fails_before_sending(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with MockServer() as server:
        result = run("bench", "--url", server.url, *SMALL, "--out", str(blocker / "res"))
        assert result.exit_code == 2 and "cannot write results to" in result.output
        assert "Traceback" not in result.output and not server.received


@pytest.mark.parametrize("servers", ["all-at-once", "one-at-a-time"])
def test_launch_mock_servers_per_policy(tmp_path, servers):
    out = tmp_path / "res"
    result = run("bench", "--launch", "mock", "--policies", "default,short_request_first", *SMALL, "--reps", "2",
                 "--warmup", "1", "--servers", servers, "--out", str(out), "--no-plots",
                 "--startup-timeout", "60")
    assert result.exit_code == 0, result.output
    logs = sorted(p.name for p in (out / "logs").iterdir())
    if servers == "all-at-once":
        assert logs == ["server-default-01.log", "server-short_request_first-01.log"]
    else:  # a fresh server per measured run, each warmed up first
        assert len(logs) == 4
        names = sorted(p.name for p in (out / "requests").iterdir())
        assert "warmup01-0-default.jsonl" in names and "measured01-default.jsonl" in names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policies"]["default"]["completed"] == 20
    assert summary["policies"]["short_request_first"]["failed"] == 0
    header = json.loads((out / "bench.json").read_text())
    assert header["invocations"][0]["targets"]["configs"]["short_request_first"]["policy"] == "short_request_first"
    # Each mock served its policy's real queue on the simulated engine (no stand-in ordering of its own).
    for policy in ("default", "short_request_first"):
        log = (out / "logs" / f"server-{policy}-01.log").read_text()
        assert f"simulated vLLM engine: waiting queue policy {policy}," in log


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_keeps_every_measured_record_and_writes_the_summary(tmp_path, stop_signal):
    """A real SIGINT (Ctrl-C) or SIGTERM to a running ``prefillq bench``: exit 130, complete JSONL lines,
    the summary of what finished."""
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.05)) as server:
        command = [sys.executable, "-c", "from prefillq.cli import main; main()", "bench", "--url", server.url,
                   "--scenario", "low-load", "--set", "duration_s=300", "--set", "output_tokens=20",
                   "--set", "long_tokens=64", "--reps", "1", "--warmup", "0", "--no-plots", "--out", str(out)]
        # A user's shell starts a command with Ctrl-C's default disposition. In the full suite this test's child
        # did not stop on SIGINT (it passed alone), so the child now starts with that disposition whatever an
        # earlier test or the launching shell left in this process (an ignored SIGINT is inherited).
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        records = out / "requests" / "measured00-default.jsonl"
        deadline = time.monotonic() + 240  # a loaded machine starts the process slowly; the run lasts 300 s
        while time.monotonic() < deadline and (not records.exists() or len(records.read_text().splitlines()) < 5):
            time.sleep(0.1)
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "interrupted" in output
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) >= 5
    assert all(set(line) >= RECORD_KEYS for line in lines)
    assert any(line["error"] == "interrupted" for line in lines)  # in flight when Ctrl-C came
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert runs[0]["interrupted"] is True
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["metrics"]["completed"] >= 5
    assert summary["rounds"][0]["disturbed"] is True


def test_trace_replay_of_a_bench_jsonl(tmp_path):
    """A bench requests file is itself a trace: replay it (what `prefillq tune --trace` also reads)."""
    first = tmp_path / "first"
    with MockServer() as server:
        assert run("bench", "--url", server.url, *SMALL, "--reps", "1", "--warmup", "0", "--no-plots",
                   "--out", str(first)).exit_code == 0
        trace = first / "requests" / "measured00-default.jsonl"
        result = run("bench", "--url", server.url, "--trace", str(trace), "--reps", "1", "--warmup", "0",
                     "--no-plots", "--out", str(tmp_path / "second"))
    assert result.exit_code == 0, result.output
    header = json.loads((tmp_path / "second" / "bench.json").read_text())
    assert header["requests"] == 10
    assert Path(header["workload"]["trace"]) == trace


def test_compare_sim_prints_predicted_vs_measured(tmp_path):
    out = tmp_path / "res"
    with MockServer(MockBehaviour(prefill_token_s=0.0005, token_interval_s=0.002)) as a, \
            MockServer(MockBehaviour(prefill_token_s=0.0005, token_interval_s=0.002)) as b:
        result = run("bench", "--url", a.url, "--url", b.url, "--policies", "default,hrrn", *SMALL, "--reps", "1",
                     "--warmup", "0", "--no-plots", "--out", str(out), "--compare-sim", "cpu-tiny-llama")
    assert result.exit_code == 0, result.output
    assert "simulator (cpu-tiny-llama) vs measured" in result.output
    block = json.loads((out / "summary.json").read_text())["compare_sim"]
    assert block["profile"] == "cpu-tiny-llama"
    for policy in ("default", "hrrn"):
        row = block["policies"][policy]["short_ttft_p50_ms"]
        assert row["measured"] > 0 and row["predicted"] > 0
        assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1)
    again = run("report", str(out), "--no-plots", "--compare-sim", "cpu-tiny-llama", "--budget", "256")
    assert again.exit_code == 0, again.output
    assert json.loads((out / "summary.json").read_text())["compare_sim"]["budget"] == 256


def test_unknown_profile_fails_before_sending(tmp_path):
    result = run("bench", "--url", "http://127.0.0.1:9", *SMALL, "--compare-sim", "no-such-profile",
                 "--out", str(tmp_path / "x"))
    assert result.exit_code == 2 and "unknown profile 'no-such-profile'" in result.output


def _default_signals() -> None:
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def test_terminating_a_launching_bench_stops_its_servers(tmp_path):
    import httpx

    out = tmp_path / "res"
    command = [sys.executable, "-c", "from prefillq.cli import main; main()", "bench", "--launch", "mock",
               "--policies", "default,hrrn", "--scenario", "low-load", "--set", "duration_s=30", "--reps", "1",
               "--warmup", "0", "--no-plots", "--out", str(out), "--server-arg=--token-interval-s=0.05"]
    # The child starts with the default signal dispositions and no blocked signals, whatever earlier tests
    # left in this process (ignored and blocked signals are inherited), and unbuffered: on a failure the
    # output shows how far it got.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_default_signals)
    records = out / "requests" / "measured00-default.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not records.exists() or not records.read_text().strip()):
        time.sleep(0.1)
    process.terminate()
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 130, output
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert runs and runs[0]["interrupted"]
    ports = [re.search(r"--port (\d+)", log.read_text()).group(1) for log in (out / "logs").iterdir()]
    assert len(ports) == 2  # both servers were started (all at once) ...
    for port in ports:  # ... and both are gone
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_launched_server_that_dies_is_reported_with_its_log_tail(tmp_path):
    result = run("bench", "--launch", "mock", "--policies", "default", *SMALL, "--out", str(tmp_path / "res"),
                 "--server-arg=--no-such-option", "--startup-timeout", "60")
    assert result.exit_code == 1
    assert "mock (default) server exited with status 2" in result.output
    assert "unrecognized arguments: --no-such-option" in result.output  # the tail of the server's log


# --- policy SPECs: the same engine with and without partial_prefills="ordered" (SPEC §3.6) ----------------

ORDERED = "hrrn:partial_prefills=ordered"


def test_launch_mock_with_policy_specs_keys_everything_by_label(tmp_path):
    out = tmp_path / "res"
    result = run("bench", "--launch", "mock", "--policies", "default", "--policy", "hrrn", "--policy", ORDERED,
                 *SMALL, "--reps", "2", "--warmup", "0", "--out", str(out), "--no-plots", "--startup-timeout", "60",
                 "--pair", f"hrrn:{ORDERED}")
    assert result.exit_code == 0, result.output
    # Files use the label's safe form; the JSON keeps the label as given.
    safe = "hrrn_partial_prefills=ordered"
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "server-default-01.log", "server-hrrn-01.log", f"server-{safe}-01.log"]
    names = sorted(p.name for p in (out / "requests").iterdir())
    assert names == sorted(f"measured{r:02d}-{label}.jsonl" for r in (0, 1) for label in ("default", "hrrn", safe))
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {run["policy"] for run in runs} == {"default", "hrrn", ORDERED}
    assert {run["run"] for run in runs if run["policy"] == ORDERED} == {f"measured00-{safe}", f"measured01-{safe}"}
    records = (out / "requests" / f"measured00-{safe}.jsonl").read_text().splitlines()
    assert all(json.loads(line)["policy"] == ORDERED for line in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policies"][ORDERED]["completed"] == 20 and summary["policies"][ORDERED]["failed"] == 0
    assert summary["baseline"] == "default"
    assert {"hrrn_vs_default", f"{ORDERED}_vs_default", f"{ORDERED}_vs_hrrn"} <= set(summary["intervals"])
    configs = json.loads((out / "bench.json").read_text())["invocations"][0]["targets"]["configs"]
    assert configs[ORDERED] == {**configs["hrrn"], "partial_prefills": "ordered"}
    assert configs["hrrn"]["partial_prefills"] == "first"
    # The mock ran that config on its simulated engine (not the plain policy).
    log = (out / "logs" / f"server-{safe}-01.log").read_text()
    assert "waiting queue policy hrrn (partial_prefills=ordered)," in log
    assert "waiting queue policy hrrn," in (out / "logs" / "server-hrrn-01.log").read_text()
    assert ORDERED in result.output  # the report names the label


def test_vllm_launch_puts_the_spec_config_into_additional_config(tmp_path):
    """The real-vLLM launch path's command, built without starting a server."""
    import shlex

    from prefillq.bench.launch import vllm_server
    from prefillq.config import load_config, parse_policy_spec

    _, config = parse_policy_spec("short_request_first:threshold=512,partial_prefills=ordered")
    server = vllm_server("/models/m", config, port=8123, log_path=tmp_path / "log",
                         extra_args=["--additional-config", '{"other_feature": 1}', "--max-num-batched-tokens", "512"])
    argv = server.argv
    assert argv[argv.index("--scheduler-cls") + 1] == "prefillq.integrations.vllm.Scheduler"
    additional = json.loads(argv[argv.index("--additional-config") + 1])
    assert additional["other_feature"] == 1
    assert additional["prefillq"] == config.to_dict()
    assert load_config(additional) == config and config.partial_prefills == "ordered"
    assert argv.count("--additional-config") == 1 and "512" in argv
    assert "partial_prefills=ordered" in server.name
    assert shlex.split(shlex.join(argv)) == argv
