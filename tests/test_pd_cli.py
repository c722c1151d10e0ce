"""``prefillq compare --topology 1p1d``: the table, the JSON, the PD flags, and bad input (exit 2)."""

from __future__ import annotations

import json

import pytest

from prefillq.sim.pd import BUSY_RETRY_ENV

from .test_compare_cli import run

SHORT = ["--set", "duration_s=1"]


@pytest.fixture(autouse=True)
def _wide_and_no_retry_env(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv(BUSY_RETRY_ENV, raising=False)


@pytest.mark.parametrize("scenario", ["long-then-stream", "overload"])
def test_1p1d_table_for_the_published_pd_scenarios(scenario, tmp_path):
    out = tmp_path / "s.json"
    result = run("--topology", "1p1d", "--scenario", scenario, *SHORT, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "topology 1p1d" in result.output
    for text in ("default", "promote_shortest", "hrrn", "short_request_first", "bound (lower)"):
        assert text in result.output
    data = json.loads(out.read_text())
    assert data["topology"] == "1p1d"
    assert data["pd"]["pairs"] == 1 and data["pd"]["busy_retry_timeout_s"] == 0.0
    assert data["pd_stats"]["hrrn"]["transfers"] > 0
    assert all(p["failed"] == 0 for p in data["policies"].values())


def test_pd_flags_reach_the_simulation(tmp_path):
    out = tmp_path / "s.json"
    result = run("--topology", "1p1d", "--scenario", "overload", *SHORT, "--policies", "hrrn", "--pd-pairs", "2",
                 "--busy-retry-timeout-s", "0.5", "--decode-max-num-seqs", "8", "--decode-kv-blocks", "4096",
                 "--prefill-waiting-limit", "32", "--decode-policy", "fcfs", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "topology 1p1d x2" in result.output
    data = json.loads(out.read_text())
    assert data["pd"] == {"pairs": 2, "busy_retry_timeout_s": 0.5, "prefill_waiting_limit": 32,
                          "decode_policy": "default", "decode_max_num_seqs": 8, "decode_kv_blocks": 4096,
                          "kv_bytes_per_token": None, "link_bytes_per_s": None}
    assert data["pd_stats"]["hrrn"]["retried"] > 0  # 8 decode seats per pair: pairs are often busy


def test_lightllm_mode_runs_on_1p1d():
    result = run("--topology", "1p1d", "--mode", "lightllm", "--template-tokens", "12", "--scenario",
                 "long-then-stream", *SHORT, "--policies", "default,promote_shortest")
    assert result.exit_code == 0, result.output
    assert "mode lightllm, topology 1p1d" in result.output


def test_retry_timeout_from_the_environment_and_the_flag_wins(monkeypatch, tmp_path):
    out = tmp_path / "s.json"
    monkeypatch.setenv(BUSY_RETRY_ENV, "1.5")
    assert run("--topology", "1p1d", *SHORT, "--scenario", "overload", "--policies", "default",
               "--json", str(out)).exit_code == 0
    assert json.loads(out.read_text())["pd"]["busy_retry_timeout_s"] == 1.5
    monkeypatch.setenv(BUSY_RETRY_ENV, "not-a-number")
    result = run("--topology", "1p1d", *SHORT, "--scenario", "overload", "--policies", "default",
                 "--busy-retry-timeout-s", "0", "--json", str(out))
    assert result.exit_code == 0, result.output  # the flag wins; the environment is not consulted
    assert json.loads(out.read_text())["pd"]["busy_retry_timeout_s"] == 0.0


@pytest.mark.parametrize("args, env, message", [
    (["--busy-retry-timeout-s", "-1"], None,
     "--busy-retry-timeout-s (seconds; 0 disables retry) must be a non-negative number"),
    (["--busy-retry-timeout-s", "soon"], None, "--busy-retry-timeout-s must be a number of seconds"),
    ([], "-3", f"{BUSY_RETRY_ENV} (seconds; 0 disables retry) must be a non-negative number"),
    (["--pd-pairs", "0"], None, "--pd-pairs must be an integer >= 1"),
    (["--decode-policy", "srf"], None, "short_request_first cannot run on a decode-only node"),
    (["--decode-policy", "lifo"], None, "lifo"),
    (["--prefill-waiting-limit", "0"], None, "prefill_waiting_limit must be an integer >= 1"),
])
def test_bad_pd_input_exits_2_with_a_clear_message(monkeypatch, args, env, message):
    if env is not None:
        monkeypatch.setenv(BUSY_RETRY_ENV, env)
    result = run("--topology", "1p1d", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_pd_flags_need_the_1p1d_topology_and_topology_must_be_known():
    result = run("--busy-retry-timeout-s", "1")
    assert result.exit_code == 2 and "--busy-retry-timeout-s applies to --topology 1p1d only" in result.output
    result = run("--topology", "3p1d")
    assert result.exit_code == 2 and "unknown topology '3p1d'; valid topologies: mixed, 1p1d" in result.output
