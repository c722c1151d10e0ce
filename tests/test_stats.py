"""Paired log-ratio comparison with a calibrated interval over rounds (SPEC §6), on synthetic data with a
known effect; the Student-t distribution it rests on. The false-positive-rate simulations are in
test_stats_calibration.py."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.metrics import median
from prefillq.stats import (
    BOOTSTRAP_MIN_UNITS,
    bootstrap_mean_interval,
    bootstrap_means,
    compare_paired,
    paired_log_ratios,
    regularized_incomplete_beta,
    t_cdf,
    t_quantile,
    t_two_sided_tail,
)


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
    """With no true effect the interval excludes zero in about 5% of datasets (200 datasets: at most 24
    false alarms is far above the expected 10)."""
    false_alarms = 0
    for seed in range(200):
        baseline, treatment = synthetic_rounds(effect=0.0, rounds=12, seed=seed, noise=0.1)
        false_alarms += compare_paired(baseline, treatment, seed=seed, samples=2000).excludes_zero
    assert false_alarms <= 24


def test_interval_covers_the_true_effect_in_most_datasets():
    """Coverage over 200 seeded datasets of 12 rounds: the 95% t-interval covers the true mean in about
    190 of them; 170 is more than 4 binomial SEs below."""
    effect = math.log(0.7)
    covered = 0
    for seed in range(200):
        baseline, treatment = synthetic_rounds(effect, rounds=12, seed=seed, noise=0.1)
        result = compare_paired(baseline, treatment, seed=seed, samples=2000)
        covered += result.ci_low_log_ratio <= effect <= result.ci_high_log_ratio
    assert covered >= 170


def test_same_seed_same_interval_other_seed_other_resamples():
    """Many rounds use the seeded bootstrap: the same seed gives the same answer, another seed other
    resamples; the point estimate never depends on the seed."""
    baseline, treatment = synthetic_rounds(effect=-0.3, rounds=BOOTSTRAP_MIN_UNITS + 10, seed=3)
    first = compare_paired(baseline, treatment, seed=7)
    assert first.method == "bootstrap"
    assert compare_paired(baseline, treatment, seed=7) == first
    other = compare_paired(baseline, treatment, seed=8)
    assert other.mean_log_ratio == first.mean_log_ratio
    assert (other.ci_low_log_ratio, other.ci_high_log_ratio) != (first.ci_low_log_ratio, first.ci_high_log_ratio)


def test_few_rounds_use_the_t_interval_which_has_no_seed():
    baseline, treatment = synthetic_rounds(effect=-0.3, rounds=6, seed=3)
    first = compare_paired(baseline, treatment, seed=7)
    assert first.method == "t"
    assert compare_paired(baseline, treatment, seed=8) == first


def test_one_round_has_no_spread_to_resample():
    result = compare_paired([100.0], [50.0])
    assert result.n == 1
    assert result.ci_low_log_ratio == result.ci_high_log_ratio == result.mean_log_ratio == pytest.approx(-math.log(2))
    assert not result.excludes_zero  # one round proves nothing
    assert result.p_value is None and result.method == "none"


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
    assert data["p_value"] == 0.0 and data["method"] == "t"  # no spread at all: no division by zero


def test_median_ignores_missing_values():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert median([None]) is None


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=2, max_size=BOOTSTRAP_MIN_UNITS + 3),
       st.floats(min_value=0.05, max_value=20.0))
def test_scaling_the_treatment_shifts_the_log_ratio_exactly(pairs, factor):
    """Multiplying every treatment value by c adds ln(c) to the mean and to both interval ends (t: the
    spread is unchanged; bootstrap: the same seed draws the same resamples), and the interval always
    contains the point estimate."""
    baseline = [a for a, _ in pairs]
    treatment = [b for _, b in pairs]
    plain = compare_paired(baseline, treatment, seed=1, samples=500)
    scaled = compare_paired(baseline, [b * factor for b in treatment], seed=1, samples=500)
    shift = math.log(factor)
    assert scaled.mean_log_ratio == pytest.approx(plain.mean_log_ratio + shift, abs=1e-9)
    assert scaled.ci_low_log_ratio == pytest.approx(plain.ci_low_log_ratio + shift, abs=1e-9)
    assert scaled.ci_high_log_ratio == pytest.approx(plain.ci_high_log_ratio + shift, abs=1e-9)
    assert plain.ci_low_log_ratio <= plain.mean_log_ratio <= plain.ci_high_log_ratio
    assert 0.0 <= plain.p_value <= 1.0


# ---------------------------------------------------------------------------------------------------
# Student-t, checked against printed table values (to the 6 decimals tables give)


@pytest.mark.parametrize(("p", "df", "table"), [
    (0.975, 2, 4.302653), (0.975, 4, 2.776445), (0.975, 9, 2.262157), (0.975, 29, 2.045230),
    (0.95, 30, 1.697261), (0.995, 1, 63.656741), (0.995, 5, 4.032143), (0.9995, 3, 12.923979),
    (0.90, 10, 1.372184), (0.975, 10**7, 1.959964),
])
def test_t_quantile_matches_tables(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-7)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=5e-7)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_distribution_closed_forms():
    """df=1 is Cauchy, df=2 has a closed-form quantile; I_x(a, 1) = x^a; the CDF is symmetric."""
    for p in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    for x in (0.01, 0.3, 0.7, 0.99):
        assert regularized_incomplete_beta(2.5, 1.0, x) == pytest.approx(x ** 2.5, rel=1e-12)
        assert regularized_incomplete_beta(1.0, 1.0, x) == pytest.approx(x, rel=1e-12)
    assert t_cdf(2.0, 5) == pytest.approx(0.9490302605850709, abs=1e-12)
    assert t_cdf(-1.3, 7) + t_cdf(1.3, 7) == pytest.approx(1.0, abs=1e-14)
    assert t_two_sided_tail(0.0, 3) == 1.0 and t_two_sided_tail(math.inf, 3) == 0.0
    assert t_quantile(0.5, 4) == 0.0
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_two_sided_tail(1.0, 0)


# ---------------------------------------------------------------------------------------------------
# The interval rules


def test_three_same_sign_rounds_with_high_spread_no_longer_exclude_zero():
    """The old failure mode: three log-ratios all negative always made the percentile bootstrap
    exclude zero. Here mean -0.0867, s 0.1002, so t_{0.975,2}·s/sqrt(3) = 0.249 > |mean|."""
    d = [-0.01, -0.2, -0.05]
    baseline, treatment = [1.0] * 3, [math.exp(v) for v in d]
    _, old_high = bootstrap_mean_interval(d, seed=0)
    assert old_high < 0  # what the report used to say
    result = compare_paired(baseline, treatment)
    mean = sum(d) / 3
    half = 4.302653 * math.sqrt(sum((v - mean) ** 2 for v in d) / 2 / 3)
    assert result.method == "t" and not result.excludes_zero
    assert result.ci_low_log_ratio == pytest.approx(mean - half, abs=1e-5)
    assert result.ci_high_log_ratio == pytest.approx(mean + half, abs=1e-5)
    assert result.p_value == pytest.approx(t_two_sided_tail(mean / (half / 4.302653), 2))
    assert 0.2 < result.p_value < 0.35
    tight = compare_paired(baseline, [math.exp(v) for v in (-0.19, -0.2, -0.21)])
    assert tight.excludes_zero and tight.p_value < 0.01  # same sign AND consistent: a real change


def test_identical_log_ratios_give_a_point_interval():
    same = compare_paired([100.0, 50.0, 10.0], [80.0, 40.0, 8.0])
    assert same.ci_low_log_ratio == same.ci_high_log_ratio == same.mean_log_ratio
    assert same.p_value == 0.0 and same.excludes_zero
    unchanged = compare_paired([100.0, 50.0, 10.0], [100.0, 50.0, 10.0])
    assert unchanged.mean_log_ratio == 0.0 and unchanged.p_value == 1.0 and not unchanged.excludes_zero
    many = compare_paired([100.0] * 40, [80.0] * 40)
    assert many.method == "bootstrap" and many.excludes_zero


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(min_value=-0.5, max_value=0.5), min_size=2, max_size=BOOTSTRAP_MIN_UNITS + 5),
       st.integers(min_value=0, max_value=6), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_excludes_zero_agrees_with_the_p_value(d, machines, confidence):
    """``excludes_zero`` is ``p_value < 1 - confidence`` for every rule (boundary ties aside)."""
    groups = None if machines == 0 else [i % machines for i in range(len(d))]
    result = compare_paired([1.0] * len(d), [math.exp(v) for v in d], groups=groups, samples=400,
                            confidence=confidence)
    alpha = 1.0 - confidence
    if abs(result.p_value - alpha) > 1e-9:
        assert result.excludes_zero == (result.p_value < alpha), result


def test_method_names_follow_the_unit_count():
    def method(rounds: int, groups=None) -> str:
        return compare_paired([1.0] * rounds, [1.0 + 0.01 * (i % 3) for i in range(rounds)], groups=groups,
                              samples=200).method

    assert method(2) == "t" and method(BOOTSTRAP_MIN_UNITS - 1) == "t" and method(BOOTSTRAP_MIN_UNITS) == "bootstrap"
    assert method(12, groups=[i % 4 for i in range(12)]) == "cluster-t"
    assert method(2 * BOOTSTRAP_MIN_UNITS, groups=[i // 2 for i in range(2 * BOOTSTRAP_MIN_UNITS)]) == \
        "cluster-bootstrap"
    assert method(6, groups=["gpu0"] * 6) == "t"  # one machine: rounds are the units


def test_machines_are_the_units_with_groups():
    """With groups the estimate is the mean of per-machine means and the interval a t over those means,
    so three machines with three rounds each have 2 degrees of freedom, not 8."""
    d = [-0.30, -0.31, -0.29, -0.05, -0.06, -0.04, -0.20, -0.21, -0.19]
    groups = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    baseline, treatment = [1.0] * 9, [math.exp(v) for v in d]
    grouped = compare_paired(baseline, treatment, groups=groups)
    flat = compare_paired(baseline, treatment)
    machine_means = [-0.30, -0.05, -0.20]
    by_hand = compare_paired([1.0] * 3, [math.exp(v) for v in machine_means])
    assert grouped.method == "cluster-t" and grouped.n == 9
    assert grouped.mean_log_ratio == pytest.approx(by_hand.mean_log_ratio)
    assert grouped.ci_low_log_ratio == pytest.approx(by_hand.ci_low_log_ratio)
    assert grouped.p_value == pytest.approx(by_hand.p_value)
    assert flat.excludes_zero and not grouped.excludes_zero  # the machines disagree too much
    unequal = compare_paired([1.0] * 4, [math.exp(v) for v in (-0.1, -0.1, -0.1, -0.3)], groups=[0, 0, 0, 1])
    assert unequal.mean_log_ratio == pytest.approx(-0.2)  # each machine counts once
    with pytest.raises(ValueError, match="one label per round"):
        compare_paired([1.0, 2.0], [1.0, 2.0], groups=["a"])


def test_skipped_rounds_drop_their_group_label():
    result = compare_paired([1.0, None, 1.0, 1.0], [0.9, 1.0, 0.8, 0.85], groups=["a", "b", "a", "c"])
    assert result.n == 3 and result.skipped == 1 and result.method == "cluster-t"
    assert result.mean_log_ratio == pytest.approx(((math.log(0.9) + math.log(0.8)) / 2 + math.log(0.85)) / 2)


def test_two_stage_bootstrap_is_vectorised_and_deterministic():
    values = [0.1, 0.2, 0.3, 0.5, 0.4]
    groups = ["x", "x", "y", "y", "y"]
    first = bootstrap_means(values, groups=groups, samples=5000, seed=3)
    assert (first == bootstrap_means(values, groups=groups, samples=5000, seed=3)).all()
    assert first.min() >= 0.1 and first.max() <= 0.5
    assert first.mean() == pytest.approx(sum(values) / 5, abs=0.03)
    with pytest.raises(ValueError):
        bootstrap_means(values, samples=0)


def test_confidence_must_be_a_probability():
    with pytest.raises(ValueError, match="confidence"):
        compare_paired([1.0, 2.0], [1.0, 2.0], confidence=95)


def test_importing_stats_does_not_load_numpy():
    """`import prefillq` stays light (benchmarks/startup.py): numpy loads only for the bootstrap."""
    import subprocess
    import sys

    code = "import sys, prefillq.stats as s; s.compare_paired([1, 2, 3], [1, 2, 4]); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
