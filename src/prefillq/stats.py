"""Paired comparison of two policies over repetitions (SPEC §6).

Each repetition (round) runs both policies on the identical schedule, so the rounds pair up. For a
metric with per-round values ``a_i`` (baseline) and ``b_i`` (treatment) the effect is the mean of
the paired log-ratios ``d_i = ln(b_i / a_i)``; ``exp(mean) - 1`` is the relative change (-0.8 = an
80% cut).

Why not always the bootstrap: people run 3-10 rounds, and a percentile bootstrap over three values
can never reach past their minimum and maximum, so three log-ratios of the same sign always "exclude
zero". With no true effect that called a change significant in about a quarter of experiments at
three rounds. The interval is therefore chosen by how many independent units there are:

* fewer than :data:`BOOTSTRAP_MIN_UNITS` rounds: a Student-t interval on the log-ratios,
  ``mean ± t_{(1+c)/2, n-1} · s / sqrt(n)``, with its two-sided p-value (``method="t"``). It is
  exact for normal round noise and conservative for symmetric heavy-tailed noise; with no true
  effect the log-ratios of exchangeable rounds are symmetric about zero, so it keeps its level.
* that many rounds or more: a seeded percentile bootstrap over rounds (``method="bootstrap"``),
  whose interval follows the shape of the data. The plain percentile interval is too narrow by the
  factor ``z/t·sqrt((n-1)/n)``, so its nominal level is expanded until it matches the t-interval on
  normal data (the "expanded percentile" interval) and it keeps the 5% false-positive rate.
* with ``groups`` (rounds ran on several machines), the machine is the independent unit: the
  effect is the mean of the per-machine mean log-ratios (each machine counts once; with equal rounds
  per machine this is the mean over rounds) and the same two rules apply to the machine means, with
  ``machines - 1`` degrees of freedom: ``method="cluster-t"`` below the cut-off, else
  ``"cluster-bootstrap"``. Treating rounds on few machines as independent is anti-conservative
  whenever machines differ in their effect; weighting machines by their rounds with a
  cluster-robust error is anti-conservative when one machine ran most of them; the old two-stage
  bootstrap (machines, then rounds within each) counts the round noise twice and is too wide. With
  one distinct label ``groups`` changes nothing.

The cut-off and the measured false-positive rates and power come from
``benchmarks/stats_calibration.py`` (see docs/bench.md, "Statistics").

``p_value`` is two-sided for "no change" and agrees with the interval: ``excludes_zero`` exactly when
``p_value < 1 - confidence`` (up to the resolution of the bootstrap). With fewer than two usable
rounds there is no spread: the interval collapses onto the point estimate, ``p_value`` is None and
``method`` is ``"none"``. When every log-ratio is identical the spread is zero: the interval is that
single value, and ``p_value`` is 0 (or 1 when the value is exactly 0) — a perfectly repeatable
change is reported as such rather than dividing by zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where the bootstrap needs it: `import prefillq` stays light
    import numpy as np

DEFAULT_BOOTSTRAP_SAMPLES = 10_000
#: From this many independent units (rounds, or machines with ``groups``) on, the bootstrap is used;
#: below it the t-interval. Evidence (benchmarks/stats_calibration.py, 4,000 experiments, SE 0.35
#: points): the expanded bootstrap's false-positive rate is 25% at 3 rounds (it cannot reach past
#: the data), 8% at 5, 5.6-5.7% at 10, 4.7-5.5% at 20 and 4.9-5.8% at 30, while the t-interval is
#: 3.9-5.7% everywhere. 30 leaves margin; below it the bootstrap has nothing to add.
BOOTSTRAP_MIN_UNITS = 30

_NORMAL = NormalDist()


# ---------------------------------------------------------------------------------------------------
# Student-t distribution (numpy has none and scipy is not a dependency)


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function, evaluated by the modified Lentz method.

    Converges quickly for ``x < (a + 1) / (a + b + 2)``; the caller uses the symmetry
    ``I_x(a, b) = 1 - I_{1-x}(b, a)`` for the other side.
    """
    tiny = 1e-300
    numerator = 1.0
    denominator = 1.0 - (a + b) * x / (a + 1.0)
    denominator = 1.0 / (denominator if abs(denominator) > tiny else tiny)
    result = denominator
    for m in range(1, 1000):
        for coefficient in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            denominator = 1.0 + coefficient * denominator
            denominator = 1.0 / (denominator if abs(denominator) > tiny else tiny)
            numerator = 1.0 + coefficient / numerator
            numerator = numerator if abs(numerator) > tiny else tiny
            step = numerator * denominator
            result *= step
        if abs(step - 1.0) < 1e-15:
            return result
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float, one_minus_x: float | None = None) -> float:
    """``I_x(a, b)``, the CDF of a Beta(a, b) variable at ``x``.

    ``one_minus_x`` may be passed when it is known more precisely than ``1 - x`` (for the t tails).
    """
    y = 1.0 - x if one_minus_x is None else one_minus_x
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, y) / b


def t_two_sided_tail(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom (the two-sided p-value)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df!r}")
    if math.isinf(t):
        return 0.0
    t2 = t * t
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * t_two_sided_tail(t, df)
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF).

    Cached: ``compare_paired`` asks for the same few (confidence, n) pairs again and again.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile needs p in (0, 1), got {p!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    target = 2.0 * (1.0 - p)  # two-sided tail at the quantile
    low, high = 0.0, 1.0
    while t_two_sided_tail(high, df) > target:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if t_two_sided_tail(middle, df) > target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


# ---------------------------------------------------------------------------------------------------
# The comparison


@dataclass(frozen=True)
class PairedComparison:
    """Treatment vs baseline on one metric: mean paired log-ratio with an interval and a p-value.

    ``change``/``ci_low``/``ci_high`` are relative changes (``exp(log_ratio) - 1``).
    ``n`` rounds were used; ``skipped`` rounds had a missing or non-positive value on either side.
    ``p_value`` is two-sided for "no change" (None with fewer than two rounds); ``method`` says how the
    interval was computed: ``"t"``, ``"bootstrap"``, ``"cluster-t"``, ``"cluster-bootstrap"`` or
    ``"none"``.
    """

    n: int
    mean_log_ratio: float
    ci_low_log_ratio: float
    ci_high_log_ratio: float
    confidence: float
    skipped: int = 0
    p_value: float | None = None
    method: str = "none"

    @property
    def ratio(self) -> float:
        return math.exp(self.mean_log_ratio)

    @property
    def change(self) -> float:
        return math.expm1(self.mean_log_ratio)

    @property
    def ci_low(self) -> float:
        return math.expm1(self.ci_low_log_ratio)

    @property
    def ci_high(self) -> float:
        return math.expm1(self.ci_high_log_ratio)

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies entirely on one side of "no change"."""
        return self.n >= 2 and (self.ci_low_log_ratio > 0 or self.ci_high_log_ratio < 0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ratio=self.ratio, change=self.change, ci_low=self.ci_low, ci_high=self.ci_high,
                    excludes_zero=self.excludes_zero)
        return data


def paired_log_ratios(baseline: Sequence[float | None], treatment: Sequence[float | None]) -> list[float | None]:
    """``ln(treatment_i / baseline_i)`` per round; None where either value is missing or not positive."""
    if len(baseline) != len(treatment):
        raise ValueError(f"paired data needs equal lengths, got {len(baseline)} and {len(treatment)}")
    result: list[float | None] = []
    for a, b in zip(baseline, treatment, strict=True):
        if a is None or b is None or not (a > 0 and b > 0) or not (math.isfinite(a) and math.isfinite(b)):
            result.append(None)
        else:
            result.append(math.log(b / a))
    return result


def _cluster_indices(groups: Sequence[Any]) -> list[list[int]]:
    """Positions of each group's members, groups in order of first appearance."""
    members: dict[Any, list[int]] = {}
    for index, label in enumerate(groups):
        members.setdefault(label, []).append(index)
    return list(members.values())


def bootstrap_means(
    values: Sequence[float],
    *,
    groups: Sequence[Any] | None = None,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """``samples`` bootstrap replicates of the mean of ``values``, deterministic for a given ``seed``.

    Without groups each replicate resamples the values. With groups it is two-stage: it resamples
    groups (machines) and then the values inside each chosen group. That counts the round noise twice
    (a machine's mean already carries it), so :func:`compare_paired` does not use it: it bootstraps
    the per-machine means instead. Vectorised and computed in blocks so that many rounds do not need
    one huge index array.
    """
    import numpy as np

    if not values:
        raise ValueError("bootstrap needs at least one value")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    if groups is None:
        block = max(1, 2_000_000 // len(data))
        for start in range(0, samples, block):
            count = min(block, samples - start)
            means[start:start + count] = data[rng.integers(0, len(data), size=(count, len(data)))].mean(axis=1)
        return means
    if len(groups) != len(values):
        raise ValueError("groups must have one label per value")
    clusters = _cluster_indices(groups)
    order = np.concatenate([np.asarray(ix) for ix in clusters])
    ordered = data[order]
    sizes = np.asarray([len(ix) for ix in clusters])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n_clusters, widest = len(clusters), int(sizes.max())
    block = max(1, 2_000_000 // (n_clusters * widest))
    slots = np.arange(widest)
    for start in range(0, samples, block):
        count = min(block, samples - start)
        chosen = rng.integers(0, n_clusters, size=(count, n_clusters))
        chosen_sizes = sizes[chosen][..., None]
        within = rng.integers(0, np.broadcast_to(chosen_sizes, (count, n_clusters, widest)))
        picked = ordered[offsets[chosen][..., None] + within]
        totals = np.where(slots < chosen_sizes, picked, 0.0).sum(axis=(1, 2))
        means[start:start + count] = totals / chosen_sizes.sum(axis=(1, 2))
    return means


def bootstrap_mean_interval(
    values: Sequence[float],
    *,
    groups: Sequence[Any] | None = None,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Plain percentile bootstrap interval of the mean of ``values`` (see :func:`bootstrap_means`).

    Kept for callers that want the raw bootstrap; :func:`compare_paired` uses a calibrated interval.
    With one value (or one value per group and one group) the interval is that value.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    import numpy as np

    means = bootstrap_means(values, groups=groups, samples=samples, seed=seed)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def _t_interval(mean: float, standard_error: float, df: int, confidence: float) -> tuple[float, float, float]:
    """``(low, high, p_value)`` of a t-interval; a zero standard error gives a point interval."""
    if standard_error == 0.0 or not math.isfinite(standard_error):
        return mean, mean, 1.0 if mean == 0.0 else 0.0
    half_width = t_quantile((1.0 + confidence) / 2.0, df) * standard_error
    return mean - half_width, mean + half_width, t_two_sided_tail(mean / standard_error, df)


def _expanded_bootstrap(means: np.ndarray, units: int, confidence: float) -> tuple[float, float, float]:
    """``(low, high, p_value)`` of the expanded percentile bootstrap over ``units`` independent units.

    The tail probability is shrunk from ``(1-c)/2`` to ``Φ(-sqrt(k/(k-1)) · t_{(1+c)/2, k-1})`` so that
    on normal data the interval is as wide as the t-interval. The interval ends are order statistics
    and the p-value is the two-sided share of replicates on the far side of zero, mapped back through
    the same expansion, so the interval excludes zero exactly when ``p_value < 1 - confidence``.
    """
    import numpy as np

    df = units - 1
    inflation = math.sqrt(units / df)
    tail = _NORMAL.cdf(-inflation * t_quantile((1.0 + confidence) / 2.0, df))
    ordered = np.sort(means)
    samples = len(ordered)
    k = min(math.floor(samples * tail), samples - 1)
    low, high = float(ordered[k]), float(ordered[samples - 1 - k])
    far_side = min(int(np.count_nonzero(ordered <= 0.0)), int(np.count_nonzero(ordered >= 0.0)))
    raw = min(1.0, max(2.0 * far_side, 1.0) / samples)  # below 1/samples is below the resolution
    if raw >= 1.0:
        return low, high, 1.0
    return low, high, t_two_sided_tail(-_NORMAL.inv_cdf(raw / 2.0) / inflation, df)


def compare_paired(
    baseline: Sequence[float | None],
    treatment: Sequence[float | None],
    *,
    groups: Sequence[Any] | None = None,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison | None:
    """Mean paired log-ratio of ``treatment`` over ``baseline`` with a calibrated interval over rounds.

    Rounds where either value is missing or not positive are skipped (and counted); None when no
    round is usable. ``groups`` labels the machine of each round; with one distinct label it changes
    nothing. ``samples`` and ``seed`` only matter when the bootstrap is used (see the module notes).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    ratios = paired_log_ratios(baseline, treatment)
    if groups is not None and len(groups) != len(ratios):
        raise ValueError(f"groups must have one label per round, got {len(groups)} for {len(ratios)}")
    keep = [i for i, r in enumerate(ratios) if r is not None]
    if not keep:
        return None
    values: list[float] = [ratios[i] for i in keep]  # type: ignore[misc]
    n, skipped = len(values), len(ratios) - len(values)
    if n < 2:
        mean = math.fsum(values) / n
        return PairedComparison(n=n, mean_log_ratio=mean, ci_low_log_ratio=mean, ci_high_log_ratio=mean,
                                confidence=confidence, skipped=skipped, p_value=None, method="none")
    clusters = [] if groups is None else _cluster_indices([groups[i] for i in keep])
    if len(clusters) >= 2:
        # The machine is the independent unit: one mean per machine, each machine counting once.
        # (Weighting machines by their rounds and using a cluster-robust error instead is
        # anti-conservative when one machine ran most rounds: 10-15% false positives for 1+1+8.)
        units = [math.fsum(values[i] for i in ix) / len(ix) for ix in clusters]
        prefix = "cluster-"
    else:
        units, prefix = values, ""
    k = len(units)
    mean = math.fsum(units) / k
    if k >= BOOTSTRAP_MIN_UNITS:
        low, high, p_value = _expanded_bootstrap(bootstrap_means(units, samples=samples, seed=seed), k, confidence)
        method = prefix + "bootstrap"
    else:
        # Plain Python: a handful of values, called once per metric and pair (and thousands of times
        # by the calibration simulations), where numpy's per-call overhead would dominate.
        standard_error = math.sqrt(math.fsum((v - mean) ** 2 for v in units) / (k - 1) / k)
        low, high, p_value = _t_interval(mean, standard_error, k - 1, confidence)
        method = prefix + "t"
    return PairedComparison(n=n, mean_log_ratio=mean, ci_low_log_ratio=min(low, mean),
                            ci_high_log_ratio=max(high, mean), confidence=confidence, skipped=skipped,
                            p_value=p_value, method=method)
