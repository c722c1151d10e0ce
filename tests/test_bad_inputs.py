"""Every command, every bad input: exit status 2 and one line naming what was wrong, never a traceback.

Each case runs the real entry point (``python -m prefillq``) in a fresh process, as a user would, so the
last line of defence in ``prefillq.cli.main`` is covered too. The table is the contract: add a row when a
command grows an input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.traces import AZURE_HEADER

# A file or folder the test builds in tmp_path; "{x}" in a case's arguments is replaced by its path.
Maker = Callable[[Path], Path]


def _text(name: str, content: str) -> Maker:
    def make(tmp: Path) -> Path:
        path = tmp / name
        path.write_text(content)
        return path
    return make


def _unwritable(name: str) -> Maker:
    """A path below a regular file: no process can create it (a read-only folder would not stop root)."""
    def make(tmp: Path) -> Path:
        blocker = tmp / "not-a-folder"
        blocker.write_text("x")
        return blocker / name
    return make


def _bench_folder(files: dict[str, str]) -> Maker:
    def make(tmp: Path) -> Path:
        folder = tmp / "results"
        (folder / "requests").mkdir(parents=True)
        for name, content in files.items():
            (folder / name).write_text(content)
        return folder
    return make


GOOD_TRACE = _text("good.csv", AZURE_HEADER + "".join(f"{i * 0.2:.1f},{100 if i % 3 else 3000},8\n"
                                                       for i in range(30)))
RUN_LINE = {"policy": "default", "round": 0, "phase": "measured", "run": "measured00-default"}

# (case id, command line with "{x}" for the made path, maker or None, words the one-line error must hold)
CASES: list[tuple[str, list[str], Maker | None, str]] = [
    # compare: traces
    ("compare-missing-trace", ["compare", "--trace", "{x}"], lambda tmp: tmp / "nope.csv", "nope.csv"),
    ("compare-empty-trace", ["compare", "--trace", "{x}"], _text("empty.csv", ""), "empty.csv"),
    ("compare-header-only", ["compare", "--trace", "{x}"], _text("header.csv", AZURE_HEADER), "header.csv"),
    ("compare-garbled-csv", ["compare", "--trace", "{x}"], _text("garbled.csv", AZURE_HEADER + "0.0,abc,8\n"),
     "garbled.csv"),
    ("compare-negative-tokens", ["compare", "--trace", "{x}"],
     _text("negative.csv", AZURE_HEADER + "0.0,-5,8\n"), "negative.csv"),
    ("compare-binary-trace", ["compare", "--trace", "{x}"], _text("binary.csv", "\x00\x01\x02garbage\n"),
     "binary.csv"),
    ("compare-truncated-jsonl", ["compare", "--trace", "{x}"],
     _text("cut.jsonl", '{"timestamp": 0, "input_length": 100, "output_length": 8}\n{"timestamp": 1, "inp'),
     "cut.jsonl"),
    ("compare-duplicate-ids", ["compare", "--trace", "{x}"],
     _text("dup.jsonl", "".join(json.dumps({"request_id": "a", "scheduled_at": i, "prompt_tokens": 100,
                                            "output_tokens": 8}) + "\n" for i in range(2))), "a"),
    # compare: names and options
    ("compare-unknown-policy", ["compare", "--policies", "default,fastest"], None, "fastest"),
    ("compare-unknown-scenario", ["compare", "--scenario", "nightly"], None, "nightly"),
    ("compare-unknown-profile", ["compare", "--profile", "a100-huge"], None, "a100-huge"),
    ("compare-unknown-topology", ["compare", "--topology", "3p2d"], None, "3p2d"),
    ("compare-negative-long-cost-limit", ["compare", "--long-cost-limit", "-3"], None, "--long-cost-limit"),
    ("compare-unknown-mode", ["compare", "--mode", "sglang"], None, "sglang"),
    ("compare-bad-set-key", ["compare", "--set", "speed=3"], None, "speed"),
    ("compare-bad-set-value", ["compare", "--set", "rate=-4"], None, "rate"),
    ("compare-bad-set-form", ["compare", "--set", "rate"], None, "KEY=VALUE"),
    ("compare-zero-budget", ["compare", "--budget", "0"], None, "budget"),
    ("compare-profile-garbled-json", ["compare", "--profile", "{x}"], _text("profile.json", "{not json"),
     "profile.json"),
    ("compare-unwritable-json", ["compare", "--scenario", "long-first", "--set", "num_requests=8",
                                 "--json", "{x}"], _unwritable("s.json"), "not-a-folder"),
    ("compare-unwritable-out", ["compare", "--scenario", "long-first", "--set", "num_requests=8",
                                "--out", "{x}"], _unwritable("outdir"), "not-a-folder"),
    # compare: fleets
    ("compare-unknown-router", ["compare", "--replicas", "2", "--router", "fastest"], None, "fastest"),
    ("compare-zero-replicas", ["compare", "--replicas", "0"], None, "replicas"),
    ("compare-gateway-without-limit", ["compare", "--replicas", "2", "--gateway-policy", "hrrn"], None,
     "max-inflight-per-replica"),
    ("compare-unknown-gateway-policy", ["compare", "--replicas", "2", "--gateway-policy", "fastest",
                                        "--max-inflight-per-replica", "4"], None, "fastest"),
    ("compare-replicas-with-1p1d", ["compare", "--replicas", "2", "--topology", "1p1d"], None, "1p1d"),
    # tune
    ("tune-missing-trace", ["tune", "--trace", "{x}"], lambda tmp: tmp / "nope.csv", "nope.csv"),
    ("compare-unknown-sample", ["compare", "--trace", "sample:azure"], None, "sample:azure-conv, sample:azure-code"),
    ("compare-unknown-trace-format", ["compare", "--trace", "{x}"], _text("mystery.csv", "time,prompt\n0,5\n"),
     "BurstGPT"),
    ("tune-empty-trace", ["tune", "--trace", "{x}"], _text("empty.csv", ""), "empty.csv"),
    ("tune-header-only", ["tune", "--trace", "{x}"], _text("header.csv", AZURE_HEADER), "header.csv"),
    ("tune-garbled-csv", ["tune", "--trace", "{x}"], _text("garbled.csv", AZURE_HEADER + "x,y,z\n"),
     "garbled.csv"),
    ("tune-unknown-profile", ["tune", "--trace", "{x}", "--profile", "a100-huge"], GOOD_TRACE, "a100-huge"),
    ("tune-bad-favor", ["tune", "--trace", "{x}", "--favor", "both"], GOOD_TRACE, "favor"),
    ("tune-unwritable-json", ["tune", "--trace", "{x}", "--json", "/dev/null/t.json"], GOOD_TRACE, "t.json"),
    ("tune-zero-jobs", ["tune", "--trace", "{x}", "--jobs", "0"], GOOD_TRACE, "--jobs"),
    ("tune-unknown-executor", ["tune", "--trace", "{x}", "--executor", "dask"], GOOD_TRACE, "dask"),
    ("tune-unwritable-out", ["tune", "--trace", "{x}", "--out", "/dev/null/pngs"], GOOD_TRACE, "pngs"),
    # report (saved bench folders)
    ("report-missing-folder", ["report", "{x}"], lambda tmp: tmp / "no-results", "no-results"),
    ("report-empty-folder", ["report", "{x}"], _bench_folder({}), "results"),
    ("report-garbled-runs", ["report", "{x}"], _bench_folder({"runs.jsonl": "{garbage\n"}), "runs.jsonl"),
    ("report-run-without-policy", ["report", "{x}"],
     _bench_folder({"runs.jsonl": json.dumps({"round": 0, "phase": "measured"}) + "\n"}), "policy"),
    ("report-corrupt-bench-json", ["report", "{x}"],
     _bench_folder({"runs.jsonl": json.dumps(RUN_LINE) + "\n", "bench.json": "{"}), "bench.json"),
    # bench
    ("bench-unreachable-server", ["bench", "--url", "http://127.0.0.1:9", "--scenario", "long-first",
                                  "--out", "{x}"], lambda tmp: tmp / "bench-out", "127.0.0.1:9"),
    ("bench-unknown-scenario", ["bench", "--url", "http://127.0.0.1:9", "--scenario", "nightly",
                                "--out", "{x}"], lambda tmp: tmp / "bench-out", "nightly"),
    ("bench-unknown-policy", ["bench", "--launch", "mock", "--policies", "default,fastest", "--out", "{x}"],
     lambda tmp: tmp / "bench-out", "fastest"),
    ("bench-bad-trace", ["bench", "--url", "http://127.0.0.1:9", "--trace", "{x}"],
     _text("garbled.csv", AZURE_HEADER + "0.0,abc,8\n"), "garbled.csv"),
    # sweep
    ("sweep-missing-trace", ["sweep", "--trace", "{x}", "--jobs", "1"], lambda tmp: tmp / "nope.csv", "nope.csv"),
    ("sweep-unknown-policy", ["sweep", "--policy", "default,fastest", "--jobs", "1"], None, "fastest"),
    ("sweep-unknown-router", ["sweep", "--router", "fastest", "--jobs", "1"], None, "fastest"),
    ("sweep-zero-replicas", ["sweep", "--replicas", "0", "--jobs", "1"], None, "replicas"),
    ("sweep-bad-budget", ["sweep", "--budget", "lots", "--jobs", "1"], None, "--budget"),
    ("sweep-zero-jobs", ["sweep", "--jobs", "0"], None, "--jobs"),
    ("sweep-unknown-executor", ["sweep", "--executor", "dask"], None, "dask"),
    ("sweep-gateway-without-limit", ["sweep", "--gateway-policy", "hrrn"], None, "max-inflight-per-replica"),
    ("sweep-garbled-grid-file", ["sweep", "--config", "{x}"], _text("grid.toml", "policies = ["), "grid.toml"),
    ("sweep-unknown-grid-key", ["sweep", "--config", "{x}"], _text("grid.toml", "speed = 3\n"), "speed"),
    ("sweep-unwritable-out", ["sweep", "--scenario", "long-first", "--set", "num_requests=8", "--policy", "default",
                              "--jobs", "1", "--out", "{x}"], _unwritable("outdir"), "not-a-folder"),
    # serve, calibrate, make-tiny-model: fail before any engine starts
    ("serve-unknown-policy", ["serve", "some-model", "--policy", "fastest", "--dry-run"], None, "fastest"),
    ("serve-bad-config-json", ["serve", "some-model", "--config", "{not json", "--dry-run"], None, "config"),
    ("calibrate-missing-model", ["calibrate", "--model", "{x}", "--out", "/dev/null/p.json"],
     lambda tmp: tmp / "no-model", "no-model"),
    ("calibrate-no-model-no-bench", ["calibrate", "--out", "{x}"], lambda tmp: tmp / "p.json", "--model"),
    ("calibrate-bench-without-traces", ["calibrate", "--from-bench", "{x}", "--out", "/dev/null/p.json"],
     _bench_folder({"runs.jsonl": ""}), "StepTraceScheduler"),
    ("calibrate-bench-unknown-phase", ["calibrate", "--from-bench", "{x}", "--phase", "later",
                                       "--out", "/dev/null/p.json"], _bench_folder({}), "later"),
    ("calibrate-bench-unknown-base", ["calibrate", "--from-bench", "{x}", "--base-profile", "tpu-giant",
                                      "--out", "/dev/null/p.json"], _bench_folder({}), "tpu-giant"),
    ("make-tiny-model-unwritable", ["make-tiny-model", "{x}"], _unwritable("tiny"), "tiny"),
]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "prefillq", *args], capture_output=True, text=True,
                          env=env, timeout=240)


@pytest.mark.parametrize(("args", "maker", "expected"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_every_bad_input_exits_2_with_one_line_and_no_traceback(tmp_path: Path, args: list[str],
                                                                maker: Maker | None, expected: str) -> None:
    if maker is not None:
        made = str(maker(tmp_path))
        args = [arg.replace("{x}", made) for arg in args]
    result = _run(args)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert expected in errors[0], errors[0]


def test_the_table_covers_every_command() -> None:
    from prefillq.cli import _COMMAND_MODULES

    covered = {case[1][0] for case in CASES}
    assert {"compare", "tune", "report", "bench", "serve", "calibrate", "make-tiny-model", "sweep"} <= covered
    assert len(_COMMAND_MODULES) == 9  # a new command module needs rows here (traces: the sample rows)
