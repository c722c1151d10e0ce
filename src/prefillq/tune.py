"""``prefillq tune``: choose ``threshold``, ``long_max_wait_ms`` and a policy from a request trace.

The recipe is SPEC §3.5, automated with the simulator:

1. **threshold** — smooth the histogram of log2 prompt lengths with a Gaussian kernel density estimate
   (KDE) and look for a *clear valley*: a local minimum whose density is at most
   :data:`VALLEY_DEPTH_MAX` of the smaller of the two peaks it separates, with at least
   :data:`MIN_LANE_SHARE` of the requests on each side. The deepest such valley separates the short
   cluster from the long tail; the threshold goes near the *upper edge of the short cluster* (the
   :data:`EDGE_QUANTILE` of the prompt lengths below the valley), moved up to the roundest number
   (a multiple of the largest power of two) between the edge and the smaller of 1.5x the edge and the
   valley. Without a clear valley, fall back to the 80th percentile (the middle of the
   70th-85th percentile range §3.5 recommends as a start).
2. **long_max_wait_ms** — simulate strict short-first (``long_max_wait_ms = 0``), take the P90/P95 of the
   queue waits of long requests (``W_normal``; P95 is the base) and pick a value in
   ``[W_normal, W_slo]``: a quarter of the way from ``W_slo`` for ``favor="short"``, a quarter of the way
   from ``W_normal`` for ``favor="long"``. If ``W_normal >= W_slo`` the threshold or the capacity is the
   problem, not this knob; the result says so, carries the evidence, and recommends ``W_normal`` (a gate
   at ``W_slo`` would fire for nearly every long request and turn short-first into long-first).
3. **policy** — simulate ``default``, ``promote_shortest``, ``hrrn`` and the tuned
   ``short_request_first`` and recommend one (rules in :func:`choose_policy`).

This module holds the logic only (no typer); ``prefillq.cli.tune`` is the command. numpy is imported
lazily, matplotlib only when a histogram is drawn.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

# --- the numbers the recipe uses, in one place ------------------------------------------------

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
DEFAULT_W_SLO_MS = 2000.0
"""Default ``W_slo``: the most extra queueing a long request may suffer. 2 s is the time-to-first-token
limit of MLPerf Inference's Llama-2-70B server scenario (``llama2-70b.Server.ttft_latency = 2000`` in
mlcommons/inference ``loadgen/mlperf.conf``), a widely used interactive-serving bound; it is also the
``long_max_wait_ms`` of the vLLM Ascend configuration example (SPEC §4)."""
FAVOR_POSITION = {"short": 0.75, "long": 0.25}
"""Where in ``[W_normal, W_slo]`` the wait goes: fraction of the way from W_normal towards W_slo."""
NEAR_SLO_FRACTION = 0.8
"""``W_normal`` above this fraction of ``W_slo`` is "near": the interval leaves little room."""
SAME_RESULT_TOLERANCE = 0.05
"""Policies whose short TTFT P95 is within 5% (or 5 ms) of each other are treated as equal."""
SAME_RESULT_ABS_MS = 5.0
NO_VALLEY_MARGIN = 0.25
"""Without a clear valley, a threshold-free policy within 25% of short_request_first's short TTFT P95 wins."""
THROUGHPUT_LOSS_MAX = 0.03
"""A policy that loses more than 3% of default's output throughput is not recommended."""
SIM_REQUEST_TARGET = 4000
"""Windows are sized to hold about this many requests, so that the five simulations finish quickly."""
POLICIES_SIMULATED = ("default", "promote_shortest", "hrrn", "short_request_first")
LIGHTLLM_STRATEGIES = ("default", "promote_shortest", "hrrn")


class TuneError(ValueError):
    """Input the tuner cannot work with (the message says what and where)."""


# --- step 1: the threshold ---------------------------------------------------------------------

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


@dataclass
class LaneShares:
    """How a threshold splits the trace: share of requests and of prefill tokens in each lane."""

    threshold: int
    short_requests: int
    long_requests: int
    short_request_share: float
    long_request_share: float
    short_token_share: float
    long_token_share: float
    short_prompt_p50: float | None
    long_prompt_p50: float | None


def _percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def _kde_log2(lengths: Sequence[int]) -> tuple[Any, Any, float]:
    """Gaussian KDE of log2(prompt tokens) on a regular grid (binned, then convolved: O(n + grid)).

    Bandwidth: Silverman's rule of thumb, which over-smooths multi-modal data a little; that is the safe
    direction here (a valley it still shows is a real one).
    """
    import numpy as np

    x = np.log2(np.asarray(lengths, dtype=float))
    n = x.size
    spread = float(np.std(x))
    iqr = float(np.subtract(*np.percentile(x, [75, 25])))
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


def choose_threshold(prompt_lengths: Sequence[int]) -> ThresholdChoice:
    """Pick the short/long threshold for ``prompt_lengths`` (SPEC §3.5); see the module docstring."""
    import numpy as np

    lengths = np.asarray([int(v) for v in prompt_lengths], dtype=float)
    if lengths.size == 0:
        raise TuneError("no prompt lengths to tune on")
    if np.any(lengths < 1):
        raise TuneError("prompt lengths must be >= 1 token")
    n = lengths.size
    percentiles = {f"p{q}": _percentile(lengths, q) for q in (50, 70, 75, 80, 85, 90, 95)}

    def percentile_of(threshold: float) -> float:
        return float(np.mean(lengths <= threshold) * 100.0)

    if float(lengths.min()) == float(lengths.max()):
        threshold = int(lengths[0])
        return ThresholdChoice(
            threshold=threshold, method="single_length", bimodal=False, bandwidth_log2=0.0,
            threshold_percentile=100.0, percentiles=percentiles,
            reason=(f"every prompt has {threshold} tokens: there is nothing to split, so a short-first "
                    "policy cannot help; the threshold is that length (all requests short)"),
        )

    grid, density, bandwidth = _kde_log2(lengths)
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
    min_side = max(MIN_LANE_REQUESTS, MIN_LANE_SHARE * n)
    meaningful = [v for v in valleys if min(v["short_count"], n - v["short_count"]) >= min_side
                  and v["depth_ratio"] < WIGGLE_RATIO]
    usable = [v for v in meaningful if v["depth_ratio"] <= VALLEY_DEPTH_MAX]
    reported = [{k: round(v[k], 4) for k in ("tokens", "depth_ratio", "short_share")} for v in valleys
                if 0.0 < v["short_share"] < 1.0]
    deepest = min(meaningful, key=lambda v: v["depth_ratio"], default=None)
    lopsided = [v for v in valleys if v["depth_ratio"] <= VALLEY_DEPTH_MAX and 0.0 < v["short_share"] < 1.0]

    if usable and n >= MIN_REQUESTS_FOR_SHAPE:
        best = min(usable, key=lambda v: (v["depth_ratio"], -v["short_share"]))
        i = int(best["index"])
        left_peak = int(best["left_peak_index"])
        # The upper edge of the short cluster, from the data (the KDE would smear it by its bandwidth):
        # the EDGE_QUANTILE of the prompts at or below the valley.
        below_valley = lengths[lengths <= 2 ** grid[i]]
        edge_tokens = float(np.quantile(below_valley, EDGE_QUANTILE))
        valley_tokens = float(best["tokens"])
        # A round number close above the edge (within 1.5x of it) and still inside the valley.
        rounded = _roundest_in(edge_tokens, min(valley_tokens, 1.5 * edge_tokens))
        threshold = rounded if rounded is not None else max(1, math.ceil(edge_tokens))
        short_peak = float(2 ** grid[left_peak])
        long_peak = float(2 ** grid[int(best["right_peak_index"])])
        reason = (
            f"the prompt-length histogram has a clear valley at about {valley_tokens:,.0f} tokens "
            f"(density there is {best['depth_ratio']:.0%} of the smaller of the two peaks it separates, "
            f"at ~{short_peak:,.0f} and ~{long_peak:,.0f} tokens); the threshold sits at the upper edge of "
            f"the short cluster (~{edge_tokens:,.0f} tokens), rounded to {threshold:,}"
        )
        return ThresholdChoice(
            threshold=threshold, method="kde_valley", reason=reason, bimodal=True,
            threshold_percentile=percentile_of(threshold), bandwidth_log2=bandwidth,
            valley_tokens=valley_tokens, valley_depth_ratio=float(best["depth_ratio"]),
            short_peak_tokens=short_peak, long_peak_tokens=long_peak, short_cluster_edge_tokens=edge_tokens,
            percentiles=percentiles, valleys=reported,
        )

    # No clear valley: the percentile fallback.
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
              f"that SPEC §3.5 recommends as a start: {p80:,.0f} tokens{rounding}, so about a fifth of the "
              "requests, the longest, go to the long lane")
    return ThresholdChoice(
        threshold=threshold, method="percentile_fallback_p80", reason=reason, bimodal=False,
        threshold_percentile=percentile_of(threshold), bandwidth_log2=bandwidth,
        valley_tokens=None if deepest is None else float(deepest["tokens"]),
        valley_depth_ratio=None if deepest is None else float(deepest["depth_ratio"]),
        percentiles=percentiles, valleys=reported,
    )


def lane_shares(prompt_lengths: Sequence[int], threshold: int) -> LaneShares:
    """Share of requests and of prefill tokens on each side of ``threshold`` (``<= threshold`` is short)."""
    import numpy as np

    lengths = np.asarray(prompt_lengths, dtype=float)
    if lengths.size == 0:
        raise TuneError("no prompt lengths")
    short = lengths <= threshold
    total_tokens = float(lengths.sum())
    short_tokens = float(lengths[short].sum())
    n_short = int(short.sum())
    n_long = int(lengths.size - n_short)
    return LaneShares(
        threshold=int(threshold),
        short_requests=n_short,
        long_requests=n_long,
        short_request_share=n_short / lengths.size,
        long_request_share=n_long / lengths.size,
        short_token_share=short_tokens / total_tokens,
        long_token_share=1.0 - short_tokens / total_tokens,
        short_prompt_p50=float(np.median(lengths[short])) if n_short else None,
        long_prompt_p50=float(np.median(lengths[~short])) if n_long else None,
    )


# --- step 2: long_max_wait_ms ------------------------------------------------------------------

@dataclass
class WaitChoice:
    """The recommended ``long_max_wait_ms`` and how it was derived from the long requests' waits."""

    long_max_wait_ms: float
    w_normal_p90_ms: float
    w_normal_p95_ms: float
    w_normal_ms: float          # the base of the interval: the P95
    w_slo_ms: float
    favor: str
    long_requests_measured: int
    capacity_problem: bool      # W_normal >= W_slo: the threshold or the capacity is the problem;
                                # the recommendation is then W_normal (W_slo would turn short-first around)
    near_slo: bool              # W_normal close to W_slo (above NEAR_SLO_FRACTION of it)
    reason: str
    evidence: list[str] = field(default_factory=list)


def _round_wait_ms(value: float, low: float, high: float) -> float:
    """Round to 10 ms (50 ms above 1 s), staying inside [low, high] when the interval allows it."""
    step = 50.0 if value >= 1000.0 else 10.0
    rounded = round(value / step) * step
    if rounded < low:
        rounded = math.ceil(low / step) * step
    if rounded > high:
        rounded = math.floor(high / step) * step
    if rounded < low:  # the interval is narrower than a rounding step
        rounded = round(value, 1)
    return float(rounded)


def choose_long_max_wait(long_waits_s: Sequence[float], *, w_slo_ms: float = DEFAULT_W_SLO_MS,
                         favor: str = "short") -> WaitChoice:
    """Recommend ``long_max_wait_ms`` from the queue waits of long requests under strict short-first."""
    import numpy as np

    if favor not in FAVOR_POSITION:
        raise TuneError(f"favor must be 'short' or 'long', got {favor!r}")
    if not (isinstance(w_slo_ms, int | float) and math.isfinite(w_slo_ms) and w_slo_ms > 0):
        raise TuneError(f"the long-request SLO (W_slo) must be a positive number of ms, got {w_slo_ms!r}")
    waits_ms = np.asarray([float(w) * 1000.0 for w in long_waits_s], dtype=float)
    position = FAVOR_POSITION[favor]
    if waits_ms.size == 0:
        value = _round_wait_ms(position * w_slo_ms, 0.0, w_slo_ms)
        return WaitChoice(
            long_max_wait_ms=value, w_normal_p90_ms=0.0, w_normal_p95_ms=0.0, w_normal_ms=0.0,
            w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=0, capacity_problem=False,
            near_slo=False,
            reason=(f"no long request was simulated, so there is no W_normal to measure; {value:,.0f} ms is "
                    f"{position:.0%} of the way to W_slo = {w_slo_ms:,.0f} ms"),
        )
    p90 = float(np.percentile(waits_ms, 90))
    p95 = float(np.percentile(waits_ms, 95))
    w_normal = p95
    toward = ("closer to W_slo: short TTFT matters more" if favor == "short"
              else "closer to W_normal: fairness to long requests matters more")
    if w_normal >= w_slo_ms:
        value = _round_wait_ms(w_normal, w_normal, math.inf)
        reason = (
            f"under strict short-first the long requests already wait {p95:,.0f} ms at P95 "
            f"(P90 {p90:,.0f} ms), which is at or above W_slo = {w_slo_ms:,.0f} ms: no value of "
            "long_max_wait_ms can keep long waits inside the SLO without giving up short-first. The "
            "threshold or the capacity is the problem, not this knob. Setting it to W_slo would promote "
            "nearly every long request over the short ones (short-first would turn into long-first), so "
            f"the least harmful value is W_normal itself ({value:,.0f} ms): it keeps short-first and only "
            "lifts the slowest 5% of long requests. Raise the threshold or add capacity"
        )
        return WaitChoice(
            long_max_wait_ms=value, w_normal_p90_ms=p90, w_normal_p95_ms=p95, w_normal_ms=w_normal,
            w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=int(waits_ms.size),
            capacity_problem=True, near_slo=True, reason=reason,
        )
    raw = w_normal + position * (w_slo_ms - w_normal)
    value = _round_wait_ms(raw, w_normal, w_slo_ms)
    near = w_normal >= NEAR_SLO_FRACTION * w_slo_ms
    reason = (
        f"under strict short-first (long_max_wait_ms = 0) long requests waited {p90:,.0f} ms at P90 and "
        f"{p95:,.0f} ms at P95 (W_normal = P95); with W_slo = {w_slo_ms:,.0f} ms the useful range is "
        f"[{w_normal:,.0f}, {w_slo_ms:,.0f}] ms and --favor {favor} puts it {position:.0%} of the way "
        f"from W_normal to W_slo: {value:,.0f} ms ({toward}). Below W_normal the gate would fire in normal "
        "operation and undo short-first; above W_slo long requests could wait past their SLO"
    )
    if near:
        reason += (f". W_normal is already {w_normal / w_slo_ms:.0%} of W_slo: little room is left, so the "
                   "threshold or the capacity will soon be the limit rather than this knob")
    return WaitChoice(
        long_max_wait_ms=value, w_normal_p90_ms=p90, w_normal_p95_ms=p95, w_normal_ms=w_normal,
        w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=int(waits_ms.size),
        capacity_problem=False, near_slo=near, reason=reason,
    )


# --- step 3: the policy ------------------------------------------------------------------------

@dataclass
class PolicyChoice:
    policy: str
    reason: str
    excluded: dict[str, str] = field(default_factory=dict)   # policy -> why it was not eligible
    lightllm_strategy: str = "default"                       # best of LightLLM's three
    lightllm_reason: str = ""


def _metric(summary: dict[str, Any], key: str) -> float:
    value = summary.get(key)
    return math.inf if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= max(SAME_RESULT_ABS_MS, SAME_RESULT_TOLERANCE * max(abs(a), abs(b)))


def choose_policy(summaries: dict[str, dict[str, Any]], *, bimodal: bool,
                  w_slo_ms: float = DEFAULT_W_SLO_MS) -> PolicyChoice:
    """Recommend a policy from simulated summaries (keys of :func:`prefillq.metrics.summarize`).

    Rules, in order: a policy is *eligible* if it keeps at least 97% of default's output throughput and
    its long-request TTFT P95 exceeds default's by no more than ``W_slo``. Among eligible policies the
    lowest short-request TTFT P95 wins; results within 5% (or 5 ms) count as equal. If nothing beats
    default by more than that, keep ``default``. Among equals, prefer ``short_request_first`` when the
    histogram has a clear valley (the split fits the traffic) and ``hrrn`` when it has none (no threshold
    to go stale; starvation bounded by work done). Without a valley, ``short_request_first`` must also
    beat the threshold-free policies by more than :data:`NO_VALLEY_MARGIN`.
    """
    if "default" not in summaries:
        raise TuneError("choose_policy needs the default policy's summary as the baseline")
    base = summaries["default"]
    base_tp = _metric(base, "output_tokens_per_s")
    base_long = _metric(base, "long_ttft_p95_ms")
    excluded: dict[str, str] = {}
    eligible: list[str] = []
    for name, summary in summaries.items():
        tp = _metric(summary, "output_tokens_per_s")
        long_p95 = _metric(summary, "long_ttft_p95_ms")
        if name != "default" and math.isfinite(base_tp) and tp < (1 - THROUGHPUT_LOSS_MAX) * base_tp:
            excluded[name] = (f"loses {1 - tp / base_tp:.1%} of output throughput "
                              f"(limit {THROUGHPUT_LOSS_MAX:.0%})")
        elif name != "default" and math.isfinite(base_long) and long_p95 > base_long + w_slo_ms:
            excluded[name] = (f"long TTFT P95 {long_p95:,.0f} ms exceeds default's {base_long:,.0f} ms by "
                              f"more than W_slo = {w_slo_ms:,.0f} ms")
        else:
            eligible.append(name)

    def key(name: str) -> tuple[float, float]:
        return (_metric(summaries[name], "short_ttft_p95_ms"), _metric(summaries[name], "short_ttft_p50_ms"))

    best = min(eligible, key=key)
    base_short = key("default")[0]
    best_short = key(best)[0]
    preference = (["short_request_first", "hrrn", "promote_shortest"] if bimodal
                  else ["hrrn", "promote_shortest", "short_request_first"])
    lightllm = _lightllm_choice(summaries, eligible, preference)
    if best == "default" or _same(best_short, base_short):
        better_but_excluded = [name for name in excluded
                               if key(name)[0] < base_short and not _same(key(name)[0], base_short)]
        if better_but_excluded:
            listed = ", ".join(f"{name} ({key(name)[0]:,.0f} ms)" for name in better_but_excluded)
            reason = (f"{listed} would cut short TTFT P95 below default's {base_short:,.0f} ms, but at a cost "
                      "beyond the limits below; no policy within them does clearly better, so keep default "
                      "(FCFS), and look at capacity")
        else:
            reason = (f"no policy predicts a short TTFT P95 clearly better than default's {base_short:,.0f} ms "
                      f"(best: {best} at {best_short:,.0f} ms, within {SAME_RESULT_TOLERANCE:.0%} or "
                      f"{SAME_RESULT_ABS_MS:g} ms): the waiting queue is rarely long enough for its order to "
                      "matter, so keep default (FCFS); re-run with --rate-scale to see what changes at higher "
                      "load")
        return PolicyChoice(policy="default", excluded=excluded, lightllm_strategy="default",
                            lightllm_reason="no strategy clearly beats default within the limits on this "
                            "trace", reason=reason)
    equals = [name for name in eligible if name != "default" and _same(key(name)[0], best_short)]
    chosen = next(name for name in [*preference, best] if name in equals or name == best)
    gain = 1 - key(chosen)[0] / base_short if base_short > 0 else 0.0
    tie = f"{', '.join(equals)} predict about the same short TTFT P95 (within {SAME_RESULT_TOLERANCE:.0%})"
    if chosen == best and len(equals) <= 1:
        within = " of the policies within the limits" if excluded else ""
        why = (f"it predicts the lowest short-request TTFT P95{within} ({key(chosen)[0]:,.0f} ms, {gain:.0%} "
               "below default)")
    elif chosen == "hrrn":
        why = (f"{tie}; the prompt lengths have no clear valley, so a short/long threshold would be a guess "
               "that drifts with the traffic, while hrrn needs no threshold and bounds starvation by work "
               "done")
    elif chosen == "short_request_first":
        why = (f"{tie}; the prompt lengths have a clear valley, which is what the short/long split is built "
               "for, and long_max_wait_ms bounds the long requests' extra wait in milliseconds")
    else:
        why = f"{tie}; {chosen} is preferred among them"
    if chosen == "short_request_first" and not bimodal:
        # Without a valley the threshold is a percentile guess: prefer a threshold-free policy that comes close.
        alternatives = [name for name in ("hrrn", "promote_shortest") if name in eligible
                        and key(name)[0] <= (1 + NO_VALLEY_MARGIN) * key(chosen)[0]
                        and not _same(key(name)[0], base_short)]
        if alternatives:
            alternative = min(alternatives, key=lambda name: key(name)[0])
            why = (f"short_request_first predicts the lowest short TTFT P95 ({key(chosen)[0]:,.0f} ms), but the "
                   "prompt lengths have no clear valley, so its threshold is a percentile guess that will "
                   f"drift with the traffic; {alternative} needs no threshold and comes within "
                   f"{NO_VALLEY_MARGIN:.0%} of it ({key(alternative)[0]:,.0f} ms, "
                   f"{1 - key(alternative)[0] / base_short:.0%} below default)")
            chosen = alternative
    return PolicyChoice(policy=chosen, reason=why, excluded=excluded, lightllm_strategy=lightllm[0],
                        lightllm_reason=lightllm[1])


def _lightllm_choice(summaries: dict[str, dict[str, Any]], eligible: list[str],
                     preference: list[str]) -> tuple[str, str]:
    candidates = [name for name in eligible if name in LIGHTLLM_STRATEGIES]
    if not candidates:
        return "default", "no LightLLM strategy is eligible"

    def p95(name: str) -> float:
        return _metric(summaries[name], "short_ttft_p95_ms")

    best = min(candidates, key=p95)
    if best == "default" or _same(p95(best), p95("default")):
        return "default", "no LightLLM strategy clearly beats default within the limits on this trace"
    equals = [name for name in candidates if name != "default" and _same(p95(name), p95(best))]
    chosen = next(name for name in [*preference, best] if name in equals or name == best)
    if chosen == best:
        return chosen, f"lowest predicted short TTFT P95 among LightLLM's strategies ({p95(chosen):,.0f} ms)"
    return chosen, (f"short TTFT P95 {p95(chosen):,.0f} ms, within {SAME_RESULT_TOLERANCE:.0%} of {best}'s "
                    f"{p95(best):,.0f} ms and preferred on a tie")


# --- configuration snippets --------------------------------------------------------------------

VLLM_SCHEDULER_CLS = "prefillq.integrations.vllm.Scheduler"
VLLM_ASYNC_SCHEDULER_CLS = "prefillq.integrations.vllm.AsyncScheduler"  # with --async-scheduling


def native_config(policy: str, threshold: int, long_max_wait_ms: float) -> dict[str, Any]:
    """Our native configuration object for a policy (threshold/wait only for short_request_first)."""
    if policy == "short_request_first":
        return {"policy": policy, "threshold": int(threshold),
                "long_max_wait_ms": _json_number(long_max_wait_ms)}
    return {"policy": policy}


def ascend_config(threshold: int, long_max_wait_ms: float) -> dict[str, Any]:
    """The vLLM Ascend form; it can only express short_request_first."""
    return {"scheduler_config": {"short_request_first_config": {
        "enabled": True, "threshold": int(threshold), "long_max_wait_ms": _json_number(long_max_wait_ms)}}}


def _json_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def render_configs(policy: str, threshold: int, long_max_wait_ms: float, *,
                   lightllm_strategy: str | None = None) -> dict[str, str]:
    """Ready-to-paste configuration for vLLM (our key and the vLLM Ascend key) and LightLLM."""
    ours = json.dumps({"prefillq": native_config(policy, threshold, long_max_wait_ms)})
    ascend = json.dumps(ascend_config(threshold, long_max_wait_ms))
    strategy = lightllm_strategy or (policy if policy in LIGHTLLM_STRATEGIES else "hrrn")
    return {
        "vllm": (f"vllm serve MODEL --scheduler-cls {VLLM_SCHEDULER_CLS} \\\n"
                 f"    --additional-config '{ours}'"),
        "vllm_additional_config": ours,
        "vllm_ascend": (f"vllm serve MODEL --scheduler-cls {VLLM_SCHEDULER_CLS} \\\n"
                        f"    --additional-config '{ascend}'"),
        "vllm_ascend_additional_config": ascend,
        "lightllm": f"--prefill_queue_strategy {strategy}",
    }


# --- the whole recipe --------------------------------------------------------------------------

Progress = Callable[[str, float, int], None]
"""progress(label, done, total): ``done`` counts finished simulations (fractions while one runs)."""


class _WarningLog(logging.Handler):
    """Collects the policy warnings (e.g. short_request_first's degradation warning) of one simulation."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _policy_warnings() -> Iterator[_WarningLog]:
    """Count the ``prefillq`` logger's warnings instead of printing them in the middle of the output."""
    logger = logging.getLogger("prefillq")
    handler = _WarningLog()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@dataclass
class TuneResult:
    """Everything ``prefillq tune`` found; :meth:`to_dict` is the JSON written by ``--json``."""

    trace: dict[str, Any]
    threshold: ThresholdChoice
    lanes: LaneShares
    window: dict[str, Any]
    simulation: dict[str, Any]
    wait: WaitChoice
    choice: PolicyChoice
    summaries: dict[str, dict[str, Any]]
    configs: dict[str, str]
    explanation: list[str]
    prompt_lengths: list[int] = field(default_factory=list, repr=False)

    @property
    def policy(self) -> str:
        return self.choice.policy

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.choice.policy,
            "threshold": self.threshold.threshold,
            "threshold_method": self.threshold.method,
            "long_max_wait_ms": self.wait.long_max_wait_ms,
            "w_normal_p90_ms": self.wait.w_normal_p90_ms,
            "w_normal_p95_ms": self.wait.w_normal_p95_ms,
            "w_slo_ms": self.wait.w_slo_ms,
            "favor": self.wait.favor,
            "capacity_problem": self.wait.capacity_problem,
            "bimodal": self.threshold.bimodal,
            "lightllm_strategy": self.choice.lightllm_strategy,
            "lanes": asdict(self.lanes),
            "trace": self.trace,
            "window": self.window,
            "simulation": self.simulation,
            "threshold_detail": asdict(self.threshold),
            "wait_detail": asdict(self.wait),
            "policy_detail": asdict(self.choice),
            "predicted": self.summaries,
            "configs": self.configs,
            "explanation": self.explanation,
        }

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_jsonable(self.to_dict()), indent=2, sort_keys=False) + "\n")
        return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 6)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _jsonable(value.item())
    return value


def reclassify(workload: Any, threshold: int) -> Any:
    """A copy of ``workload`` whose request classes follow ``threshold`` (``<= threshold`` is short)."""
    requests = [replace(r, klass="short" if r.prompt_tokens <= threshold else "long")
                for r in workload.requests]
    params = dict(workload.params)
    params["long_threshold"] = int(threshold)
    return type(workload)(name=workload.name, requests=requests, params=params)


def simulation_window(workload: Any, *, window_s: float | None = None,
                      target_requests: int = SIM_REQUEST_TARGET) -> tuple[Any, dict[str, Any]]:
    """The part of the trace to simulate, shifted to start at 0, and a description of it.

    ``window_s`` = 0 means the whole trace. ``None`` (auto) keeps the whole trace when it holds at most
    ``target_requests`` requests; otherwise the window is as long as ``target_requests`` requests last on
    average, placed where the offered prefill tokens are highest (the busiest stretch is where the queue
    order matters and where the wait gate must hold).
    """
    requests = workload.requests
    if not requests:
        raise TuneError("the trace has no requests to simulate")
    first, last = requests[0].arrival_s, requests[-1].arrival_s
    span = max(last - first, 1e-9)
    if window_s is not None and window_s < 0:
        raise TuneError(f"window must be >= 0 seconds, got {window_s!r}")
    if window_s == 0 or (window_s is None and len(requests) <= target_requests) or \
            (window_s is not None and window_s >= span):
        description = f"the whole trace ({len(requests):,} requests, {span:,.0f} s)"
        return workload, {"start_s": first, "end_s": last, "requests": len(requests), "whole_trace": True,
                          "description": description, "selection": "whole"}
    length = float(window_s) if window_s is not None else span * target_requests / len(requests)
    # Two pointers over arrivals: the window [t, t + length) starting at a request with the most tokens.
    best_start, best_tokens, tokens, j = 0, -1, 0, 0
    for i, request in enumerate(requests):
        while j < len(requests) and requests[j].arrival_s < request.arrival_s + length:
            tokens += requests[j].prompt_tokens
            j += 1
        if tokens > best_tokens:
            best_start, best_tokens = i, tokens
        tokens -= request.prompt_tokens
    start = requests[best_start].arrival_s
    chosen = [r for r in requests if start <= r.arrival_s < start + length]
    shifted = [replace(r, arrival_s=round(r.arrival_s - start, 9)) for r in chosen]
    params = dict(workload.params)
    params.update({"window_start_s": start, "window_s": length})
    window = type(workload)(name=f"{workload.name}[{start:.0f}s+{length:.0f}s]", requests=shifted,
                            params=params)
    description = (f"the busiest {length:,.0f} s of the trace ({start:,.0f}-{start + length:,.0f} s of the "
                   f"replayed timeline, {len(chosen):,} of {len(requests):,} requests, the most prefill "
                   "tokens of any window that long)")
    return window, {"start_s": start, "end_s": start + length, "requests": len(chosen), "whole_trace": False,
                    "description": description, "selection": "busiest"}


def _percent_change(new: float, old: float) -> str:
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return "n/a"
    return f"{(new - old) / old:+.1%}"


def tune(
    workload: Any,
    *,
    profile: str | None = None,
    budget: int | None = None,
    w_slo_ms: float = DEFAULT_W_SLO_MS,
    favor: str = "short",
    window_s: float | None = None,
    simulate: Callable[..., Any] | None = None,
    progress: Progress | None = None,
) -> TuneResult:
    """Run the whole recipe on a :class:`prefillq.workload.Workload` (see the module docstring)."""
    from prefillq.config import PolicyConfig

    if favor not in FAVOR_POSITION:
        raise TuneError(f"favor must be 'short' or 'long', got {favor!r}")
    if not (isinstance(w_slo_ms, int | float) and math.isfinite(w_slo_ms) and w_slo_ms > 0):
        raise TuneError(f"the long-request SLO must be a positive number of ms, got {w_slo_ms!r}")
    if not workload.requests:
        raise TuneError(f"{workload.params.get('trace', workload.name)}: the trace has no requests")
    if simulate is None:
        from prefillq.sim import simulate as simulate_default

        simulate = simulate_default
    lengths = [r.prompt_tokens for r in workload.requests]
    threshold = choose_threshold(lengths)
    lanes = lane_shares(lengths, threshold.threshold)
    window, window_info = simulation_window(reclassify(workload, threshold.threshold), window_s=window_s)

    sim_kwargs: dict[str, Any] = {}
    if profile is not None:
        sim_kwargs["profile"] = profile
    if budget is not None:
        sim_kwargs["budget"] = budget
    total = 1 + len(POLICIES_SIMULATED)

    def step(label: str, done: int) -> None:
        if progress is not None:
            progress(label, done, total)

    reports_progress = "progress" in inspect.signature(simulate).parameters
    warnings: dict[str, int] = {}

    def run(label: str, done: int, config: PolicyConfig) -> Any:
        step(label, done)
        kwargs = dict(sim_kwargs)
        if reports_progress:
            kwargs["progress"] = lambda fraction: step(label, done + min(max(fraction, 0.0), 1.0))
        with _policy_warnings() as log:
            result = simulate(window, config, **kwargs)
        warnings[label] = len(log.messages)
        return result

    strict_label = "short_request_first (strict)"
    strict = run(strict_label, 0, PolicyConfig("short_request_first", threshold=threshold.threshold,
                                               long_max_wait_ms=0.0))
    wait = choose_long_max_wait(strict.long_waits_s, w_slo_ms=w_slo_ms, favor=favor)
    summaries: dict[str, dict[str, Any]] = {}
    tuned = PolicyConfig("short_request_first", threshold=threshold.threshold,
                         long_max_wait_ms=wait.long_max_wait_ms)
    default_long_waits: list[float] = []
    for done, name in enumerate(POLICIES_SIMULATED, start=1):
        config = tuned if name == "short_request_first" else PolicyConfig(name)
        result = run(name, done, config)
        summaries[name] = dict(result.summary)
        if name == "default":
            default_long_waits = list(result.long_waits_s)
    step("done", total)
    summaries[strict_label] = dict(strict.summary)

    choice = choose_policy({k: summaries[k] for k in POLICIES_SIMULATED}, bimodal=threshold.bimodal,
                           w_slo_ms=w_slo_ms)
    limits = getattr(strict, "limits", None)
    simulation = {"profile": getattr(strict, "profile", profile),
                  "budget": getattr(limits, "max_num_batched_tokens", budget),
                  "policies": list(POLICIES_SIMULATED), "strict_short_request_first": strict_label,
                  "tuned_short_request_first": tuned.to_dict(), "policy_warnings": warnings}
    offered = _offered_load(window)
    simulation.update(offered)
    if wait.capacity_problem or wait.near_slo:
        wait.evidence = _capacity_evidence(wait, summaries, default_long_waits, lanes, offered)
    configs = render_configs(choice.policy, threshold.threshold, wait.long_max_wait_ms,
                             lightllm_strategy=choice.lightllm_strategy)
    trace = {
        "path": str(workload.params.get("trace", workload.name)),
        "format": workload.params.get("format"),
        "requests": len(workload.requests),
        "duration_s": workload.duration_s,
        "rate_scale": workload.params.get("rate_scale", 1.0),
        "prompt_tokens": {k: round(v, 1) for k, v in threshold.percentiles.items()}
        | {"min": min(lengths), "max": max(lengths)},
    }
    result = TuneResult(trace=trace, threshold=threshold, lanes=lanes, window=window_info,
                        simulation=simulation, wait=wait, choice=choice, summaries=summaries,
                        configs=configs, explanation=[], prompt_lengths=lengths)
    result.explanation = explain(result)
    return result


def _offered_load(window: Any) -> dict[str, Any]:
    requests = window.requests
    span = max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9) if requests else 0.0
    tokens = sum(r.prompt_tokens for r in requests)
    return {"window_requests": len(requests), "window_s": span,
            "offered_prefill_tokens_per_s": tokens / span if span else 0.0,
            "offered_requests_per_s": len(requests) / span if span else 0.0}


def _capacity_evidence(wait: WaitChoice, summaries: dict[str, dict[str, Any]],
                       default_long_waits: Sequence[float], lanes: LaneShares,
                       offered: dict[str, Any]) -> list[str]:
    import numpy as np

    evidence = [f"long requests' queue wait under strict short-first: P90 {wait.w_normal_p90_ms:,.0f} ms, "
                f"P95 {wait.w_normal_p95_ms:,.0f} ms (W_slo {wait.w_slo_ms:,.0f} ms)"]
    if default_long_waits:
        fcfs_p95 = float(np.percentile(np.asarray(default_long_waits) * 1000.0, 95))
        added = wait.w_normal_p95_ms - fcfs_p95
        if fcfs_p95 >= wait.w_slo_ms:
            verdict = "so they exceed W_slo even without any reordering: capacity is short for this traffic"
        elif added >= 0.5 * wait.w_slo_ms:
            verdict = (f"so short requests overtaking them add ~{added:,.0f} ms: the long lane is starved by the "
                       "short lane's load; a higher threshold leaves fewer, longer requests in the long lane "
                       "and fewer aged-long promotions")
        else:
            verdict = "so most of the wait is load, not reordering: capacity is close to its limit"
        evidence.append(f"the same requests under default (FCFS) wait {fcfs_p95:,.0f} ms at P95, {verdict}")
    base = summaries.get("default", {})
    strict = summaries.get("short_request_first (strict)", {})
    evidence.append(f"long TTFT P95: {_metric(base, 'long_ttft_p95_ms'):,.0f} ms under default, "
                    f"{_metric(strict, 'long_ttft_p95_ms'):,.0f} ms under strict short-first")
    evidence.append(f"the long lane holds {lanes.long_request_share:.0%} of the requests and "
                    f"{lanes.long_token_share:.0%} of the prefill tokens; offered load "
                    f"{offered['offered_prefill_tokens_per_s']:,.0f} prompt tokens/s")
    return evidence


# --- explanation -------------------------------------------------------------------------------

def explain(result: TuneResult) -> list[str]:
    """Plain-language paragraphs explaining the recommendation."""
    t, lanes, wait, choice = result.threshold, result.lanes, result.wait, result.choice
    trace = result.trace
    prompt = trace["prompt_tokens"]
    lines = [
        f"Trace: {trace['requests']:,} requests over {trace['duration_s']:,.0f} s "
        f"(rate scale {trace['rate_scale']:g}); prompt tokens p50 {prompt['p50']:,.0f}, "
        f"p90 {prompt['p90']:,.0f}, max {prompt['max']:,}.",
        f"Threshold {t.threshold:,} tokens ({t.method}): {t.reason}.",
        f"Lanes at {t.threshold:,}: short {lanes.short_request_share:.0%} of requests / "
        f"{lanes.short_token_share:.0%} of prefill tokens; long {lanes.long_request_share:.0%} of requests / "
        f"{lanes.long_token_share:.0%} of prefill tokens.",
        f"Simulated {result.window['description']} on profile {result.simulation.get('profile') or 'default'}"
        + (f" with a prefill budget of {result.simulation['budget']:,} tokens per step."
           if result.simulation.get("budget") else "."),
        f"long_max_wait_ms {wait.long_max_wait_ms:,.0f}: {wait.reason}.",
    ]
    if wait.evidence:
        lines.append("Evidence: " + "; ".join(wait.evidence) + ".")
    degraded = result.simulation.get("policy_warnings", {}).get("short_request_first", 0)
    if degraded:
        lines.append(f"The tuned short_request_first run logged {degraded} degradation warning(s) (long requests "
                     "promoted over waiting short ones several times in a row): per SPEC §3.5, raise the "
                     "threshold first, then the wait.")
    base = result.summaries.get("default", {})
    chosen = result.summaries.get(choice.policy, {})
    effect = ""
    if choice.policy != "default":
        def change(key: str) -> str:
            return _percent_change(_metric(chosen, key), _metric(base, key))

        effect = (f" Predicted against default: short TTFT P95 {change('short_ttft_p95_ms')}, short TTFT "
                  f"p50 {change('short_ttft_p50_ms')}, long TTFT P95 {change('long_ttft_p95_ms')}, output "
                  f"tokens/s {change('output_tokens_per_s')}.")
    lines.append(f"Policy {choice.policy}: {choice.reason}.{effect}")
    for name, why in choice.excluded.items():
        lines.append(f"Not {name}: {why}.")
    if choice.policy not in LIGHTLLM_STRATEGIES:
        lines.append(f"LightLLM has no short_request_first; its best strategy here is "
                     f"{choice.lightllm_strategy} ({choice.lightllm_reason}).")
    if choice.policy != "short_request_first":
        lines.append("The vLLM Ascend key only configures short_request_first; its snippet below carries the "
                     "tuned threshold and wait in case you run that policy anyway.")
    return lines


# --- the histogram -----------------------------------------------------------------------------

def plot_histogram(result: TuneResult, path: str | Path) -> Path:
    """PNG: histogram of prompt lengths (log axis), lanes coloured, threshold and valley marked."""
    import numpy as np

    from prefillq.report.plots import pyplot, save_figure

    plt = pyplot()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = np.asarray(result.prompt_lengths, dtype=float)
    t = result.threshold
    low, high = max(1.0, float(lengths.min())), float(lengths.max())
    bins = np.logspace(math.log10(low) - 0.01, math.log10(max(high, low * 1.01)) + 0.01, 60)
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    short, long = lengths[lengths <= t.threshold], lengths[lengths > t.threshold]
    lanes = result.lanes
    ax.hist(short, bins=bins, color="#2b8cbe", label=f"short lane: {lanes.short_request_share:.0%} of "
            f"requests, {lanes.short_token_share:.0%} of prefill tokens")
    ax.hist(long, bins=bins, color="#e6550d", label=f"long lane: {lanes.long_request_share:.0%} of "
            f"requests, {lanes.long_token_share:.0%} of prefill tokens")
    ax.axvline(t.threshold, color="black", linewidth=1.6, label=f"threshold {t.threshold:,} ({t.method})")
    if t.valley_tokens is not None:
        depth = f" (density {t.valley_depth_ratio:.0%} of the smaller peak)" if t.valley_depth_ratio else ""
        ax.axvline(t.valley_tokens, color="grey", linestyle="--", linewidth=1,
                   label=f"{'valley' if t.bimodal else 'deepest dip'} ~{t.valley_tokens:,.0f}{depth}")
    ax.set_xscale("log")
    ax.set_xlabel("prompt tokens (log scale)")
    ax.set_ylabel("requests")
    name = Path(str(result.trace.get("path", ""))).name
    ax.set_title(f"{name}: prompt lengths, recommended policy {result.choice.policy}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, path, dpi="figure")
