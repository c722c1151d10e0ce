"""compare recommends per priority class in vLLM's priority mode (issue 29): the row is chosen on the class
served first's short TTFT P95, with the class served last's long TTFT P95 and the throughput held to the
same +15% / -2% limits as the plain rule, and the answer says what it buys and costs each class."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.config import PolicyConfig, load_config
from prefillq.sim.recommend import LONG_TTFT_P95_MAX_CHANGE, THROUGHPUT_MAX_DROP, recommend
from prefillq.sim.recommend_classes import recommend_by_class
from tests.test_priority_sim import run_compare


def row(high_short, low_long, tput=1000.0, *, short=None, long=None, low_all=None):
    """A row's summary: engine-wide short/long TTFT P95 (by default unlike the per-class figures, so a test
    sees which one was read) and the classes' figures."""
    return {"short_ttft_p95_ms": short if short is not None else 50.0,
            "long_ttft_p95_ms": long if long is not None else 500.0,
            "short_tpot_p50_ms": 5.0, "output_tokens_per_s": tput,
            "priority_0_short_ttft_p95_ms": high_short, "priority_0_long_ttft_p95_ms": None,
            "priority_0_ttft_p95_ms": high_short,
            "priority_1_short_ttft_p95_ms": 80.0, "priority_1_long_ttft_p95_ms": low_long,
            "priority_1_ttft_p95_ms": low_all if low_all is not None else low_long}


CONFIGS = {"default": PolicyConfig(), "auto": load_config("auto"), "hrrn": load_config("hrrn"),
           "promote_shortest": load_config("promote_shortest")}


def test_the_row_is_chosen_on_the_high_class_not_on_all_short_requests():
    summaries = {
        "default": row(100.0, 400.0, short=120.0),
        "hrrn": row(60.0, 420.0, short=20.0),     # best short TTFT of all requests, not of the high class
        "auto": row(30.0, 440.0, short=40.0),     # best for the high class, low class +10%: within the limit
        "promote_shortest": row(10.0, 480.0),     # better still for the high class, but the low class pays +20%
    }
    plain = recommend(summaries, CONFIGS, baseline="default")
    assert plain["row"] == "hrrn"
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1])
    assert rec["row"] == "auto"
    assert rec["chosen_by"] == {"high_class": 0, "low_class": 1, "high": "class 0 short TTFT p95",
                                "low": "class 1 long TTFT p95"}
    assert "class 1 long TTFT p95 +20%" in rec["candidates"]["promote_shortest"]
    # What it buys the high class and costs the low class, before (default) -> after.
    assert rec["per_class"]["0"]["short_ttft_p95_ms"] == {"before": 100.0, "after": 30.0}
    assert rec["per_class"]["0"]["short_ttft_p95_change"] == pytest.approx(-0.7)
    assert rec["per_class"]["1"]["long_ttft_p95_ms"] == {"before": 400.0, "after": 440.0}
    assert rec["per_class"]["1"]["ttft_p95_change"] == pytest.approx(0.1)
    # The engine-wide figures stay the engine's (what compare's table shows), not the class view's.
    assert rec["short_ttft_p95_ms"] == {"before": 120.0, "after": 40.0}
    assert rec["long_ttft_p95_ms"] == {"before": 500.0, "after": 500.0}
    assert rec["command"].endswith("--scheduling-policy priority") and '"policy": "auto"' in rec["command"]


def test_throughput_below_the_limit_rules_a_row_out_and_default_stays_when_nothing_qualifies():
    summaries = {"default": row(100.0, 400.0), "auto": row(30.0, 400.0, tput=970.0)}
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1])
    assert rec["row"] == "default" and rec["is_default"]
    assert "output tok/s" in rec["candidates"]["auto"]
    assert rec["command"] == "vllm serve MODEL --scheduling-policy priority"
    assert rec["per_class"]["0"]["short_ttft_p95_change"] == 0.0


def test_a_low_class_without_long_requests_is_held_to_its_ttft_over_all_its_requests():
    summaries = {"default": row(100.0, None, low_all=400.0), "auto": row(30.0, None, low_all=500.0)}
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1])
    assert rec["row"] == "default"  # the low class's TTFT P95 +25%


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.floats(1, 1000), st.floats(1, 1000), st.floats(900, 1100)), min_size=1,
                     max_size=4))
def test_the_choice_matches_a_naive_reading_of_the_rule(rows):
    labels = list(CONFIGS)[:len(rows)]
    summaries = {label: row(high, low, tput) for label, (high, low, tput) in zip(labels, rows, strict=False)}
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[1, 0])
    base = summaries["default"]

    def fine(label):
        s = summaries[label]
        low_long = s["priority_1_long_ttft_p95_ms"] / base["priority_1_long_ttft_p95_ms"] - 1
        tput = s["output_tokens_per_s"] / base["output_tokens_per_s"] - 1
        return label == "default" or (low_long <= LONG_TTFT_P95_MAX_CHANGE + 1e-12
                                      and tput >= -THROUGHPUT_MAX_DROP - 1e-12)

    best = min((label for label in labels if fine(label)),
               key=lambda label: (summaries[label]["priority_0_short_ttft_p95_ms"],
                                  summaries[label]["priority_1_long_ttft_p95_ms"],
                                  -summaries[label]["output_tokens_per_s"], labels.index(label)))
    assert rec["row"] == best
    assert rec["per_class"]["0"]["short_ttft_p95_ms"]["after"] == summaries[best]["priority_0_short_ttft_p95_ms"]


def test_one_class_is_the_plain_recommendation():
    summaries = {"default": row(100.0, 400.0), "auto": row(30.0, 440.0)}
    assert recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0]) == recommend(
        summaries, CONFIGS, baseline="default")


def test_compare_in_priority_mode_recommends_per_class_in_the_table_json_markdown_and_html(tmp_path):
    args = ["--scenario", "sustained", "--set", "interactive_share=0.2", "--set", "duration_s=2",
            "--scheduling-policy", "priority", "--policies", "default,auto,hrrn", "--no-achievable"]
    result = run_compare(*args, "--out", str(tmp_path / "cmp"))
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    rec = data["recommendation"]
    per_class = rec["per_class"]
    by_row = data["priority_classes"]["by_row"]
    for klass in ("0", "1"):
        for figure in ("short_ttft_p95_ms", "ttft_p95_ms"):
            assert per_class[klass][figure] == {"before": by_row["default"][klass][figure],
                                                "after": by_row[rec["row"]][klass][figure]}
    assert "Per class" in result.output and "class 0 (served first)" in result.output
    assert "class 1 (served last)" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines() if "vllm serve" not in line)
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert "Chosen on class 0 short TTFT p95" in html and "(served last)" in html
    as_json = run_compare(*args, "--format", "json")
    assert json.loads(as_json.stdout)["recommendation"]["per_class"] == per_class
    markdown = run_compare(*args, "--format", "markdown")
    assert "* class 1 (served last):" in markdown.stdout


def test_compare_under_fcfs_keeps_the_plain_recommendation():
    result = run_compare("--scenario", "sustained", "--set", "interactive_share=0.2", "--set", "duration_s=1",
                         "--policies", "default,auto", "--no-achievable", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "per_class" not in json.loads(result.stdout)["recommendation"]


def test_what_the_plain_recommendation_added_stays_only_when_the_row_is_the_same():
    summaries = {"default": row(100.0, 400.0, short=120.0), "hrrn": row(60.0, 420.0, short=20.0),
                 "auto": row(30.0, 440.0, short=40.0)}
    for plain_row, kept in (("auto", True), ("hrrn", False)):
        plain = {"row": plain_row, "cost_range": [1, 2]}  # e.g. what the caller added to its own answer
        rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1], plain=plain)
        assert rec["row"] == "auto" and ("cost_range" in rec) == kept


def test_the_cost_ranges_are_the_whole_engines_changes_with_the_given_error():
    from prefillq.sim.recommend import cost_error_of

    summaries = {"default": row(100.0, 400.0, long=500.0), "auto": row(30.0, 440.0, long=600.0)}
    error = cost_error_of(None)
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1], cost_error=error)
    assert rec["row"] == "auto" and rec["cost_error"] == error
    ranged = rec["cost_ranges"]["long_ttft_p95_change"]
    pts = error["pts"]["long_ttft_p95_change"] / 100.0
    assert (ranged["low"], ranged["high"]) == pytest.approx((0.2 - pts, 0.2 + pts))  # 500 -> 600 ms, not 400 -> 440


def test_the_per_class_choice_keeps_the_long_cost_limit_the_plain_one_was_made_with():
    summaries = {"default": row(100.0, 400.0), "auto": row(30.0, 480.0)}  # the low class's long TTFT p95 +20%
    assert recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1])["row"] == "default"
    plain = {"row": "auto", "rule": {"long_ttft_p95_max_change": 0.25}}
    rec = recommend_by_class(summaries, CONFIGS, baseline="default", classes=[0, 1], plain=plain)
    assert rec["row"] == "auto" and rec["rule"]["long_ttft_p95_max_change"] == 0.25
