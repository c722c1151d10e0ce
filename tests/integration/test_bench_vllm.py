"""``prefillq bench --launch vllm`` end to end on the tiny CPU model: two policies, each on its own real
vLLM OpenAI server running our scheduler, the identical schedule, paired rounds, servers stopped after."""

from __future__ import annotations

import json

import httpx
import pytest
import typer
from typer.testing import CliRunner

from prefillq.cli.bench import register

POLICIES = ("default", "short_request_first")


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


@pytest.mark.vllm
def test_bench_launches_vllm_per_policy_and_pairs_the_rounds(tiny_model, tmp_path):
    out = tmp_path / "res"
    result = CliRunner().invoke(_app(), [
        "bench", "--launch", "vllm", "--model", tiny_model, "--policies", ",".join(POLICIES),
        "--scenario", "long-first", "--set", "leading_long=4", "--set", "long_tokens=1024",
        "--set", "num_requests=6", "--set", "short_tokens=32", "--set", "output_tokens=4",
        "--reps", "2", "--warmup", "1", "--budget", "256",
        "--server-arg=--enforce-eager", "--server-arg=--max-model-len=2048",
        # Timing on a shared 2-core machine is not what this test checks: keep every round.
        "--lateness-limit-ms", "10000", "--throughput-drop", "0.99",
        "--startup-timeout", "600", "--out", str(out), "--no-plots",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    for policy in POLICIES:
        block = summary["policies"][policy]
        assert block["completed"] == 20 and block["failed"] == 0 and block["reps"] == 2
    interval = summary["intervals"]["short_request_first_vs_default"]["metrics"]["short_ttft_p50_ms"]
    assert interval["n"] == 2
    assert [row["order"] for row in summary["rounds"]] == [list(POLICIES), list(reversed(POLICIES))]

    # Exact lengths: the server counted exactly the prompt and output tokens we asked for.
    for policy in POLICIES:
        for line in (out / "requests" / f"measured00-{policy}.jsonl").read_text().splitlines():
            record = json.loads(line)
            assert record["error"] is None
            assert record["server_prompt_tokens"] == record["prompt_tokens"] in (32, 1024)
            assert record["server_output_tokens"] == record["output_tokens"] == 4
            # Count tokens, not events: vLLM may coalesce several tokens into one event when its front end
            # lags (a loaded machine); each ITL gap is one event, the running usage says what it carried.
            assert sum(record["chunk_tokens"]) == 4 and all(n >= 1 for n in record["chunk_tokens"])
            assert len(record["itl_s"]) == len(record["chunk_tokens"]) - 1

    # Every run was preceded by an unmeasured wake-up request that the real server accepted.
    run_lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert run_lines and all(line["wake_up_error"] is None for line in run_lines)

    # Each server ran our scheduler with its own policy, and is gone now.
    runs = {run["policy"]: run for run in summary["runs"] if run["phase"] == "measured"}
    for policy in POLICIES:
        log = (out / "logs" / f"server-{policy}-01.log").read_text()
        assert f"prefillq: waiting queue policy {policy}" in log
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{runs[policy]['url']}/health", timeout=2)


@pytest.mark.vllm
def test_bench_launches_stock_vllm_beside_a_policy_and_both_record(tiny_model, tmp_path):
    """The ``stock`` row: the same server command without our scheduler, paired with a policy row."""
    out = tmp_path / "res"
    result = CliRunner().invoke(_app(), [
        "bench", "--launch", "vllm", "--model", tiny_model, "--policies", "stock,hrrn",
        "--scenario", "long-first", "--set", "leading_long=2", "--set", "long_tokens=512",
        "--set", "num_requests=2", "--set", "short_tokens=16", "--set", "output_tokens=2",
        "--reps", "1", "--warmup", "0", "--budget", "256",
        "--server-arg=--enforce-eager", "--server-arg=--max-model-len=1024",
        "--lateness-limit-ms", "10000", "--throughput-drop", "0.99",
        "--startup-timeout", "600", "--out", str(out), "--no-plots",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"] == "stock" and set(summary["intervals"]) == {"hrrn_vs_stock"}
    for policy in ("stock", "hrrn"):
        block = summary["policies"][policy]
        assert block["completed"] == 4 and block["failed"] == 0
        records = [json.loads(line) for line in
                   (out / "requests" / f"measured00-{policy}.jsonl").read_text().splitlines()]
        assert len(records) == 4 and all(r["error"] is None and r["server_output_tokens"] == 2 for r in records)
    stock_log = (out / "logs" / "server-stock-01.log").read_text()
    hrrn_log = (out / "logs" / "server-hrrn-01.log").read_text()
    assert "--scheduler-cls" not in stock_log.splitlines()[0] and "prefillq: waiting queue policy" not in stock_log
    assert "--scheduler-cls" in hrrn_log.splitlines()[0] and "prefillq: waiting queue policy hrrn" in hrrn_log
