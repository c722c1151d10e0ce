"""The protocol: rotation, warm-ups, disturbed rounds excluded for all policies, the summary's shape,
vllm-bench-serve key names, results folders that refuse to mix schedules, and a server that dies."""

from __future__ import annotations

import itertools
import json

import pytest

from prefillq.bench.analysis import ProtocolSettings, vllm_style_metrics
from prefillq.bench.client import WAKE_UP_USER
from prefillq.bench.launch import LaunchedServer, ServerFailed, Targets, UrlTargets
from prefillq.bench.mockserver import MockServer
from prefillq.bench.payload import PayloadOptions, build_payload
from prefillq.bench.results import BenchError, ResultsDir, analyse, workload_fingerprint, workload_from_header
from prefillq.bench.run import Invocation, planned_runs, round_order, run_protocol
from prefillq.metrics import RequestRecord
from prefillq.workload import RequestSpec, Workload, scenario

COMPARE_JSON_KEYS = {"short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "long_e2e_p95_ms",
                     "short_tpot_p50_ms", "output_tokens_per_s", "completed"}


def test_rotation_puts_every_policy_in_every_position():
    policies = ["default", "hrrn", "short_request_first"]
    orders = [round_order(policies, r) for r in range(3)]
    assert orders[0] == policies
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(policies)
    assert round_order(policies, 4, rotate=False) == policies


def test_plans_for_shared_and_fresh_servers():
    settings = ProtocolSettings(warmup=1, reps=2)
    shared = planned_runs(["a", "b"], settings, fresh_per_run=False)
    assert shared == [("warmup", 0, "a", None), ("warmup", 0, "b", None),
                      ("measured", 0, "a", None), ("measured", 0, "b", None),
                      ("measured", 1, "b", None), ("measured", 1, "a", None)]
    fresh = planned_runs(["a", "b"], settings, fresh_per_run=True)
    assert fresh[:2] == [("warmup", 0, "a", 0), ("measured", 0, "a", None)]
    assert len(fresh) == 8


def test_vllm_bench_serve_keys_on_known_records():
    records = [
        RequestRecord("a", "short", 10, 3, 0.0, 0.0, 0.1, 0.3, [0.1, 0.1]),
        RequestRecord("b", "long", 30, 3, 0.0, 0.5, 0.3, 0.5, [0.1, 0.1]),
        RequestRecord("c", "short", 10, 3, 0.0, 0.6, None, None, [], error="HTTP 500: x"),
    ]
    metrics = vllm_style_metrics(records, duration_s=1.0)
    assert metrics["completed"] == 2 and metrics["failed"] == 1
    assert metrics["total_input_tokens"] == 40 and metrics["total_output_tokens"] == 6
    assert metrics["request_throughput"] == 2.0 and metrics["output_throughput"] == 6.0
    assert metrics["total_token_throughput"] == 46.0
    assert metrics["mean_ttft_ms"] == pytest.approx(200.0)
    assert metrics["median_ttft_ms"] == pytest.approx(200.0)
    assert metrics["std_ttft_ms"] == pytest.approx(100.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(100.0)
    assert metrics["p99_itl_ms"] == pytest.approx(100.0)
    assert metrics["mean_e2el_ms"] == pytest.approx(400.0)
    assert metrics["max_concurrent_requests"] == 1  # a ends at 0.3, b runs 0.5 - 1.0


# --- analysis on hand-made results folders ------------------------------------------------------

def _records(short_ttft: float, long_ttft: float, *, late_s: float = 0.0, failed: int = 0, stretch: float = 1.0):
    records = []
    for i in range(8):
        klass = "long" if i % 4 == 0 else "short"
        ttft = long_ttft if klass == "long" else short_ttft
        error = "HTTP 500: x" if i < failed else None
        records.append(RequestRecord(f"r{i}", klass, 100, 5, i * 0.01, i * 0.01 + late_s, None if error else ttft,
                                     None if error else ttft + 0.04 * stretch, [] if error else [0.01 * stretch] * 4,
                                     error))
    return records


def _write_run(results: ResultsDir, phase: str, round_index: int, policy: str, records, **info):
    name = f"{phase}{round_index:02d}-{policy}"
    results.requests_dir.mkdir(parents=True, exist_ok=True)
    with results.requests_path(name).open("w") as stream:
        for record in records:
            stream.write(json.dumps({**record.to_dict(), "policy": policy, "phase": phase, "round": round_index})
                         + "\n")
    results.append_run({"run": name, "policy": policy, "phase": phase, "round": round_index, "position": 0,
                        "interrupted": False, "server_failed": None, **info})


def _folder(tmp_path, disturb=None):
    results = ResultsDir(tmp_path / "res")
    _write_run(results, "warmup", 0, "default", _records(9.0, 9.0))  # wild warm-up values are ignored
    _write_run(results, "warmup", 0, "hrrn", _records(9.0, 9.0))
    for r in range(4):
        default = _records(1.0 + 0.1 * r, 2.0)
        hrrn = _records((1.0 + 0.1 * r) * 0.25, 2.2)
        if disturb and r in disturb:
            hrrn = disturb[r]
        _write_run(results, "measured", r, "default", default)
        _write_run(results, "measured", r, "hrrn", hrrn)
    return results


def test_summary_has_the_compare_json_block_intervals_and_rounds(tmp_path):
    summary = analyse(_folder(tmp_path))
    assert list(summary["policies"]) == ["default", "hrrn"]
    for block in summary["policies"].values():
        assert set(block) >= COMPARE_JSON_KEYS
        assert {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "output_throughput", "completed"} <= set(block)
        assert block["reps"] == 4
        assert block["completed"] == 32  # counts add up over the rounds
    assert summary["policies"]["default"]["short_ttft_p50_ms"] == pytest.approx(1150.0)  # median of rounds
    interval = summary["intervals"]["hrrn_vs_default"]["metrics"]["short_ttft_p50_ms"]
    assert interval["n"] == 4
    assert interval["change"] == pytest.approx(-0.75)
    assert interval["ci_low"] <= -0.75 <= interval["ci_high"]
    long_interval = summary["intervals"]["hrrn_vs_default"]["metrics"]["long_ttft_p95_ms"]
    assert long_interval["change"] == pytest.approx(0.1)
    assert summary["excluded_rounds"] == [] and summary["warmup_runs"] == 2
    assert [row["round"] for row in summary["rounds"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("bad, reason", [
    (_records(0.3, 2.2, late_s=0.05), "send lateness P99"),
    (_records(0.3, 2.2, failed=1), "1 failed request"),
    (_records(0.3, 2.2, stretch=400.0), "below its median"),  # a stall: throughput collapses
])
def test_a_disturbed_round_is_excluded_for_all_policies(tmp_path, bad, reason):
    summary = analyse(_folder(tmp_path, disturb={2: bad}), ProtocolSettings(lateness_limit_ms=10.0))
    assert summary["excluded_rounds"] == [2]
    row = next(row for row in summary["rounds"] if row["round"] == 2)
    assert row["disturbed"] and not row["used"]
    assert any(reason in text for text in row["reasons"])
    assert summary["policies"]["default"]["reps"] == 3  # the baseline's round 2 is dropped too
    assert summary["intervals"]["hrrn_vs_default"]["rounds"] == [0, 1, 3]


def test_user_exclusions_and_extra_pairs(tmp_path):
    settings = ProtocolSettings(exclude_rounds=[0], pairs=[("hrrn", "default")])
    summary = analyse(_folder(tmp_path), settings)
    assert summary["excluded_rounds"] == [0]
    reverse = summary["intervals"]["default_vs_hrrn"]["metrics"]["short_ttft_p50_ms"]
    assert reverse["change"] == pytest.approx(3.0)  # 4x slower = +300%


def test_when_every_round_is_disturbed_they_are_used_and_flagged(tmp_path):
    late = {r: _records(0.3, 2.2, late_s=0.05) for r in range(4)}
    summary = analyse(_folder(tmp_path, disturb=late), ProtocolSettings(lateness_limit_ms=10.0))
    assert summary["excluded_rounds"] == [0, 1, 2, 3]
    assert summary["used_disturbed_rounds"] is True and summary["all_rounds_disturbed"] is True
    assert summary["policies"]["hrrn"]["reps"] == 4
    [warning] = summary["warnings"]
    assert warning.startswith("every measured round (4) was disturbed (e.g. send lateness P99")


def test_a_clean_bench_has_no_warning(tmp_path):
    summary = analyse(_folder(tmp_path))
    assert summary["warnings"] == [] and summary["all_rounds_disturbed"] is False


def test_rounds_the_user_excluded_are_never_used_even_when_nothing_is_left(tmp_path):
    summary = analyse(_folder(tmp_path), ProtocolSettings(exclude_rounds=[0, 1, 2, 3]))
    assert summary["policies"] == {} and summary["all_rounds_disturbed"] is True
    assert summary["warnings"] == ["every measured round was excluded by the user: there are no figures to report"]
    assert all(not row["used"] for row in summary["rounds"])


def test_no_measured_run_is_a_warning_not_an_empty_table(tmp_path):
    results = ResultsDir(tmp_path / "res")
    _write_run(results, "warmup", 0, "default", _records(9.0, 9.0))
    summary = analyse(results)
    assert summary["policies"] == {} and summary["warnings"] == [
        "no measured run finished: there are no figures to report"]


def test_a_run_killed_mid_way_is_loaded_as_interrupted(tmp_path):
    results = _folder(tmp_path)
    with results.requests_path("measured04-default").open("w") as stream:  # no runs.jsonl line
        stream.write(json.dumps({**_records(1, 2)[0].to_dict(), "policy": "default", "phase": "measured",
                                 "round": 4}) + "\n")
        stream.write('{"request_id": "cut sho')  # the line a crash cut short
    summary = analyse(results)
    assert 4 in summary["excluded_rounds"]
    reasons = next(row for row in summary["rounds"] if row["round"] == 4)["reasons"]
    assert "default run was interrupted" in reasons and "hrrn did not run" in reasons


# --- running the protocol ------------------------------------------------------------------------

def _invocation(tmp_path, workload, urls, settings=None, targets=None):
    options = PayloadOptions(model="mock-model")
    return Invocation(
        workload=workload, policies=list(urls), targets=targets or UrlTargets(urls),
        make_payloads=lambda seed, url: [build_payload(s, options, seed) for s in workload.requests],
        results=ResultsDir(tmp_path / "out"), settings=settings or ProtocolSettings(warmup=1, reps=2),
    )


def small_workload() -> Workload:
    return scenario("long-first", leading_long=4, num_requests=6, long_tokens=64, short_tokens=4, output_tokens=3)


def test_protocol_runs_rounds_in_rotated_order_with_identical_payloads(tmp_path):
    workload = small_workload()
    with MockServer() as first, MockServer() as second:
        inv = _invocation(tmp_path, workload, {"default": first.url, "hrrn": second.url},
                          ProtocolSettings(warmup=1, reps=3, lateness_limit_ms=1e6, throughput_drop=1.0))
        summary = run_protocol(inv)
        received_a = [r.body for r in first.received]
        received_b = [r.body for r in second.received]
    n = len(workload.requests)
    # Each run is preceded by one tiny unmeasured wake-up request, then the run's own n requests.
    for received in (received_a, received_b):
        assert len(received) == 4 * (n + 1)
        wakes = received[:: n + 1]
        assert all(w["user"] == WAKE_UP_USER and w["max_tokens"] == 1 and not w["stream"] for w in wakes)
        assert all(b.get("user") != WAKE_UP_USER for i, b in enumerate(received) if i % (n + 1))
    bodies_a = [b for b in received_a if b.get("user") != WAKE_UP_USER]
    bodies_b = [b for b in received_b if b.get("user") != WAKE_UP_USER]
    assert len(bodies_a) == len(bodies_b) == 4 * n  # 1 warm-up + 3 measured rounds each
    assert bodies_a == bodies_b  # identical payloads for both policies, round by round
    rounds = [bodies_a[i * n]["prompt"] for i in range(4)]
    assert len({tuple(p) for p in rounds}) == 4  # but different ids in different rounds
    assert [row["order"] for row in summary["rounds"]] == [["default", "hrrn"], ["hrrn", "default"],
                                                          ["default", "hrrn"]]
    results = ResultsDir(tmp_path / "out")
    assert json.loads(results.summary_path.read_text())["intervals"].keys() == {"hrrn_vs_default"}
    header = results.read_header()
    assert header["workload_fingerprint"] == workload_fingerprint(workload)
    assert workload_from_header(header).requests == workload.requests
    assert len(results.read_runs()) == 8


def test_results_folder_refuses_another_schedule_and_duplicate_runs(tmp_path):
    workload = small_workload()
    with MockServer() as server:
        run_protocol(_invocation(tmp_path, workload, {"default": server.url}, ProtocolSettings(warmup=0, reps=1)))
        with pytest.raises(BenchError, match="already holds run measured00-default"):
            run_protocol(_invocation(tmp_path, workload, {"default": server.url},
                                     ProtocolSettings(warmup=0, reps=1)))
        other = scenario("long-first", leading_long=2, num_requests=3, long_tokens=64, short_tokens=4,
                         output_tokens=3)
        with pytest.raises(BenchError, match="different schedule"):
            run_protocol(_invocation(tmp_path, other, {"hrrn": server.url}, ProtocolSettings(warmup=0, reps=1)))
        # another label on the same schedule pairs up with the first invocation
        summary = run_protocol(_invocation(tmp_path, workload, {"hrrn": server.url},
                                           ProtocolSettings(warmup=0, reps=1)))
    assert set(summary["policies"]) == {"default", "hrrn"}
    assert summary["intervals"]["hrrn_vs_default"]["rounds"] == [0]


class _DyingTargets(Targets):
    """The second policy's server dies during its run."""

    def __init__(self, urls):
        self.urls = urls
        self.closed = False

    def open(self, policy):
        return self.urls[policy]

    def check(self, policy):
        if policy == "hrrn":
            raise ServerFailed("hrrn server exited with status 1; log tail:\nTraceback: boom")

    def close(self):
        self.closed = True


def test_a_dying_server_stops_the_protocol_but_the_summary_is_written(tmp_path):
    workload = small_workload()
    with MockServer() as server:
        targets = _DyingTargets({"default": server.url, "hrrn": server.url})
        inv = _invocation(tmp_path, workload, {"default": server.url, "hrrn": server.url},
                          ProtocolSettings(warmup=0, reps=2), targets=targets)
        with pytest.raises(ServerFailed, match="boom"):
            run_protocol(inv)
    assert targets.closed
    results = ResultsDir(tmp_path / "out")
    runs = results.read_runs()
    assert [run["run"] for run in runs] == ["measured00-default", "measured00-hrrn"]
    assert "boom" in runs[-1]["server_failed"]
    summary = json.loads(results.summary_path.read_text())
    assert summary["excluded_rounds"] == [0]


def test_launched_server_that_exits_is_reported_with_its_log_tail(tmp_path):
    import sys

    code = "print('loading weights'); print('CUDA error: boom'); raise SystemExit(3)"
    server = LaunchedServer("fake", [sys.executable, "-c", code], None, url="http://127.0.0.1:9",
                            log_path=tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerFailed) as failure:
        server.wait_ready(timeout_s=30)
    assert "exited with status 3" in str(failure.value)
    assert "CUDA error: boom" in str(failure.value)
    server.stop()


def test_launched_server_stops_its_whole_process_group(tmp_path):
    import sys

    from prefillq.bench.launch import free_port

    port = free_port()
    server = LaunchedServer("mock", [sys.executable, "-m", "prefillq.cli.mockserver", "--port", str(port)], None,
                            url=f"http://127.0.0.1:{port}", log_path=tmp_path / "m.log").start()
    server.wait_ready(timeout_s=30)
    assert server.alive
    server.stop(grace_s=10)
    assert not server.alive
    assert server.process.returncode is not None
    assert not _answers(server.url)  # nothing left listening


@pytest.mark.parametrize("cpu_build, preset, expected", [(True, None, "1"), (True, "3", "3"), (False, None, None)])
def test_launched_cpu_vllm_gets_a_kv_cache_size_unless_one_is_set(tmp_path, monkeypatch, cpu_build, preset, expected):
    from prefillq.bench import launch
    from prefillq.config import PolicyConfig

    monkeypatch.setattr(launch, "cpu_vllm", lambda python: cpu_build)
    if preset is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", preset)
    server = launch.vllm_server("model-dir", PolicyConfig(), port=9, log_path=tmp_path / "s.log")
    assert server.env.get("VLLM_CPU_KVCACHE_SPACE") == expected


def test_cpu_vllm_reads_the_installed_distribution():
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from prefillq.bench.launch import cpu_vllm

    try:
        version("vllm-cpu")
        installed = True
    except PackageNotFoundError:
        installed = False
    assert cpu_vllm(sys.executable) is installed
    assert cpu_vllm("/no/such/python") is False


def test_launched_server_has_its_own_process_group_in_our_session(tmp_path):
    # Its own group, so stop() can signal everything it started; our session, so the kernel's
    # autogroup scheduling does not make it a CPU group of its own that starves the load generator.
    import os
    import sys
    import time

    code = "import os, time; print(os.getsid(0), os.getpgid(0), flush=True); time.sleep(30)"
    server = LaunchedServer("fake", [sys.executable, "-c", code], None, url="http://127.0.0.1:9",
                            log_path=tmp_path / "s.log").start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len((tmp_path / "s.log").read_text().splitlines()) < 2:
            time.sleep(0.05)
        sid, pgid = map(int, (tmp_path / "s.log").read_text().splitlines()[1].split())
    finally:
        server.stop(grace_s=5)
    assert sid == os.getsid(0)
    assert pgid == server.process.pid != os.getpgid(0)


def _answers(url: str) -> bool:
    import httpx

    try:
        httpx.get(f"{url}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return True


def test_fingerprint_tracks_the_schedule():
    a = Workload("w", [RequestSpec("x", 0.0, 1, 1, "short")])
    b = Workload("w", [RequestSpec("x", 0.001, 1, 1, "short")])
    assert workload_fingerprint(a) != workload_fingerprint(b)
    assert workload_fingerprint(a) == workload_fingerprint(Workload("other name", list(a.requests)))


def test_wake_up_can_be_turned_off(tmp_path):
    workload = small_workload()
    with MockServer() as server:
        inv = _invocation(tmp_path, workload, {"default": server.url},
                          ProtocolSettings(warmup=0, reps=1, wake_before_run=False))
        run_protocol(inv)
        received = [r.body for r in server.received]
    assert len(received) == len(workload.requests)
    assert all(b.get("user") != WAKE_UP_USER for b in received)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_round_order_is_a_williams_design_balanced_for_first_order_carry_over(count):
    """Over a full cycle (count rounds, 2 x count for an odd count) every policy directly precedes every
    other one equally often and takes every position equally often; round 0 keeps the given order."""
    policies = [f"p{i}" for i in range(count)]
    cycle = count if count % 2 == 0 else 2 * count
    orders = [round_order(policies, r) for r in range(cycle)]
    assert orders[0] == policies
    assert all(sorted(order) == policies for order in orders)
    follows = {(a, b): 0 for a in policies for b in policies if a != b}
    for order in orders:
        for before, after in itertools.pairwise(order):
            follows[(before, after)] += 1
    assert set(follows.values()) == {cycle // count}
    for position in range(count):
        seen = [order[position] for order in orders]
        assert all(seen.count(p) == cycle // count for p in policies)
    assert [round_order(policies, r + cycle) for r in range(cycle)] == orders  # the cycle repeats


def test_five_measured_rounds_by_default():
    import inspect

    from prefillq.cli.bench import bench_command

    assert ProtocolSettings().reps == 5
    assert inspect.signature(bench_command).parameters["reps"].default == 5


# --- machines as a level of their own, p-values next to the intervals ----------------------------

def _machines_folder(tmp_path, labelled=True):
    """Rounds 0-2 on machine a and on machine b (b twice as slow); hrrn cuts short TTFT by 75%."""
    results = ResultsDir(tmp_path / "merged")
    results.requests_dir.mkdir(parents=True)
    for machine, stretch in (("a", 1.0), ("b", 2.0)):
        for r in range(3):
            for policy, factor in (("default", 1.0), ("hrrn", 0.25)):
                name = f"measured{r:02d}-{policy}@{machine}" if labelled else f"measured{r:02d}-{policy}-{machine}"
                with results.requests_path(name).open("w") as stream:
                    for record in _records((1.0 + 0.1 * r) * factor * stretch, 2.0 * stretch, stretch=stretch):
                        stream.write(json.dumps(record.to_dict()) + "\n")
                info = {"run": name, "policy": policy, "phase": "measured", "round": r + (10 if machine == "b" and
                        not labelled else 0), "position": 0, "interrupted": False, "server_failed": None}
                if labelled:
                    info["machine"] = machine
                results.append_run(info)
    return results


def test_machine_labels_become_the_groups_of_the_paired_comparison(tmp_path, monkeypatch):
    import prefillq.bench.analysis as analysis

    seen = []
    real = analysis.compare_paired

    def spy(baseline, treatment, **kwargs):
        seen.append(kwargs.get("groups"))
        return real(baseline, treatment, **kwargs)

    monkeypatch.setattr(analysis, "compare_paired", spy)
    summary = analyse(_machines_folder(tmp_path))
    assert summary["excluded_rounds"] == []  # the slow machine is judged against its own medians
    assert seen and all(groups == ["a", "a", "a", "b", "b", "b"] for groups in seen)
    assert summary["intervals"]["hrrn_vs_default"]["rounds"] == [["a", 0], ["a", 1], ["a", 2],
                                                                 ["b", 0], ["b", 1], ["b", 2]]
    assert [row["machine"] for row in summary["rounds"]] == ["a"] * 3 + ["b"] * 3
    assert summary["policies"]["hrrn"]["reps"] == 6
    assert summary["intervals"]["hrrn_vs_default"]["metrics"]["short_ttft_p50_ms"]["change"] == pytest.approx(-0.75)

    seen.clear()
    unlabelled = analyse(_machines_folder(tmp_path / "plain", labelled=False))
    assert seen and all(groups is None for groups in seen)
    assert "machine" not in unlabelled["rounds"][0]


def test_a_machine_label_is_recorded_in_every_run(tmp_path):
    workload = small_workload()
    with MockServer() as server:
        inv = _invocation(tmp_path, workload, {"default": server.url}, ProtocolSettings(warmup=0, reps=1))
        inv.machine = "gpu-node-3"
        run_protocol(inv)
        inv = _invocation(tmp_path, workload, {"default": server.url}, ProtocolSettings(warmup=0, reps=1))
        inv.machine = "gpu-node-4"
        summary = run_protocol(inv)  # same folder, another machine: no clash
    results = ResultsDir(tmp_path / "out")
    runs = results.read_runs()
    assert [run["run"] for run in runs] == ["measured00-default@gpu-node-3", "measured00-default@gpu-node-4"]
    assert [run["machine"] for run in runs] == ["gpu-node-3", "gpu-node-4"]
    records, raw = results.read_records(runs[0]["run"])
    assert records and all(line["machine"] == "gpu-node-3" for line in raw)
    assert [row["machine"] for row in summary["rounds"]] == ["gpu-node-3", "gpu-node-4"]
    assert results.read_header()["invocations"][1]["machine"] == "gpu-node-4"


def test_p_value_and_method_stand_next_to_each_interval(tmp_path, monkeypatch):
    """Each comparison block in the JSON has ``p_value`` and ``method``; the table prints the p-value."""
    import io

    from rich.console import Console

    import prefillq.bench.analysis as analysis
    from prefillq.report.bench import print_summary

    plain = analyse(_folder(tmp_path / "plain"))
    entry = plain["intervals"]["hrrn_vs_default"]["metrics"]["short_ttft_p50_ms"]
    assert "p_value" in entry and "method" in entry  # None until compare_paired gives them

    real = analysis.compare_paired

    class Tested:
        def __init__(self, inner):
            self.inner, self.p_value, self.method = inner, 0.0123, "t-interval"

        def to_dict(self):
            return self.inner.to_dict()

    monkeypatch.setattr(analysis, "compare_paired", lambda *a, **k: Tested(real(*a, **k)))
    summary = analyse(_folder(tmp_path / "tested"))
    entry = summary["intervals"]["hrrn_vs_default"]["metrics"]["short_ttft_p50_ms"]
    assert entry["p_value"] == 0.0123 and entry["method"] == "t-interval"
    assert entry["change"] == pytest.approx(-0.75)
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "p=0.012" in text and "t-interval" in text


def test_a_corrupt_bench_json_is_a_clear_error(tmp_path):
    results = ResultsDir(tmp_path / "res")
    results.root.mkdir()
    results.header_path.write_text('{"tool": "prefillq bench", "sched')
    with pytest.raises(BenchError, match=r"bench\.json is corrupt"):
        results.read_header()
