"""The recommendation's costs as ranges (issue 33): the simulated change -/+ the calibrated model's measured
error, in the JSON and in the 80-column words; a profile's own measured error replaces the default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prefillq.cli.recommendation import recommendation_lines
from prefillq.config import parse_policy_spec
from prefillq.sim.recommend import MEASURED_COST_ERROR, cost_error_of, recommend


def _row(short: float, long: float, tput: float, tpot: float) -> dict:
    return {"short_ttft_p95_ms": short, "long_ttft_p95_ms": long, "output_tokens_per_s": tput,
            "short_tpot_p50_ms": tpot}


SUMMARIES = {"default": _row(500, 1000, 100, 5), "auto:partial_prefills=ordered": _row(50, 1100, 99, 8)}
CONFIGS = dict(parse_policy_spec(spec) for spec in SUMMARIES)


def test_each_cost_is_the_simulated_change_plus_and_minus_the_measured_error():
    rec = recommend(SUMMARIES, CONFIGS, baseline="default")
    assert rec["cost_error"]["pts"] == MEASURED_COST_ERROR
    long = rec["cost_ranges"]["long_ttft_p95_change"]
    points = MEASURED_COST_ERROR["long_ttft_p95_change"] / 100
    assert (long["low"], long["high"]) == pytest.approx((0.10 - points, 0.10 + points))
    tput = rec["cost_ranges"]["output_tokens_per_s_change"]
    assert tput["low"] < -0.01 < tput["high"] and tput["error_pts"] == MEASURED_COST_ERROR["output_tokens_per_s_change"]
    assert rec["row"] == "auto:partial_prefills=ordered"  # the choice still uses the simulated figures


def test_a_profile_with_its_own_measured_error_gives_its_ranges():
    own = {"calibration": {"cost_error": {"pts": {"long_ttft_p95_change": 4.0}, "source": "my study"}}}
    error = cost_error_of(own)
    assert error["pts"]["long_ttft_p95_change"] == 4.0 and error["source"] == "my study"
    assert error["pts"]["short_tpot_p50_change"] == MEASURED_COST_ERROR["short_tpot_p50_change"]  # the rest: default
    assert cost_error_of({"calibration": {"r2": 0.9}})["pts"] == MEASURED_COST_ERROR
    rec = recommend(SUMMARIES, CONFIGS, baseline="default", cost_error=error)
    assert rec["cost_ranges"]["long_ttft_p95_change"]["low"] == pytest.approx(0.06)


def test_the_words_state_every_cost_as_a_range_within_80_columns():
    rec = recommend(SUMMARIES, CONFIGS, baseline="default")
    cost = recommendation_lines(rec)[1]
    assert "long TTFT p95 +5..+15%" in cost and "short TPOT p50" in cost and "-3..+1%" in cost
    assert len(cost) <= 80


def test_the_json_of_compare_carries_the_ranges():
    done = subprocess.run([sys.executable, "-m", "prefillq", "compare", "--format", "json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    rec = json.loads(done.stdout)["recommendation"]
    assert set(rec["cost_ranges"]) == set(MEASURED_COST_ERROR)
    assert all(r is None or r["low"] <= r["high"] for r in rec["cost_ranges"].values())


def test_compare_states_the_ranges_with_the_profile_s_own_measured_error(tmp_path):
    from prefillq.sim.compare import CompareSettings, comparison_details, prepare_comparison
    from prefillq.sim.costs import _profiles_dir

    data = json.loads(_profiles_dir().joinpath("h200-qwen3-0.6b.json").read_text())
    data["calibration"] = {**data.get("calibration", {}),
                           "cost_error": {"pts": {"long_ttft_p95_change": 9.0}, "source": "my fidelity study"}}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    settings = CompareSettings(scenario="low-load", profile=str(path))
    rec = comparison_details(settings, prepare_comparison(settings).run())["recommendation"]
    assert rec["cost_error"]["source"] == "my fidelity study"
    assert rec["cost_error"]["pts"]["long_ttft_p95_change"] == 9.0
    assert rec["cost_ranges"]["long_ttft_p95_change"]["error_pts"] == 9.0
