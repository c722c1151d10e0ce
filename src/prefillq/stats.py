"""Paired comparison of two policies over repetitions (SPEC §6).

Each repetition (round) runs both policies on the identical schedule, so the rounds pair up. For a
metric with per-round values ``a_i`` (baseline) and ``b_i`` (treatment) the effect is the mean of
the paired log-ratios ``d_i = ln(b_i / a_i)``; ``exp(mean) - 1`` is the relative change (-0.8 = an
80% cut). The 95% interval is a percentile bootstrap that resamples whole rounds (the unit that is
independent), seeded so the same data always gives the same interval. When rounds ran on several
machines, pass ``groups``: the bootstrap then resamples machines first and rounds within each chosen
machine, so machine-to-machine spread widens the interval as it should.

With fewer than two usable rounds there is no spread to resample: the interval collapses onto the
point estimate and ``n`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_BOOTSTRAP_SAMPLES = 10_000


@dataclass(frozen=True)
class PairedComparison:
    """Treatment vs baseline on one metric: mean paired log-ratio with a bootstrap interval.

    ``change``/``ci_low``/``ci_high`` are relative changes (``exp(log_ratio) - 1``).
    ``n`` rounds were used; ``skipped`` rounds had a missing or non-positive value on either side.
    """

    n: int
    mean_log_ratio: float
    ci_low_log_ratio: float
    ci_high_log_ratio: float
    confidence: float
    skipped: int = 0

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


def bootstrap_mean_interval(
    values: Sequence[float],
    *,
    groups: Sequence[Any] | None = None,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``, resampling values (or groups, then values).

    Deterministic for a given ``seed``. With one value (or one value per group and one group) the
    interval is that value.
    """
    import numpy as np

    if not values:
        raise ValueError("bootstrap needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    if groups is None:
        picks = rng.integers(0, len(data), size=(samples, len(data)))
        means = data[picks].mean(axis=1)
    else:
        if len(groups) != len(values):
            raise ValueError("groups must have one label per value")
        members: dict[Any, list[int]] = {}
        for index, label in enumerate(groups):
            members.setdefault(label, []).append(index)
        clusters = [np.asarray(ix) for ix in members.values()]
        means = np.empty(samples)
        for s in range(samples):
            chosen = rng.integers(0, len(clusters), size=len(clusters))
            resampled = [data[clusters[c][rng.integers(0, len(clusters[c]), size=len(clusters[c]))]] for c in chosen]
            means[s] = np.concatenate(resampled).mean()
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def compare_paired(
    baseline: Sequence[float | None],
    treatment: Sequence[float | None],
    *,
    groups: Sequence[Any] | None = None,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison | None:
    """Mean paired log-ratio of ``treatment`` over ``baseline`` with a bootstrap interval over rounds.

    Rounds where either value is missing or not positive are skipped (and counted); None when no
    round is usable.
    """
    ratios = paired_log_ratios(baseline, treatment)
    keep = [i for i, r in enumerate(ratios) if r is not None]
    if not keep:
        return None
    values = [ratios[i] for i in keep]
    kept_groups = None if groups is None else [groups[i] for i in keep]
    mean = sum(values) / len(values)  # type: ignore[arg-type]
    low, high = bootstrap_mean_interval(values, groups=kept_groups, samples=samples,  # type: ignore[arg-type]
                                        confidence=confidence, seed=seed)
    return PairedComparison(n=len(values), mean_log_ratio=mean, ci_low_log_ratio=min(low, mean),
                            ci_high_log_ratio=max(high, mean), confidence=confidence,
                            skipped=len(ratios) - len(values))
