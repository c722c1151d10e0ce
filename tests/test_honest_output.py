"""Warnings and advice that are true, intervals only where they mean something, files only where told."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from prefillq.report.bench import interval_text
from prefillq.sim.compare import _below, prefill_load_warning
from prefillq.sim.costs import load_profile
from prefillq.workload.scenarios import RequestSpec, Workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def test_one_round_shows_the_change_and_no_interval():
    one = {"change": -0.882, "ci_low": -0.882, "ci_high": -0.882, "n": 1, "p_value": None}
    assert interval_text(one) == "−88.2% (1 round)"
    three = {"change": -0.8, "ci_low": -0.9, "ci_high": -0.7, "n": 3, "p_value": 0.004}
    assert interval_text(three) == "−80.0% [−90.0, −70.0] p=0.004"
    assert interval_text(three, separator="\n").splitlines() == ["−80.0%", "[−90.0, −70.0]", "p=0.004"]


@pytest.mark.parametrize(("value", "current"), [(0.996, 1.0), (0.9999, 1.0), (24.96, 25.0), (0.5, 1.0), (2.99, 3)])
def test_advice_never_names_the_value_in_use(value, current):
    text = _below(value, current)
    assert float(text) < current
    assert float(text) == pytest.approx(value, rel=0.01)


def _requests(count: int, spacing_s: float, tokens: int = 2000) -> list[RequestSpec]:
    return [RequestSpec(request_id=f"r{i}", arrival_s=i * spacing_s, prompt_tokens=tokens, output_tokens=10,
                        klass="long") for i in range(count)]


def _settings(**values):
    return SimpleNamespace(**{"trace": None, "rate_scale": 1.0, "template_tokens": 0, "pd": None, "fleet": None,
                              **values})


def test_a_rate_scale_that_collapses_a_trace_into_a_burst_is_named():
    workload = Workload("t", _requests(50, 0.01), {})  # 50 requests within 0.49 s after scaling
    warning = prefill_load_warning(workload, load_profile("h100-qwen3.5-0.8b"), 1024,
                                   _settings(trace="t.csv", rate_scale=100.0))
    assert warning is not None and "--rate-scale 100 replays the trace's 50 requests within" in warning
    unscaled = prefill_load_warning(workload, load_profile("h100-qwen3.5-0.8b"), 1024, _settings(trace="t.csv"))
    assert unscaled is None  # a burst as recorded is the trace's own traffic


def test_an_overload_just_over_capacity_suggests_a_lower_rate_scale_than_the_one_in_use():
    profile = load_profile("h100-qwen3.5-0.8b")
    capacity = 1024 / profile.cost.step_latency(1024, 0.0, 0, 0)  # prompt tokens/s
    spacing = 2000 / (capacity * 1.004)  # 0.4% over capacity
    workload = Workload("t", _requests(400, spacing), {})
    warning = prefill_load_warning(workload, profile, 1024, _settings(trace="t.csv"))
    suggested = float(warning.split("--rate-scale ")[1].split()[0])
    assert suggested < 1.0


def test_tune_writes_no_file_unless_told(tmp_path):
    import shutil

    trace = tmp_path / "in" / "t.csv"
    trace.parent.mkdir()
    shutil.copy(TRACES / "azure-2023-code.csv", trace)
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "prefillq.cli", "tune", "--trace", str(trace), "--window-s", "120"],
                          capture_output=True, text=True, cwd=work, env={"PATH": "", "COLUMNS": "80"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == [] and sorted(p.name for p in trace.parent.iterdir()) == ["t.csv"]
    assert "histogram:" not in done.stdout


def test_sweep_rows_carry_their_overload_warnings(tmp_path):
    from prefillq.sweep import ProcessExecutor, grid_from, run_sweep

    grid = grid_from({"scenario": "sustained", "policies": ["default"], "budgets": [1024], "overrides": {"rate": 200}})
    with ProcessExecutor(jobs=1) as runner:
        result = run_sweep(grid, runner)
    [row] = result.rows
    assert len(row["warnings"]) == 1 and "prefill capacity" in row["warnings"][0]
    fleet = grid_from({"scenario": "sustained", "policies": ["default"], "budgets": [1024], "replicas": [1, 2],
                       "overrides": {"rate": 200}})
    with ProcessExecutor(jobs=1) as runner:
        one, two = run_sweep(fleet, runner).rows
    factor_one = float(one["warnings"][0].split("offers ")[1].split("x")[0])
    assert factor_one > 2
    # two replicas have twice the prefill capacity the warning compares with
    factor_two = float(two["warnings"][0].split("offers ")[1].split("x")[0])
    assert factor_two == pytest.approx(factor_one / 2, abs=0.1)
    calm = grid_from({"scenario": "low-load", "policies": ["default"], "budgets": [1024]})
    with ProcessExecutor(jobs=1) as runner:
        assert run_sweep(calm, runner).rows[0]["warnings"] == []


@pytest.mark.parametrize(("args", "hint"), [(["--policies", "defualt"], "did you mean 'default'?"),
                                            (["--policy", "hrn"], "did you mean 'hrrn'?"),
                                            (["--scenario", "long-frist"], "did you mean 'long-first'?")])
def test_a_near_miss_name_gets_a_did_you_mean(args, hint):
    done = subprocess.run([sys.executable, "-m", "prefillq.cli", "compare", *args], capture_output=True, text=True,
                          env={"PATH": "", "COLUMNS": "200"}, timeout=120)
    assert done.returncode == 2
    assert hint in done.stderr and "valid" in done.stderr
