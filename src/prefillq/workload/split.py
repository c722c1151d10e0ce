"""The short/long split of a trace: the threshold tune recommends and compare splits traces at.

Smooth the histogram of log2 prompt lengths with a Gaussian kernel density estimate (KDE) and look for a
*clear valley*: a local minimum whose density is at most :data:`VALLEY_DEPTH_MAX` of the smaller of the
two peaks it separates, with at least :data:`MIN_LANE_SHARE` of the requests on each side. The deepest
such valley separates the short cluster from the long tail; the threshold goes near the *upper edge of
the short cluster* (the :data:`EDGE_QUANTILE` of the prompt lengths below the valley), moved up to the
roundest number (a multiple of the largest power of two) between the edge and the smaller of 1.5x the
edge and the valley. Without a clear valley, fall back to the 80th percentile (the middle of the
70th-85th percentile range SPEC §3.5 recommends as a start).

A request is short when ``prompt_tokens <= threshold`` (:func:`prompt_class`), the rule
``short_request_first`` sorts its lanes by, so a table split here lines up with the policy's lanes.
This module sits in ``workload/`` so that both ``sim/`` (through the trace reader) and ``tune/`` use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefillq.metrics import percentile
from prefillq.workload.scenarios import WorkloadError

VALLEY_DEPTH_MAX = 0.5
"""A valley is clear when its density is at most this fraction of the smaller neighbouring peak."""
MIN_LANE_SHARE = 0.05
"""Each side of a valley must hold at least this share of requests (else the split does nothing)."""
MIN_LANE_REQUESTS = 10
"""... and at least this many requests."""
WIGGLE_RATIO = 0.95
"""Dips shallower than this (density above 95% of the smaller peak) are noise, not valleys."""
MIN_REQUESTS_FOR_SHAPE = 30
"""Below this many requests the histogram has no trustworthy shape; use the percentile fallback."""
EDGE_QUANTILE = 0.995
"""The short cluster's upper edge: this quantile of the prompt lengths at or below the valley."""
FALLBACK_PERCENTILE = 80.0
"""Fallback threshold: the middle of the 70th-85th percentile range of SPEC §3.5 ..."""
FALLBACK_ROUNDING_BAND = (75.0, 85.0)
"""... rounded to a round number only when one lies between these percentiles."""


@dataclass
class ThresholdChoice:
    """The chosen short/long split and the evidence for it."""

    threshold: int
    method: str                                # "kde_valley" | "percentile_fallback_p80" | "single_length"
    reason: str                                # one sentence, plain language
    bimodal: bool                              # a clear valley was found
    threshold_percentile: float                # share of requests at or below the threshold, in %
    bandwidth_log2: float                      # KDE bandwidth on log2(prompt tokens)
    valley_tokens: float | None = None         # the chosen (or, in a fallback, the deepest) valley
    valley_depth_ratio: float | None = None    # density at the valley / the smaller neighbouring peak
    short_peak_tokens: float | None = None
    long_peak_tokens: float | None = None
    short_cluster_edge_tokens: float | None = None
    percentiles: dict[str, float] = field(default_factory=dict)   # p70/p75/p80/p85 of prompt tokens
    valleys: list[dict[str, float]] = field(default_factory=list)  # every local minimum examined


def prompt_class(prompt_tokens: int, threshold: int) -> str:
    """``"short"`` when ``prompt_tokens <= threshold``, else ``"long"`` (short_request_first's rule)."""
    return "short" if prompt_tokens <= threshold else "long"


def _kde_log2(lengths: Sequence[int]) -> tuple[Any, Any, float]:
    """Gaussian KDE of log2(prompt tokens) on a regular grid (binned, then convolved: O(n + grid)).

    Bandwidth: Silverman's rule of thumb, which over-smooths multi-modal data a little; that is the safe
    direction here (a valley it still shows is a real one).
    """
    import numpy as np

    x = np.log2(np.asarray(lengths, dtype=float))
    n = x.size
    spread = float(np.std(x))
    iqr = percentile(x, 75) - percentile(x, 25)
    scale = min(spread, iqr / 1.34) if iqr > 0 else spread
    bandwidth = max(0.9 * scale * n ** -0.2, 0.02)
    step = bandwidth / 8.0
    low, high = float(x.min()) - 4 * bandwidth, float(x.max()) + 4 * bandwidth
    size = min(math.ceil((high - low) / step) + 1, 8192)
    grid = np.linspace(low, high, size)
    step = float(grid[1] - grid[0])
    # Linear binning onto the grid keeps the estimate smooth for quantized lengths.
    position = (x - low) / step
    left = np.floor(position).astype(int)
    weight_right = position - left
    counts = np.zeros(size)
    np.add.at(counts, left, 1.0 - weight_right)
    np.add.at(counts, np.minimum(left + 1, size - 1), weight_right)
    half = math.ceil(4 * bandwidth / step)
    offsets = np.arange(-half, half + 1) * step
    kernel = np.exp(-0.5 * (offsets / bandwidth) ** 2) / (bandwidth * math.sqrt(2 * math.pi))
    density = np.convolve(counts, kernel, mode="same") / n
    return grid, density, bandwidth


def _local_minima(lengths: Any, grid: Any, density: Any) -> list[dict[str, float]]:
    """Every local minimum of the density, with its neighbouring peaks and the requests at or below it."""
    import numpy as np

    n = lengths.size
    sorted_x = np.sort(np.log2(lengths))
    valleys: list[dict[str, float]] = []
    for i in range(1, len(grid) - 1):
        if not (density[i] < density[i - 1] and density[i] <= density[i + 1]):
            continue
        left_peak = int(np.argmax(density[:i]))
        right_peak = i + 1 + int(np.argmax(density[i + 1:]))
        smaller_peak = min(float(density[left_peak]), float(density[right_peak]))
        if smaller_peak <= 0:
            continue
        below = int(np.searchsorted(sorted_x, grid[i], side="right"))
        valleys.append({
            "index": i,
            "tokens": float(2 ** grid[i]),
            "depth_ratio": float(density[i] / smaller_peak),
            "short_share": below / n,
            "left_peak_index": left_peak,
            "right_peak_index": right_peak,
            "short_count": below,
        })
    return valleys


def _roundest_in(low: float, high: float) -> int | None:
    """The "roundest" integer in [low, high]: a multiple of the largest possible power of two
    (the smallest such multiple), e.g. 512 in [339, 508] -> 384, [524, 595] -> 576."""
    lo, hi = math.ceil(max(1.0, low)), math.floor(high)
    if lo > hi:
        return None
    power = 1 << max(0, int(math.log2(hi)))
    while power >= 1:
        candidate = -(-lo // power) * power
        if candidate <= hi:
            return int(candidate)
        power >>= 1
    return None


def _round_number_nearest(value: float, low: float, high: float) -> int | None:
    """The round token count (2^k or 1.5 * 2^k) nearest to value within [low, high], if any."""
    candidates = []
    for k in range(0, 40):
        for candidate in (2 ** k, 3 * 2 ** (k - 1) if k >= 1 else None):
            if candidate is not None and low <= candidate <= high:
                candidates.append(int(candidate))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (abs(math.log2(c) - math.log2(value)), c))


def _share_at_or_below(lengths: Any, threshold: float) -> float:
    """Share of the prompt lengths at or below ``threshold``, in %."""
    import numpy as np

    return float(np.mean(lengths <= threshold) * 100.0)


def split_threshold(prompt_lengths: Sequence[int], *,
                    error: type[Exception] = WorkloadError) -> ThresholdChoice:
    """The short/long threshold for ``prompt_lengths`` (SPEC §3.5; see the module docstring).

    Bad input (no lengths, a length under 1 token) raises ``error``.
    """
    import numpy as np

    if isinstance(prompt_lengths, np.ndarray) and prompt_lengths.dtype.kind in "iu":
        lengths = prompt_lengths.astype(float)  # a trace's column: no Python int per request
    else:
        lengths = np.asarray([int(v) for v in prompt_lengths], dtype=float)
    if lengths.size == 0:
        raise error("no prompt lengths to tune on")
    if np.any(lengths < 1):
        raise error("prompt lengths must be >= 1 token")
    n = lengths.size
    percentiles = {f"p{q}": percentile(lengths, q) for q in (50, 70, 75, 80, 85, 90, 95)}

    if float(lengths.min()) == float(lengths.max()):
        threshold = int(lengths[0])
        return ThresholdChoice(
            threshold=threshold, method="single_length", bimodal=False, bandwidth_log2=0.0,
            threshold_percentile=100.0, percentiles=percentiles,
            reason=(f"every prompt has {threshold} tokens: there is nothing to split, so a short-first "
                    "policy cannot help; the threshold is that length (all requests short)"),
        )

    grid, density, bandwidth = _kde_log2(lengths)
    valleys = _local_minima(lengths, grid, density)
    min_side = max(MIN_LANE_REQUESTS, MIN_LANE_SHARE * n)
    meaningful = [v for v in valleys if min(v["short_count"], n - v["short_count"]) >= min_side
                  and v["depth_ratio"] < WIGGLE_RATIO]
    usable = [v for v in meaningful if v["depth_ratio"] <= VALLEY_DEPTH_MAX]
    reported = [{k: round(v[k], 4) for k in ("tokens", "depth_ratio", "short_share")} for v in valleys
                if 0.0 < v["short_share"] < 1.0]
    if usable and n >= MIN_REQUESTS_FOR_SHAPE:
        best = min(usable, key=lambda v: (v["depth_ratio"], -v["short_share"]))
        return _valley_threshold(lengths, grid, best, bandwidth, percentiles, reported)
    deepest = min(meaningful, key=lambda v: v["depth_ratio"], default=None)
    lopsided = [v for v in valleys if v["depth_ratio"] <= VALLEY_DEPTH_MAX and 0.0 < v["short_share"] < 1.0]
    return _fallback_threshold(lengths, deepest, lopsided, bandwidth, percentiles, reported)


def _valley_threshold(lengths: Any, grid: Any, best: dict[str, float], bandwidth: float,
                      percentiles: dict[str, float], reported: list[dict[str, float]]) -> ThresholdChoice:
    """The threshold at the upper edge of the short cluster below the clear valley ``best``."""
    i = int(best["index"])
    # The upper edge of the short cluster, from the data (the KDE would smear it by its bandwidth):
    # the EDGE_QUANTILE of the prompts at or below the valley.
    below_valley = lengths[lengths <= 2 ** grid[i]]
    edge_tokens = percentile(below_valley, EDGE_QUANTILE * 100.0)
    valley_tokens = float(best["tokens"])
    # A round number close above the edge (within 1.5x of it) and still inside the valley.
    rounded = _roundest_in(edge_tokens, min(valley_tokens, 1.5 * edge_tokens))
    threshold = rounded if rounded is not None else max(1, math.ceil(edge_tokens))
    short_peak = float(2 ** grid[int(best["left_peak_index"])])
    long_peak = float(2 ** grid[int(best["right_peak_index"])])
    reason = (
        f"the prompt-length histogram has a clear valley at about {valley_tokens:,.0f} tokens "
        f"(density there is {best['depth_ratio']:.0%} of the smaller of the two peaks it separates, "
        f"at ~{short_peak:,.0f} and ~{long_peak:,.0f} tokens); the threshold sits at the upper edge of "
        f"the short cluster (~{edge_tokens:,.0f} tokens), rounded to {threshold:,}"
    )
    return ThresholdChoice(
        threshold=threshold, method="kde_valley", reason=reason, bimodal=True,
        threshold_percentile=_share_at_or_below(lengths, threshold), bandwidth_log2=bandwidth,
        valley_tokens=valley_tokens, valley_depth_ratio=float(best["depth_ratio"]),
        short_peak_tokens=short_peak, long_peak_tokens=long_peak, short_cluster_edge_tokens=edge_tokens,
        percentiles=percentiles, valleys=reported,
    )


def _fallback_threshold(lengths: Any, deepest: dict[str, float] | None, lopsided: list[dict[str, float]],
                        bandwidth: float, percentiles: dict[str, float],
                        reported: list[dict[str, float]]) -> ThresholdChoice:
    """No clear valley: the 80th percentile, rounded when a round number lies in the 75th-85th band."""
    n = lengths.size
    p80 = percentiles[f"p{int(FALLBACK_PERCENTILE)}"]
    band_low, band_high = (percentiles[f"p{int(q)}"] for q in FALLBACK_ROUNDING_BAND)
    rounded = _round_number_nearest(p80, band_low, band_high)
    threshold = rounded if rounded is not None else round(p80)
    if n < MIN_REQUESTS_FOR_SHAPE:
        why = f"only {n} requests: too few to trust the shape of the histogram"
    elif deepest is not None:
        why = (f"no clear valley: the deepest dip of the smoothed histogram (at ~{deepest['tokens']:,.0f} "
               f"tokens) still has {deepest['depth_ratio']:.0%} of the density of the smaller peak beside "
               f"it (a clear valley needs {VALLEY_DEPTH_MAX:.0%} or less)")
    elif lopsided:
        why = (f"the only clear valleys (e.g. at ~{lopsided[0]['tokens']:,.0f} tokens) leave fewer than "
               f"{MIN_LANE_SHARE:.0%} of the requests on one side, so splitting there would do nothing")
    else:
        why = "the smoothed histogram of log prompt lengths has a single peak (no valley between clusters)"
    rounding = (f", rounded to {threshold:,} (a round number between the 75th and 85th percentiles)"
                if rounded is not None and rounded != round(p80) else "")
    reason = (f"{why}; falling back to the 80th percentile, the middle of the 70th-85th percentile range "
              f"that is the usual start without a model of the traffic: {p80:,.0f} tokens{rounding}, so about a "
              "fifth of the requests, the longest, go to the long lane")
    return ThresholdChoice(
        threshold=threshold, method="percentile_fallback_p80", reason=reason, bimodal=False,
        threshold_percentile=_share_at_or_below(lengths, threshold), bandwidth_log2=bandwidth,
        valley_tokens=None if deepest is None else float(deepest["tokens"]),
        valley_depth_ratio=None if deepest is None else float(deepest["depth_ratio"]),
        percentiles=percentiles, valleys=reported,
    )
