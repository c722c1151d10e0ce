"""The ``stock`` row of ``bench --launch`` (the engine's own scheduler, the natural baseline), servers
pinned with ``--server-cpus``, and the late-rounds warning that says how to pin client and server apart."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from prefillq.bench import pinning
from prefillq.bench.analysis import ProtocolSettings
from prefillq.bench.launch import STOCK, LaunchedTargets, ServerFailed, pinned, vllm_server
from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.pinning import format_cpu_list, parse_cpu_list, sharing_hint
from prefillq.bench.results import analyse
from prefillq.config import load_config
from tests.test_bench_cli import SMALL, run
from tests.test_bench_protocol import _folder, _records

SCHEDULER = "prefillq.integrations.vllm.Scheduler"


def _option(argv, option):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == option]


# --- the command each row launches --------------------------------------------------------------------

def test_stock_row_is_the_policy_command_without_prefillq(tmp_path):
    extra = ["--additional-config", '{"other_feature": 1}', "--max-num-batched-tokens", "512", "--enforce-eager"]
    policy = vllm_server("/models/m", load_config("hrrn"), port=8123, log_path=tmp_path / "a", extra_args=extra)
    stock = vllm_server("/models/m", None, port=8123, log_path=tmp_path / "b", extra_args=extra)
    assert _option(policy.argv, "--scheduler-cls") == [SCHEDULER]
    assert json.loads(_option(policy.argv, "--additional-config")[0])["prefillq"]["policy"] == "hrrn"
    # stock: vLLM's own scheduler, the user's other additional-config keys kept, everything else identical
    assert "--scheduler-cls" not in stock.argv and not any(a.startswith("--scheduler-cls=") for a in stock.argv)
    assert [json.loads(v) for v in _option(stock.argv, "--additional-config")] == [{"other_feature": 1}]
    strip = {"--scheduler-cls", "--additional-config"}
    rest = [a for i, a in enumerate(policy.argv) if a not in strip and (i == 0 or policy.argv[i - 1] not in strip)]
    rest_stock = [a for i, a in enumerate(stock.argv) if a not in strip and (i == 0 or stock.argv[i - 1] not in strip)]
    assert rest == rest_stock and "512" in rest_stock and "--enforce-eager" in rest_stock
    assert stock.env == policy.env  # same environment (offline, private, KV cache size)
    assert "stock" in stock.name


def test_stock_drops_a_prefillq_key_and_any_scheduler_class_it_was_given(tmp_path):
    extra = ["--additional-config", json.dumps({"prefillq": {"policy": "hrrn"}}), "--scheduler-cls=my.Sched"]
    stock = vllm_server("/models/m", None, port=9, log_path=tmp_path / "log", extra_args=extra)
    assert not any("scheduler-cls" in arg or "prefillq" in arg for arg in stock.argv[1:]), stock.argv
    assert "--additional-config" not in stock.argv  # nothing of the user's was left in it


def test_launched_targets_build_one_command_per_row_with_their_pinning(tmp_path):
    configs = {STOCK: None, "hrrn": load_config("hrrn")}
    targets = LaunchedTargets("vllm", configs, model="/models/m", log_dir=tmp_path, base_port=8200,
                              extra_args=["--max-num-batched-tokens", "256"], server_cpus="0")
    stock, hrrn = targets.server(STOCK, tmp_path / "s.log"), targets.server("hrrn", tmp_path / "h.log")
    for server in (stock, hrrn):
        assert server.argv[1:3] == ["-c", "0"] and server.argv[0].endswith("taskset")
    assert SCHEDULER in hrrn.argv and SCHEDULER not in stock.argv
    assert stock.url.endswith(":8200") and hrrn.url.endswith(":8201")
    described = targets.describe()
    assert described["configs"][STOCK] is None and described["configs"]["hrrn"]["policy"] == "hrrn"
    assert described["server_cpus"] == "0"
    unpinned = LaunchedTargets("vllm", configs, model="/models/m", log_dir=tmp_path)
    assert unpinned.server(STOCK, tmp_path / "u.log").argv[0] == sys.executable


def test_a_pinned_command_runs_on_those_cpus_only():
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    out = subprocess.run(pinned(probe, "0"), capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[0]"
    assert pinned(probe, None) == probe


def test_pinning_without_taskset_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ServerFailed, match="needs the taskset command"):
        pinned(["x"], "0")
    assert "no taskset command on PATH" in pinning.server_cpus_problem("0")


# --- the CLI ------------------------------------------------------------------------------------------

def test_launch_mock_with_a_stock_row_makes_it_the_baseline(tmp_path):
    out = tmp_path / "res"
    result = run("bench", "--launch", "mock", "--policies", "stock,hrrn", *SMALL, "--reps", "2", "--warmup", "0",
                 "--out", str(out), "--no-plots", "--startup-timeout", "60", "--compare-sim", "h200-qwen3-0.6b")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"] == STOCK and list(summary["policies"]) == [STOCK, "hrrn"]
    assert summary["policies"][STOCK]["completed"] == 20 and summary["policies"][STOCK]["failed"] == 0
    assert set(summary["intervals"]) == {"hrrn_vs_stock"}
    assert summary["intervals"]["hrrn_vs_stock"]["metrics"]["short_ttft_p50_ms"]["n"] == 2
    assert [row["order"] for row in summary["rounds"]] == [[STOCK, "hrrn"], ["hrrn", STOCK]]  # Williams rows
    header = json.loads((out / "bench.json").read_text())
    assert header["invocations"][0]["targets"]["configs"][STOCK] is None
    # the mock's simulated engine ran arrival order for the stock row (stock vLLM's FCFS)
    assert "waiting queue policy default," in (out / "logs" / "server-stock-01.log").read_text()
    assert STOCK in summary["compare_sim"]["policies"] and summary["compare_sim"]["skipped"] == []
    # report re-renders with the same baseline; --baseline still overrides
    again = run("report", str(out), "--no-plots", "--format", "json")
    assert json.loads(again.stdout)["baseline"] == STOCK
    flipped = json.loads(run("report", str(out), "--no-plots", "--format", "json", "--baseline", "hrrn").stdout)
    assert set(flipped["intervals"]) == {"stock_vs_hrrn"}


@pytest.mark.parametrize("args", [
    ["--url", "http://127.0.0.1:9", "--policy-label", "stock"],
    ["--url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:10", "--policies", "stock,hrrn"],
])
def test_stock_against_a_running_server_is_refused_in_one_line(args):
    result = run("bench", *args)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "prefillq cannot choose the scheduler" in result.output


@pytest.mark.parametrize("args, message", [
    (["--url", "http://x", "--server-cpus", "0"], "--server-cpus pins servers we launch"),
    (["--launch", "mock", "--server-cpus", "zero"], "is not a CPU list"),
    (["--launch", "mock", "--server-cpus", "1-0"], "runs backwards"),
    (["--launch", "mock", "--server-cpus", "4096"], "CPU 4096 does not exist"),
])
def test_bad_server_cpus_exit_2(args, message):
    result = run("bench", *args)
    assert result.exit_code == 2 and message in result.output


def test_server_cpus_without_taskset_exits_2(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    result = run("bench", "--launch", "mock", "--server-cpus", "0", *SMALL)
    assert result.exit_code == 2 and "no taskset command on PATH" in result.output


def test_server_cpus_runs_the_launched_server_under_taskset_and_late_rounds_say_how_to_pin(tmp_path):
    """Every round late (a 1 ns limit): the one warning line names the fix, with --server-cpus."""
    out = tmp_path / "res"
    result = run("bench", "--launch", "mock", "--policies", "default", *SMALL, "--reps", "1", "--warmup", "0",
                 "--out", str(out), "--no-plots", "--startup-timeout", "60", "--server-cpus", "0",
                 "--lateness-limit-ms", "0.000001")
    assert result.exit_code == 0, result.output
    command = (out / "logs" / "server-default-01.log").read_text().splitlines()[0]
    assert shlex.split(command[2:])[1:3] == ["-c", "0"] and "taskset" in command.split()[1]
    summary = json.loads((out / "summary.json").read_text())
    [warning] = summary["warnings"]
    assert warning.startswith("every measured round (1) was disturbed")
    assert "pin them to separate cores" in warning and "--server-cpus" in warning
    assert json.loads((out / "bench.json").read_text())["invocations"][0]["targets"]["server_cpus"] == "0"


def test_late_rounds_against_a_local_url_say_how_to_pin_the_server_and_the_client(tmp_path):
    out = tmp_path / "res"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = run("bench", "--url", server.url, *SMALL, "--reps", "1", "--warmup", "0", "--out", str(out),
                     "--no-plots", "--lateness-limit-ms", "0.000001")
    assert result.exit_code == 0, result.output
    [warning] = json.loads((out / "summary.json").read_text())["warnings"]
    assert "the server runs on this machine" in warning and "prefillq bench ..." in warning


# --- the warning's text, from what bench.json recorded ------------------------------------------------

def _with_header(results, invocation):
    results.write_header({"invocations": [invocation]})
    return results


LAUNCHED = {"client_cpus": [0, 1], "targets": {"launch": "vllm", "server_cpus": None}}


def test_some_late_rounds_on_shared_cores_get_a_warning_that_names_the_fix(tmp_path):
    results = _with_header(_folder(tmp_path, disturb={2: _records(0.3, 2.2, late_s=0.05)}), LAUNCHED)
    [warning] = analyse(results, ProtocolSettings(lateness_limit_ms=10.0))["warnings"]
    assert warning == ("1 of 4 measured rounds were sent late and are excluded; the client shares CPU(s) 0-1 with "
                       "the servers it launched: pin them to separate cores, e.g. `taskset -c 1 prefillq bench ... "
                       "--server-cpus 0`")


@pytest.mark.parametrize("invocation", [
    {"client_cpus": [1], "targets": {"launch": "vllm", "server_cpus": "0"}},  # pinned apart already
    {"client_cpus": [0, 1], "targets": {"urls": {"default": "http://gpu-box:8000"}}},  # another machine
    {},  # nothing recorded (a folder of an older prefillq)
])
def test_no_pinning_advice_when_cores_are_not_shared_or_unknown(tmp_path, invocation):
    results = _with_header(_folder(tmp_path, disturb={2: _records(0.3, 2.2, late_s=0.05)}), invocation)
    assert analyse(results, ProtocolSettings(lateness_limit_ms=10.0))["warnings"] == []


def test_rounds_disturbed_by_something_else_get_no_pinning_advice(tmp_path):
    results = _with_header(_folder(tmp_path, disturb={2: _records(0.3, 2.2, failed=1)}), LAUNCHED)
    assert analyse(results, ProtocolSettings(lateness_limit_ms=10.0))["warnings"] == []


@pytest.mark.parametrize("invocation, expected", [
    ({"client_cpus": [0, 1, 2, 3], "targets": {"launch": "vllm", "server_cpus": "0-2"}},
     "shares CPU(s) 0-2 with the servers it launched: pin them to separate cores, e.g. "
     "`taskset -c 3 prefillq bench ... --server-cpus 0-2`"),
    ({"client_cpus": [0], "targets": {"launch": "mock"}}, "share the only CPU (0)"),
    ({"client_cpus": [0, 1], "targets": {"urls": {"default": "http://localhost:8000"}}},
     "start the server under `taskset -c 0 ...` and the client as `taskset -c 1 prefillq bench ...`"),
])
def test_sharing_hint(invocation, expected):
    assert expected in sharing_hint(invocation)


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0,2-4, 7") == {0, 2, 3, 4, 7}
    assert format_cpu_list({7, 0, 2, 3, 4}) == "0,2-4,7"
    assert format_cpu_list(parse_cpu_list("5")) == "5"
