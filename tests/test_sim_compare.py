"""The comparison library behind ``prefillq compare``: settings checks, configured rows, the prefill-overload
and lane-split warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefillq.sim import CostModel, PdConfig, Profile
from prefillq.sim.compare import (
    DEFAULT_POLICIES,
    CompareError,
    CompareSettings,
    baseline_row,
    comparison_details,
    comparison_rows,
    lane_split_warnings,
    prefill_load_warning,
    prepare_comparison,
)
from prefillq.sim.costs import DEFAULT_LIMITS
from prefillq.workload import RequestSpec, Workload

# 10 ms per step + 10 µs per token: at a budget of 1000 a step takes 20 ms, i.e. 50,000 prompt tokens/s.
PROFILE = Profile("t", "", "", CostModel(0.01, 1e-5), dict(DEFAULT_LIMITS))
CAPACITY = 50_000.0


def steady(tokens_per_s: float, window_s: float = 10.0, requests: int = 11, rate: float | None = None) -> Workload:
    """``requests`` equal prompts evenly over ``window_s`` offering ``tokens_per_s`` prompt tokens/s."""
    prompt = round(tokens_per_s * window_s / requests)
    specs = [RequestSpec(f"r{i}", i * window_s / (requests - 1), prompt, 4, "short") for i in range(requests)]
    return Workload("steady", specs, {} if rate is None else {"rate": rate})


def test_no_warning_at_or_below_the_prefill_capacity():
    assert prefill_load_warning(steady(0.99 * CAPACITY), PROFILE, 1000, CompareSettings()) is None


def test_a_trace_over_the_capacity_gets_the_factor_and_a_rate_scale_that_fits():
    settings = CompareSettings(trace=Path("t.csv"), rate_scale=2.0)
    warning = prefill_load_warning(steady(3 * CAPACITY), PROFILE, 1000, settings)
    assert warning is not None and "\n" not in warning
    assert "3.0x" in warning
    assert "--rate-scale 0.67" in warning  # 2.0 / 3.0: the same trace at a third of the speed fits


def test_a_scenario_over_the_capacity_is_told_a_rate_that_fits():
    warning = prefill_load_warning(steady(2 * CAPACITY, rate=100.0), PROFILE, 1000, CompareSettings())
    assert warning is not None and "2.0x" in warning and "--set rate=50" in warning


def test_template_tokens_count_and_pd_pairs_add_capacity():
    load = steady(0.9 * CAPACITY)
    assert prefill_load_warning(load, PROFILE, 1000, CompareSettings()) is None
    extra = round(0.2 * CAPACITY * 10 / 11)  # template tokens per request adding 20% of the capacity
    assert prefill_load_warning(load, PROFILE, 1000, CompareSettings(template_tokens=extra)) is not None
    two_pairs = CompareSettings(template_tokens=extra, topology="1p1d", pd=PdConfig(pairs=2))
    assert prefill_load_warning(load, PROFILE, 1000, two_pairs) is None


def test_a_burst_is_a_backlog_not_a_rate():
    assert prefill_load_warning(steady(100 * CAPACITY, window_s=0.5), PROFILE, 1000, CompareSettings()) is None


def test_prepare_returns_the_warning_as_data():
    setup = prepare_comparison(CompareSettings(scenario="overload", policies=["default"]))
    assert len(setup.warnings) == 1 and "--set rate=" in setup.warnings[0]
    assert prepare_comparison(CompareSettings(scenario="low-load")).warnings == []
    assert prepare_comparison(CompareSettings(scenario="long-first")).warnings == []  # a burst


@pytest.mark.parametrize("settings, message", [
    (CompareSettings(mode="sglang"), "unknown mode 'sglang'"),
    (CompareSettings(topology="2p2d"), "unknown topology '2p2d'"),
    (CompareSettings(budget=0), "budget must be an integer >= 1"),
    (CompareSettings(repeats=0), "repeats must be an integer >= 1"),
    (CompareSettings(policies=[" "]), "no policies"),
    (CompareSettings(scenario="long-first", trace=Path("t.csv")), "not both"),
    (CompareSettings(trace=Path("t.csv"), overrides={"rate": 1}), "apply to scenarios"),
    (CompareSettings(pd=PdConfig()), "1p1d"),
])
def test_bad_settings_are_compare_errors(settings, message):
    with pytest.raises(CompareError, match=message):
        prepare_comparison(settings)


# --- configured rows (--policy SPEC), the baseline, vLLM's long_prefill_token_threshold, lane warnings ----

def _run(**settings):
    return prepare_comparison(CompareSettings(scenario="long-first", **settings)).run()


def test_configured_rows_are_keyed_by_their_spec_and_a_threshold_changes_the_numbers():
    specs = ["short_request_first:threshold=64", "short_request_first:threshold=256"]
    comparison = _run(policy_specs=specs)
    assert list(comparison.summaries) == specs == list(comparison.records) == list(comparison.last_runs)
    low, high = (comparison.summaries[spec] for spec in specs)
    # long-first's short prompts have 128 tokens: at 64 every request is long (one lane, FCFS); at 256 they jump
    assert high["short_ttft_p50_ms"] < 0.1 * low["short_ttft_p50_ms"]
    assert comparison.configs[specs[0]].threshold == 64 and comparison.baseline is None


def test_the_numbers_depend_on_the_configuration_not_the_label():
    same = ["srf", "short_request_first:threshold=256", '{"policy": "short_request_first"}', "SRF"]
    comparison = _run(policies=["short_request_first"], policy_specs=same)
    summaries = list(comparison.summaries.values())
    assert len(summaries) == 5 and all(summary == summaries[0] for summary in summaries)


def test_rows_follow_policies_then_specs_and_the_baseline_is_the_plain_default_row():
    setup = prepare_comparison(CompareSettings(policies=["hrrn", "fcfs"], policy_specs=["default:threshold=9"]))
    assert setup.policies == ["hrrn", "default", "default:threshold=9"]
    assert baseline_row(setup.rows) == "default"
    assert baseline_row(comparison_rows(None, ["default:trust_request_priority=true", "fcfs"])) == "fcfs"
    assert baseline_row(comparison_rows(None, ["hrrn", "srf"])) is None
    assert list(comparison_rows(None)) == [*DEFAULT_POLICIES, "auto:partial_prefills=ordered"]
    assert comparison_rows(None)["auto:partial_prefills=ordered"].partial_prefills == "ordered"
    assert list(comparison_rows(None, mode="lightllm")) == [*DEFAULT_POLICIES, "auto"]  # its engine orders them
    assert list(comparison_rows(["default", "fcfs", "srf"])) == ["default", "short_request_first"]


@pytest.mark.parametrize("policies, specs, message", [
    (None, ["hrrn", "hrrn"], "two rows are labelled 'hrrn'"),
    (["default"], ["default"], "two rows are labelled 'default'"),
    ([], [], "no policies"),
    (None, ["srf:treshold=5"], "did you mean 'threshold'?"),
    (["srf:threshold=512"], [], "--policies takes plain policy names, got 'srf:threshold=512'; give a configured "
                                "row as --policy SPEC"),
])
def test_bad_rows_are_errors(policies, specs, message):
    with pytest.raises(ValueError, match=message):
        comparison_rows(policies, specs)


def test_long_prefill_token_threshold_shorter_chunks_let_shorts_in_sooner_under_default():
    """vLLM caps each running prefill's chunk: the longs ahead share the budget, so FCFS admits the
    shorts behind them sooner (and the longs finish later)."""
    runs = {cap: _run(policies=["default"], long_prefill_token_threshold=cap).summaries["default"]
            for cap in (None, 0, 256, 64)}
    assert runs[None] == runs[0]  # the profile's value: off
    assert runs[0]["short_ttft_mean_ms"] > runs[256]["short_ttft_mean_ms"] > runs[64]["short_ttft_mean_ms"]
    assert runs[0]["long_e2e_p95_ms"] < runs[256]["long_e2e_p95_ms"]
    with pytest.raises(CompareError, match="long_prefill_token_threshold must be a non-negative integer"):
        prepare_comparison(CompareSettings(long_prefill_token_threshold=-1))


def test_in_lightllm_mode_the_threshold_is_the_chunk_size():
    plain = _run(policies=["default"], mode="lightllm", template_tokens=12).summaries["default"]
    capped = _run(policies=["default"], mode="lightllm", template_tokens=12,
                  long_prefill_token_threshold=256).summaries["default"]
    assert plain != capped


def lengths_workload(lengths: list[int]) -> Workload:
    specs = [RequestSpec(f"r{i}", i * 0.01, n, 4, "short") for i, n in enumerate(lengths)]
    return Workload("lengths", specs, {})


def test_a_threshold_that_leaves_a_lane_empty_warns_with_the_split_and_tunes_threshold():
    from prefillq.workload.split import split_threshold

    lengths = [3000 + 10 * (i % 50) for i in range(70)] + [40 + i % 30 for i in range(30)]
    tuned = split_threshold(lengths).threshold
    rows = comparison_rows(None, ["default", "hrrn", "srf", "srf:threshold=100000", f"srf:threshold={tuned}"])
    warnings = lane_split_warnings(lengths_workload(lengths), rows)
    assert len(warnings) == 1 and "\n" not in warnings[0]  # 256 and tune's threshold split 30/70
    assert warnings[0].startswith("row 'srf:threshold=100000': short_request_first threshold 100000 splits the "
                                  "requests 100 short / 0 long, so it orders requests as default (FCFS) does")
    assert f"prefillq tune would choose threshold={tuned}, which splits them 30 short / 70 long (30% of the " \
           "requests and 1% of the prompt tokens short)" in warnings[0]
    assert f"--policy short_request_first:threshold={tuned}" in warnings[0]


def test_a_threshold_that_puts_over_95_percent_of_requests_and_tokens_in_one_lane_warns():
    lengths = [5000 + i for i in range(97)] + [100, 101, 102]  # srf at 256: 3% short
    rows = comparison_rows(None, ["srf", "srf:threshold=99"])
    warnings = lane_split_warnings(lengths_workload(lengths), rows)
    assert len(warnings) == 2
    assert "row 'srf': short_request_first threshold 256 splits the requests 3 short / 97 long (3% of the " \
           "requests and 0% of the prompt tokens short), so it reorders few requests" in warnings[0]
    assert "0 short / 100 long" in warnings[1]
    at_350 = comparison_rows(None, ["srf:threshold=350"])
    lopsided = [300] * 98 + [400] * 2  # 98% of the requests and 97% of the prompt tokens short
    assert "(98% of the requests and 97% of the prompt tokens short), so it reorders few requests" in \
        lane_split_warnings(lengths_workload(lopsided), at_350)[0]
    heavier_longs = [300] * 98 + [1000] * 2  # 98% of the requests but 94% of the tokens short
    assert lane_split_warnings(lengths_workload(heavier_longs), at_350) == []


def test_a_few_long_prompts_holding_most_of_the_work_are_not_lopsided():
    """long-then-stream's shape: 2% of the requests are long but hold most prompt tokens; the policy matters."""
    lengths = [16000] * 16 + [100] * 984
    rows = comparison_rows(None, ["srf"])
    assert lane_split_warnings(lengths_workload(lengths), rows) == []
    assert prepare_comparison(CompareSettings(scenario="long-then-stream", policies=["srf"])).warnings == []
    # the policy sees the template tokens: 100 + 200 > 256 puts every request in the long lane
    templated = lane_split_warnings(lengths_workload([100] * 50 + [5000] * 50), rows, template_tokens=200)
    assert "0 short / 100 long" in templated[0] and "plus the 200 template tokens" in templated[0]


def test_a_workload_no_threshold_can_split_says_so():
    warnings = lane_split_warnings(lengths_workload([5000] * 40), comparison_rows(None, ["srf"]))
    assert len(warnings) == 1 and "no threshold gives this workload two sizeable lanes" in warnings[0]


def test_the_warnings_go_into_the_comparison_and_its_json_details():
    settings = CompareSettings(scenario="long-first", policy_specs=["default", "srf:threshold=64"])
    setup = prepare_comparison(settings)
    comparison = setup.run()
    assert comparison.warnings == setup.warnings and len(setup.warnings) == 1
    details = comparison_details(settings, comparison)
    assert details["warnings"] == setup.warnings and details["baseline"] == "default"
    assert details["configs"]["srf:threshold=64"]["threshold"] == 64
    assert details["long_prefill_token_threshold"] == 0
