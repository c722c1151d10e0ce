"""Paired log-ratio comparison with a bootstrap interval over rounds (SPEC §6), on synthetic data with a
known effect."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.metrics import median
from prefillq.stats import bootstrap_mean_interval, compare_paired, paired_log_ratios


def synthetic_rounds(effect: float, rounds: int, seed: int, noise: float = 0.05, spread: float = 0.3):
    """Baseline values vary a lot between rounds (spread); the treatment is the same round's baseline
    times exp(effect + small noise): pairing removes the round-to-round spread."""
    rng = random.Random(seed)
    baseline = [1000.0 * math.exp(rng.gauss(0, spread)) for _ in range(rounds)]
    treatment = [b * math.exp(effect + rng.gauss(0, noise)) for b in baseline]
    return baseline, treatment


def test_strong_effect_is_found_and_the_interval_excludes_no_change():
    baseline, treatment = synthetic_rounds(effect=math.log(0.2), rounds=5, seed=1)  # an 80% cut
    result = compare_paired(baseline, treatment, seed=0)
    assert result.n == 5
    assert result.ci_low_log_ratio <= math.log(0.2) <= result.ci_high_log_ratio
    assert result.excludes_zero
    assert result.change == pytest.approx(-0.8, abs=0.05)
    assert result.ci_low < result.change < result.ci_high < 0


def test_no_effect_rarely_claims_one():
    """With no true effect the interval excludes zero in about 5% of datasets (a little more: the
    percentile bootstrap is narrow at 12 rounds), never in most of them."""
    false_alarms = 0
    for seed in range(200):
        baseline, treatment = synthetic_rounds(effect=0.0, rounds=12, seed=seed, noise=0.1)
        false_alarms += compare_paired(baseline, treatment, seed=seed, samples=2000).excludes_zero
    assert false_alarms <= 24


def test_interval_covers_the_true_effect_in_most_datasets():
    """Coverage over 200 seeded datasets of 12 rounds: a 95% percentile bootstrap covers the true mean
    in roughly 90-95% of them at this size (it is a little narrow for small n)."""
    effect = math.log(0.7)
    covered = 0
    for seed in range(200):
        baseline, treatment = synthetic_rounds(effect, rounds=12, seed=seed, noise=0.1)
        result = compare_paired(baseline, treatment, seed=seed, samples=2000)
        covered += result.ci_low_log_ratio <= effect <= result.ci_high_log_ratio
    assert covered >= 170


def test_same_seed_same_interval_other_seed_other_resamples():
    baseline, treatment = synthetic_rounds(effect=-0.3, rounds=6, seed=3)
    first = compare_paired(baseline, treatment, seed=7)
    assert compare_paired(baseline, treatment, seed=7) == first
    other = compare_paired(baseline, treatment, seed=8)
    assert other.mean_log_ratio == first.mean_log_ratio
    assert (other.ci_low_log_ratio, other.ci_high_log_ratio) != (first.ci_low_log_ratio, first.ci_high_log_ratio)


def test_one_round_has_no_spread_to_resample():
    result = compare_paired([100.0], [50.0])
    assert result.n == 1
    assert result.ci_low_log_ratio == result.ci_high_log_ratio == result.mean_log_ratio == pytest.approx(-math.log(2))
    assert not result.excludes_zero  # one round proves nothing


def test_missing_and_non_positive_rounds_are_skipped_and_counted():
    result = compare_paired([100.0, None, 0.0, 100.0], [50.0, 30.0, 20.0, 25.0])
    assert result.n == 2 and result.skipped == 2
    assert result.mean_log_ratio == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)
    assert compare_paired([None], [1.0]) is None
    assert paired_log_ratios([1.0, -1.0], [math.e, 1.0]) == [pytest.approx(1.0), None]
    with pytest.raises(ValueError, match="equal lengths"):
        paired_log_ratios([1.0], [1.0, 2.0])


def test_resampling_machines_widens_the_interval_when_machines_differ():
    """Rounds on two machines whose effects differ: resampling machines, then rounds, must give a wider
    interval than pretending all rounds are independent."""
    rng = random.Random(4)
    values = [-0.1 + rng.gauss(0, 0.02) for _ in range(6)] + [-0.5 + rng.gauss(0, 0.02) for _ in range(6)]
    groups = ["gpu0"] * 6 + ["gpu1"] * 6
    flat = bootstrap_mean_interval(values, seed=0)
    clustered = bootstrap_mean_interval(values, groups=groups, seed=0)
    assert (clustered[1] - clustered[0]) > 1.5 * (flat[1] - flat[0])
    with pytest.raises(ValueError):
        bootstrap_mean_interval(values, groups=groups[:3])


def test_bad_arguments():
    with pytest.raises(ValueError):
        bootstrap_mean_interval([])
    with pytest.raises(ValueError):
        bootstrap_mean_interval([1.0], confidence=1.5)


def test_to_dict_has_the_relative_changes():
    result = compare_paired([100.0, 200.0], [50.0, 100.0])
    data = result.to_dict()
    assert data["change"] == pytest.approx(-0.5)
    assert data["ci_low"] == pytest.approx(-0.5) and data["ci_high"] == pytest.approx(-0.5)
    assert data["n"] == 2 and data["excludes_zero"] is True  # both rounds say exactly -50%


def test_median_ignores_missing_values():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert median([None]) is None


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=2, max_size=12),
       st.floats(min_value=0.05, max_value=20.0))
def test_scaling_the_treatment_shifts_the_log_ratio_exactly(pairs, factor):
    """Multiplying every treatment value by c adds ln(c) to the mean and to both interval ends (the same
    seed draws the same resamples), and the interval always contains the point estimate."""
    baseline = [a for a, _ in pairs]
    treatment = [b for _, b in pairs]
    plain = compare_paired(baseline, treatment, seed=1, samples=500)
    scaled = compare_paired(baseline, [b * factor for b in treatment], seed=1, samples=500)
    shift = math.log(factor)
    assert scaled.mean_log_ratio == pytest.approx(plain.mean_log_ratio + shift, abs=1e-9)
    assert scaled.ci_low_log_ratio == pytest.approx(plain.ci_low_log_ratio + shift, abs=1e-9)
    assert scaled.ci_high_log_ratio == pytest.approx(plain.ci_high_log_ratio + shift, abs=1e-9)
    assert plain.ci_low_log_ratio <= plain.mean_log_ratio <= plain.ci_high_log_ratio
