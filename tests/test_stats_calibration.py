"""Is ``compare_paired`` calibrated at the round counts people run? Simulated experiments (SPEC §6).

Every experiment is a set of rounds in which both policies see the same large round factor (lognormal,
sd 0.3 in log space: pairing must cancel it) and each gets its own noise of sd 0.07 in log space, so
the paired log-ratio has sd ~0.1. With no true effect a calibrated 95% interval excludes zero in 5%
of experiments. With 4,000 experiments the binomial standard error of an observed 5% is
sqrt(0.05 · 0.95 / 4000) = 0.0034, so a calibrated method lands within 0.05 ± 3 SE = [0.040, 0.060]
except in about 3 of 1,000 seeds; the seeds are fixed, so the outcome is reproducible.

Data are generated with numpy in one go per cell; the public function is then called once per
experiment (about 40 µs each for the t rule), so the module runs in a few seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefillq.stats import BOOTSTRAP_MIN_UNITS, compare_paired

EXPERIMENTS = 4000
ALPHA = 0.05
SE = math.sqrt(ALPHA * (1 - ALPHA) / EXPERIMENTS)
UPPER, LOWER = ALPHA + 3 * SE, ALPHA - 3 * SE
POLICY_SD = 0.07


def rounds(seed: int, n: int, noise: str = "normal", effect: float = 0.0, experiments: int = EXPERIMENTS,
           machine_effect: np.ndarray | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """Baseline and treatment values per experiment (rows) and round (columns).

    ``noise="heavy"``: Student-t noise with 3 degrees of freedom, rescaled to sd 0.07 (its variance is
    3), so the same spread comes with rare large outliers. ``machine_effect`` (experiments x n) is
    added to the treatment's log: machines that respond differently to the policy.
    """
    rng = np.random.default_rng(seed)
    shape = (experiments, n)

    def own_noise() -> np.ndarray:
        if noise == "normal":
            return rng.normal(0.0, POLICY_SD, shape)
        return rng.standard_t(3, shape) * (POLICY_SD / math.sqrt(3.0))

    shared = rng.normal(0.0, 0.3, shape)
    baseline = 1000.0 * np.exp(shared + own_noise())
    treatment_log = shared + effect + own_noise()
    if machine_effect is not None:
        treatment_log += machine_effect
    return baseline.tolist(), (1000.0 * np.exp(treatment_log)).tolist()


def exclusion_rate(baseline: list[list[float]], treatment: list[list[float]], groups: list[int] | None = None,
                   samples: int = 1000, expect: str | None = None) -> float:
    """Share of experiments whose interval excludes "no change" (checking the rule that was used)."""
    hits = 0
    for a, b in zip(baseline, treatment, strict=True):
        result = compare_paired(a, b, groups=groups, samples=samples)
        assert expect is None or result.method == expect
        hits += result.excludes_zero
    return hits / len(baseline)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_no_effect_normal_noise_false_positive_rate_is_five_percent(n):
    """The t-interval is exact for normal log-ratios: the rate must be inside 0.05 ± 3 SE on both sides
    (too low would mean an interval wider than it needs to be)."""
    rate = exclusion_rate(*rounds(seed=100 + n, n=n), expect="t")
    assert LOWER <= rate <= UPPER, rate


@pytest.mark.parametrize("n", [3, 5, 10])
def test_no_effect_heavy_tailed_noise_does_not_raise_false_positives(n):
    """Heavy tails (t with 3 d.o.f.): with no effect the log-ratio is still symmetric about zero, and
    the t-test on symmetric heavy-tailed data is conservative (an outlier inflates s more than the
    mean), so the upper bound is the same 0.05 + 3 SE. The lower bound only guards against an interval
    that became useless: benchmarks/stats_calibration.py measures 3.9-4.0% at these sizes (these seeds
    give 3.8-4.6%), and 2.5% is more than 3 SE below the lowest of them."""
    rate = exclusion_rate(*rounds(seed=200 + n, n=n, noise="heavy"), expect="t")
    assert 0.025 <= rate <= UPPER, rate


def test_power_at_three_rounds_for_a_thirty_percent_cut():
    """A true -30% change (log-ratio ln 0.7) with log-ratio noise sd 0.099: the t-test's power at 3
    rounds is 0.858 (400,000 simulated t statistics, SE 0.0006). With 4,000 experiments the SE is
    0.0055, so 0.84 is 3 SE below it. (From 5 rounds on the power is ~100%.)"""
    rate = exclusion_rate(*rounds(seed=300, n=3, effect=math.log(0.7)), expect="t")
    assert rate >= 0.84, rate


def test_heavy_tails_keep_most_of_the_power():
    """The same -30% change under t(3) noise of the same sd: the calibration measures 0.902 (4,000
    experiments, SE 0.005); with 1,000 experiments here the SE is 0.0094, so 0.87 is 3 SE below."""
    rate = exclusion_rate(*rounds(seed=301, n=3, noise="heavy", effect=math.log(0.7), experiments=1000),
                          expect="t")
    assert rate >= 0.87, rate


def machine_effects(seed: int, layout: tuple[int, ...], experiments: int, sd: float = 0.05) -> np.ndarray:
    """A random effect per machine (sd ``sd`` on the log-ratio), repeated over that machine's rounds."""
    per_machine = np.random.default_rng(seed).normal(0.0, sd, (experiments, len(layout)))
    return np.repeat(per_machine, layout, axis=1)


def layout_groups(layout: tuple[int, ...]) -> list[int]:
    return [machine for machine, count in enumerate(layout) for _ in range(count)]


def test_machines_that_differ_keep_the_false_positive_rate():
    """4 machines x 3 rounds, each machine's effect off by N(0, 0.05): the per-machine means are i.i.d.
    normal, so the cluster t-interval is exact (0.05 ± 3 SE). Treating the 12 rounds as independent
    is what goes wrong: it is far above the bound."""
    layout = (3, 3, 3, 3)
    data = rounds(seed=400, n=12, machine_effect=machine_effects(401, layout, EXPERIMENTS))
    grouped = exclusion_rate(*data, groups=layout_groups(layout), expect="cluster-t")
    assert LOWER <= grouped <= UPPER, grouped
    ignoring = exclusion_rate(*data, expect="t")
    assert ignoring > UPPER + 0.02, ignoring


@pytest.mark.parametrize("layout", [(1, 1, 8), (1, 2, 3, 6)])
def test_unbalanced_machines_are_not_anti_conservative(layout):
    """Machines with unequal round counts: machine means have unequal variances, and the t over them is
    conservative then (pooling rounds with a cluster-robust error gave 10-15% for 1+1+8)."""
    data = rounds(seed=500 + len(layout), n=sum(layout),
                  machine_effect=machine_effects(510 + len(layout), layout, EXPERIMENTS))
    rate = exclusion_rate(*data, groups=layout_groups(layout), expect="cluster-t")
    assert rate <= UPPER, rate


BOOT_EXPERIMENTS = 1000
BOOT_UPPER = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / BOOT_EXPERIMENTS)  # 0.071
BOOT_LOWER = ALPHA - 3 * math.sqrt(ALPHA * (1 - ALPHA) / BOOT_EXPERIMENTS)  # 0.029


@pytest.mark.parametrize("noise", ["normal", "heavy"])
def test_many_rounds_use_the_expanded_bootstrap_and_stay_calibrated(noise):
    """40 rounds (bootstrap regime), 1,000 experiments of 1,000 resamples each (fewer: each costs a
    bootstrap); the band is 0.05 ± 3 SE for 1,000 experiments."""
    n = BOOTSTRAP_MIN_UNITS + 10
    rate = exclusion_rate(*rounds(seed=600, n=n, noise=noise, experiments=BOOT_EXPERIMENTS), samples=1000,
                          expect="bootstrap")
    assert BOOT_LOWER <= rate <= BOOT_UPPER, rate


def test_many_machines_use_the_cluster_bootstrap_and_stay_calibrated():
    layout = (2,) * BOOTSTRAP_MIN_UNITS
    data = rounds(seed=700, n=sum(layout), experiments=BOOT_EXPERIMENTS,
                  machine_effect=machine_effects(701, layout, BOOT_EXPERIMENTS))
    rate = exclusion_rate(*data, groups=layout_groups(layout), samples=1000, expect="cluster-bootstrap")
    assert BOOT_LOWER <= rate <= BOOT_UPPER, rate
