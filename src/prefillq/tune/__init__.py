"""``prefillq tune``: choose ``threshold``, ``long_max_wait_ms`` and a policy from a request trace.

The recipe is SPEC §3.5, automated with the simulator:

1. **threshold** (:mod:`prefillq.tune.threshold`) — the valley of a kernel density estimate of log2
   prompt lengths, near the upper edge of the short cluster; without a clear valley, the 80th percentile
   (the middle of the 70th-85th percentile range §3.5 recommends as a start).
2. **long_max_wait_ms** (:mod:`prefillq.tune.wait`) — from the P90/P95 of the long requests' queue waits
   under strict short-first (``W_normal``), placed in ``[W_normal, W_slo]`` by ``favor``.
3. **policy** (:mod:`prefillq.tune.choose`) — simulate ``default``, ``promote_shortest``, ``hrrn`` and
   the tuned ``short_request_first`` and recommend one (rules in :func:`choose_policy`).
4. **partial_prefills** (:mod:`prefillq.tune.ordered`) — simulate the reordering policies again with
   ``partial_prefills = "ordered"`` (SPEC §3.6) and recommend it only where those runs support it.

:mod:`prefillq.tune.render` turns the result into paste-ready configuration, prose and a histogram;
:mod:`prefillq.tune.recipe` runs the steps in order (:func:`tune`). The package holds the logic only
(no typer); ``prefillq.cli.tune`` is the command. numpy is imported lazily, matplotlib only when a
histogram is drawn.
"""

from prefillq.tune.choose import (
    LIGHTLLM_STRATEGIES,
    NO_VALLEY_MARGIN,
    ORDERED_POLICIES,
    POLICIES_SIMULATED,
    SAME_RESULT_ABS_MS,
    SAME_RESULT_TOLERANCE,
    SIM_REQUEST_TARGET,
    THROUGHPUT_LOSS_MAX,
    CandidateRuns,
    PolicyChoice,
    Progress,
    TuneResult,
    choose_policy,
    ordered_label,
    simulate_candidates,
)
from prefillq.tune.ordered import (
    STRICT_ORDERED_WARNING,
    OrderedChoice,
    choose_partial_prefills,
    strict_ordered_warning,
)
from prefillq.tune.recipe import reclassify, simulation_window, tune
from prefillq.tune.render import (
    VLLM_SCHEDULER_CLS,
    ascend_config,
    explain,
    native_config,
    plot_histogram,
    render_configs,
)
from prefillq.tune.threshold import LaneShares, ThresholdChoice, TuneError, choose_threshold, lane_shares
from prefillq.tune.wait import (
    DEFAULT_W_SLO_MS,
    FAVOR_POSITION,
    NEAR_SLO_FRACTION,
    WaitChoice,
    choose_long_max_wait,
)
from prefillq.workload.split import (
    EDGE_QUANTILE,
    FALLBACK_PERCENTILE,
    FALLBACK_ROUNDING_BAND,
    MIN_LANE_REQUESTS,
    MIN_LANE_SHARE,
    MIN_REQUESTS_FOR_SHAPE,
    VALLEY_DEPTH_MAX,
    WIGGLE_RATIO,
)

__all__ = [
    "DEFAULT_W_SLO_MS",
    "EDGE_QUANTILE",
    "FALLBACK_PERCENTILE",
    "FALLBACK_ROUNDING_BAND",
    "FAVOR_POSITION",
    "LIGHTLLM_STRATEGIES",
    "MIN_LANE_REQUESTS",
    "MIN_LANE_SHARE",
    "MIN_REQUESTS_FOR_SHAPE",
    "NEAR_SLO_FRACTION",
    "NO_VALLEY_MARGIN",
    "ORDERED_POLICIES",
    "POLICIES_SIMULATED",
    "SAME_RESULT_ABS_MS",
    "SAME_RESULT_TOLERANCE",
    "SIM_REQUEST_TARGET",
    "STRICT_ORDERED_WARNING",
    "THROUGHPUT_LOSS_MAX",
    "VALLEY_DEPTH_MAX",
    "VLLM_SCHEDULER_CLS",
    "WIGGLE_RATIO",
    "CandidateRuns",
    "LaneShares",
    "OrderedChoice",
    "PolicyChoice",
    "Progress",
    "ThresholdChoice",
    "TuneError",
    "TuneResult",
    "WaitChoice",
    "ascend_config",
    "choose_long_max_wait",
    "choose_partial_prefills",
    "choose_policy",
    "choose_threshold",
    "explain",
    "lane_shares",
    "native_config",
    "ordered_label",
    "plot_histogram",
    "reclassify",
    "render_configs",
    "simulate_candidates",
    "simulation_window",
    "strict_ordered_warning",
    "tune",
]
