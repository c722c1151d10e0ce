"""The comparison library behind ``prefillq compare``: settings checks and the prefill-overload warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefillq.sim import CostModel, PdConfig, Profile
from prefillq.sim.compare import CompareError, CompareSettings, prefill_load_warning, prepare_comparison
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
