"""Step 2 of the recipe: ``long_max_wait_ms`` from the simulated queue waits of long requests.

Simulate strict short-first (``long_max_wait_ms = 0``), take the P90/P95 of the queue waits of long
requests (``W_normal``; P95 is the base) and pick a value in ``[W_normal, W_slo]``: a quarter of the way
from ``W_slo`` for ``favor="short"``, a quarter of the way from ``W_normal`` for ``favor="long"``. If
``W_normal >= W_slo`` the threshold or the capacity is the problem, not this knob; the result says so
and recommends ``W_normal`` (a gate at ``W_slo`` would fire for nearly every long request and turn
short-first into long-first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from prefillq.metrics import percentile
from prefillq.tune.threshold import TuneError

DEFAULT_W_SLO_MS = 2000.0
"""Default ``W_slo``: the most extra queueing a long request may suffer. 2 s is the time-to-first-token
limit of MLPerf Inference's Llama-2-70B server scenario (``llama2-70b.Server.ttft_latency = 2000`` in
mlcommons/inference ``loadgen/mlperf.conf``), a widely used interactive-serving bound; it is also the
``long_max_wait_ms`` of the vLLM Ascend configuration example (SPEC §4)."""
FAVOR_POSITION = {"short": 0.75, "long": 0.25}
"""Where in ``[W_normal, W_slo]`` the wait goes: fraction of the way from W_normal towards W_slo."""
NEAR_SLO_FRACTION = 0.8
"""``W_normal`` above this fraction of ``W_slo`` is "near": the interval leaves little room."""


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
    if favor not in FAVOR_POSITION:
        raise TuneError(f"favor must be 'short' or 'long', got {favor!r}")
    if not (isinstance(w_slo_ms, int | float) and math.isfinite(w_slo_ms) and w_slo_ms > 0):
        raise TuneError(f"the long-request SLO (W_slo) must be a positive number of ms, got {w_slo_ms!r}")
    waits_ms = [float(w) * 1000.0 for w in long_waits_s]
    position = FAVOR_POSITION[favor]
    if not waits_ms:
        value = _round_wait_ms(position * w_slo_ms, 0.0, w_slo_ms)
        return WaitChoice(
            long_max_wait_ms=value, w_normal_p90_ms=0.0, w_normal_p95_ms=0.0, w_normal_ms=0.0,
            w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=0, capacity_problem=False,
            near_slo=False,
            reason=(f"no long request was simulated, so there is no W_normal to measure; {value:,.0f} ms is "
                    f"{position:.0%} of the way to W_slo = {w_slo_ms:,.0f} ms"),
        )
    p90 = percentile(waits_ms, 90)
    p95 = percentile(waits_ms, 95)
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
            w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=len(waits_ms),
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
        w_slo_ms=float(w_slo_ms), favor=favor, long_requests_measured=len(waits_ms),
        capacity_problem=False, near_slo=near, reason=reason,
    )
