"""prefillq tune, the pure decisions (SPEC §3.5): threshold, lane shares, long_max_wait_ms, policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.tune import (
    DEFAULT_W_SLO_MS,
    TuneError,
    choose_long_max_wait,
    choose_partial_prefills,
    choose_policy,
    choose_threshold,
    lane_shares,
    render_configs,
)


def _lognormal(rng: np.random.Generator, center: float, sigma: float, count: int) -> np.ndarray:
    return np.maximum(1, np.round(np.exp(rng.normal(math.log(center), sigma, count)))).astype(int)


# --- threshold: bimodal mixes ------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), short_center=st.sampled_from([64, 100, 128, 200, 256, 400]),
       ratio=st.sampled_from([16, 32, 64]), long_share=st.sampled_from([0.1, 0.2, 0.3, 0.5]),
       count=st.sampled_from([400, 1500, 4000]))
def test_a_clearly_bimodal_mix_puts_the_threshold_in_the_valley_near_the_short_edge(
        seed: int, short_center: int, ratio: int, long_share: float, count: int) -> None:
    rng = np.random.default_rng(seed)
    n_long = int(count * long_share)
    short = _lognormal(rng, short_center, 0.25, count - n_long)
    long = _lognormal(rng, short_center * ratio, 0.25, n_long)
    choice = choose_threshold(np.concatenate([short, long]).tolist())
    assert choice.method == "kde_valley"
    assert choice.bimodal
    assert choice.valley_depth_ratio is not None and choice.valley_depth_ratio <= 0.5
    # In the valley: (almost) every short prompt is short and every long one is long ...
    assert np.mean(short <= choice.threshold) >= 0.99
    assert np.all(long > choice.threshold)
    # ... and near the upper edge of the short cluster, not in the middle of the gap.
    geometric_middle = math.sqrt(float(short.max()) * float(long.min()))
    assert choice.threshold <= max(geometric_middle, 2 * float(np.percentile(short, 99)))
    assert choice.threshold <= 1.5 * choice.short_cluster_edge_tokens + 1


def test_bimodal_example_with_a_known_valley() -> None:
    rng = np.random.default_rng(7)
    short = _lognormal(rng, 128, 0.3, 900)
    long = _lognormal(rng, 8192, 0.3, 300)
    choice = choose_threshold(np.concatenate([short, long]).tolist())
    assert choice.method == "kde_valley"
    # In the gap between the clusters, at the short cluster's upper edge (its 99.5th percentile), so at
    # most 0.5% of the short prompts (its stray tail) land in the long lane and no long one in the short lane.
    assert np.percentile(short, 99) < choice.threshold < long.min()
    assert np.mean(short > choice.threshold) <= 0.005
    assert choice.threshold < math.sqrt(short.max() * long.min())
    assert choice.threshold in (256, 384, 512)  # a round number
    assert "clear valley" in choice.reason
    assert 70 < choice.threshold_percentile <= 76


def test_the_deepest_of_several_valleys_wins() -> None:
    # Three clusters; the gap between the second and third is the deep, clean one.
    rng = np.random.default_rng(3)
    a = _lognormal(rng, 100, 0.35, 800)
    b = _lognormal(rng, 260, 0.35, 800)
    c = _lognormal(rng, 16000, 0.2, 400)
    choice = choose_threshold(np.concatenate([a, b, c]).tolist())
    assert choice.method == "kde_valley"
    assert np.mean(b <= choice.threshold) >= 0.99
    assert choice.threshold < c.min()


# --- threshold: no clear valley -> percentile fallback ------------------------------------------

@pytest.mark.parametrize("name, lengths", [
    ("lognormal", _lognormal(np.random.default_rng(1), 1000, 0.8, 3000)),
    ("uniform", np.random.default_rng(2).integers(1, 8001, 3000)),
    ("log-uniform", np.round(2 ** np.random.default_rng(3).uniform(4, 14, 3000)).astype(int)),
    ("normal", np.maximum(1, np.round(np.random.default_rng(4).normal(2000, 400, 3000))).astype(int)),
])
def test_unimodal_and_uniform_mixes_use_the_reported_percentile_fallback(name: str,
                                                                        lengths: np.ndarray) -> None:
    choice = choose_threshold(lengths.tolist())
    assert choice.method == "percentile_fallback_p80", name
    assert not choice.bimodal
    assert "falling back to the 80th percentile" in choice.reason
    assert "70th-85th" in choice.reason
    assert np.percentile(lengths, 70) <= choice.threshold <= np.percentile(lengths, 85)
    assert 70.0 <= choice.threshold_percentile <= 85.5


def test_too_few_requests_fall_back_and_say_why() -> None:
    choice = choose_threshold([100] * 10 + [10_000] * 10)
    assert choice.method == "percentile_fallback_p80"
    assert "too few" in choice.reason


def test_a_single_prompt_length_has_nothing_to_split() -> None:
    choice = choose_threshold([512] * 100)
    assert choice.method == "single_length"
    assert choice.threshold == 512
    assert "nothing to split" in choice.reason


def test_no_lengths_is_an_error() -> None:
    with pytest.raises(TuneError):
        choose_threshold([])


# --- lanes -------------------------------------------------------------------------------------

def test_lane_shares_count_requests_and_prefill_tokens() -> None:
    lanes = lane_shares([100, 100, 100, 1000], threshold=100)  # <= threshold is short
    assert (lanes.short_requests, lanes.long_requests) == (3, 1)
    assert lanes.short_request_share == pytest.approx(0.75)
    assert lanes.short_token_share == pytest.approx(300 / 1300)
    assert lanes.long_token_share == pytest.approx(1000 / 1300)


# --- long_max_wait_ms ----------------------------------------------------------------------------

WAITS_S = [i / 1000 for i in range(0, 1001, 10)]  # 0..1000 ms: P90 900 ms, P95 950 ms


def test_wait_lies_in_the_interval_towards_w_slo_when_favoring_short() -> None:
    choice = choose_long_max_wait(WAITS_S, w_slo_ms=3000, favor="short")
    assert choice.w_normal_p90_ms == pytest.approx(900)
    assert choice.w_normal_p95_ms == pytest.approx(950)
    assert 950 <= choice.long_max_wait_ms <= 3000
    assert choice.long_max_wait_ms > (950 + 3000) / 2
    assert not choice.capacity_problem


def test_wait_lies_in_the_interval_towards_w_normal_when_favoring_long() -> None:
    choice = choose_long_max_wait(WAITS_S, w_slo_ms=3000, favor="long")
    assert 950 <= choice.long_max_wait_ms < (950 + 3000) / 2
    short = choose_long_max_wait(WAITS_S, w_slo_ms=3000, favor="short")
    assert choice.long_max_wait_ms < short.long_max_wait_ms


def test_w_normal_at_or_above_w_slo_blames_threshold_or_capacity() -> None:
    for favor in ("short", "long"):
        choice = choose_long_max_wait(WAITS_S, w_slo_ms=500, favor=favor)
        assert choice.capacity_problem
        # W_slo would promote nearly every long request over the shorts; W_normal keeps short-first.
        assert choice.long_max_wait_ms == pytest.approx(950)
        assert "threshold or the capacity is the problem, not this knob" in choice.reason


def test_w_normal_near_w_slo_is_flagged() -> None:
    choice = choose_long_max_wait(WAITS_S, w_slo_ms=1100, favor="short")
    assert not choice.capacity_problem
    assert choice.near_slo
    assert "little room" in choice.reason


def test_without_long_requests_the_wait_is_a_share_of_w_slo() -> None:
    choice = choose_long_max_wait([], w_slo_ms=DEFAULT_W_SLO_MS, favor="short")
    assert choice.long_requests_measured == 0
    assert choice.long_max_wait_ms == 1500


@pytest.mark.parametrize("kwargs", [{"favor": "both"}, {"w_slo_ms": 0}, {"w_slo_ms": float("nan")}])
def test_bad_wait_arguments_are_errors(kwargs: dict) -> None:
    with pytest.raises(TuneError):
        choose_long_max_wait(WAITS_S, **kwargs)


# --- policy ------------------------------------------------------------------------------------

def _summary(short_p95: float, long_p95: float = 1000.0, tps: float = 1000.0, short_p50: float | None = None
             ) -> dict:
    return {"short_ttft_p95_ms": short_p95, "short_ttft_p50_ms": short_p50 or short_p95 / 2,
            "long_ttft_p95_ms": long_p95, "output_tokens_per_s": tps}


def test_the_policy_with_the_lowest_short_p95_wins() -> None:
    choice = choose_policy({"default": _summary(900), "promote_shortest": _summary(600),
                            "hrrn": _summary(400), "short_request_first": _summary(200)}, bimodal=True)
    assert choice.policy == "short_request_first"
    assert choice.lightllm_strategy == "hrrn"


def test_no_valley_and_a_tie_prefers_hrrn() -> None:
    choice = choose_policy({"default": _summary(900), "promote_shortest": _summary(600),
                            "hrrn": _summary(205), "short_request_first": _summary(200)}, bimodal=False)
    assert choice.policy == "hrrn"
    assert "no clear valley" in choice.reason


def test_nothing_to_gain_keeps_default() -> None:
    choice = choose_policy({"default": _summary(100), "promote_shortest": _summary(99),
                            "hrrn": _summary(98), "short_request_first": _summary(97)}, bimodal=True)
    assert choice.policy == "default"
    assert "keep default" in choice.reason


def test_starving_long_requests_or_losing_throughput_excludes_a_policy() -> None:
    choice = choose_policy({"default": _summary(900, long_p95=1000),
                            "promote_shortest": _summary(600, tps=900),
                            "hrrn": _summary(500),
                            "short_request_first": _summary(100, long_p95=1000 + DEFAULT_W_SLO_MS + 1)},
                           bimodal=True)
    assert choice.policy == "hrrn"
    assert "short_request_first" in choice.excluded and "W_slo" in choice.excluded["short_request_first"]
    assert "promote_shortest" in choice.excluded and "throughput" in choice.excluded["promote_shortest"]


# --- configs -----------------------------------------------------------------------------------

def test_configs_parse_back_to_the_recommended_policy() -> None:
    import json
    import shlex

    from prefillq.config import load_config

    configs = render_configs("short_request_first", 576, 1500.0)
    ours = load_config(configs["vllm_additional_config"])
    ascend = load_config(configs["vllm_ascend_additional_config"])
    assert (ours.policy, ours.threshold, ours.long_max_wait_ms) == ("short_request_first", 576, 1500.0)
    assert (ascend.policy, ascend.threshold, ascend.long_max_wait_ms) == ("short_request_first", 576, 1500.0)
    argv = shlex.split(configs["vllm"].replace("\\\n", " "))
    assert argv[argv.index("--scheduler-cls") + 1] == "prefillq.integrations.vllm.Scheduler"
    passed = argv[argv.index("--additional-config") + 1]
    assert json.loads(passed) == json.loads(configs["vllm_additional_config"])
    assert load_config(configs["lightllm"]).policy == "hrrn"  # LightLLM has no short_request_first

    # What our vLLM scheduler reads from --additional-config (both keys), and its class paths.
    from prefillq.config import resolve_config
    from prefillq.integrations import serve
    from prefillq.tune import VLLM_SCHEDULER_CLS

    for key in ("vllm_additional_config", "vllm_ascend_additional_config"):
        config, _ = resolve_config(json.loads(configs[key]), environ={})
        assert (config.policy, config.threshold, config.long_max_wait_ms) == ("short_request_first", 576, 1500.0)
    assert VLLM_SCHEDULER_CLS == serve.SCHEDULER_CLASS

    hrrn = render_configs("hrrn", 576, 1500.0)
    assert load_config(hrrn["vllm_additional_config"]).policy == "hrrn"
    assert load_config(hrrn["lightllm"]).policy == "hrrn"


def test_no_valley_needs_a_clear_margin_for_short_request_first() -> None:
    summaries = {"default": _summary(900), "promote_shortest": _summary(600), "hrrn": _summary(240),
                 "short_request_first": _summary(200)}
    assert choose_policy(summaries, bimodal=True).policy == "short_request_first"
    choice = choose_policy(summaries, bimodal=False)  # hrrn is within 25% of srf: no threshold to guess
    assert choice.policy == "hrrn"
    assert "percentile guess" in choice.reason
    summaries["hrrn"] = _summary(300)  # 50% worse: srf's advantage is worth a guessed threshold
    assert choose_policy(summaries, bimodal=False).policy == "short_request_first"


# --- partial_prefills = "ordered" (SPEC §3.6) ----------------------------------------------------

def _with_ordered(first: dict[str, float], ordered: dict[str, dict]) -> dict[str, dict]:
    summaries = {name: _summary(p95) for name, p95 in first.items()}
    summaries.update({f"{name} (ordered)": _summary(**kwargs) for name, kwargs in ordered.items()})
    return summaries


FIRST = {"default": 900, "promote_shortest": 600, "hrrn": 400, "short_request_first": 200}


def test_ordered_needs_a_gain_beyond_the_tie_tolerance_against_the_same_policy() -> None:
    clear = _with_ordered(FIRST, {"short_request_first": {"short_p95": 150}})
    assert choose_partial_prefills(clear, "short_request_first")[1].partial_prefills == "ordered"
    # 5% (or 5 ms) is the "same result" tolerance: 191 ms against 200 is a tie, 189 is a gain.
    tie = _with_ordered(FIRST, {"short_request_first": {"short_p95": 191}})
    assert choose_partial_prefills(tie, "short_request_first")[1].partial_prefills == "first"
    gain = _with_ordered(FIRST, {"short_request_first": {"short_p95": 189}})
    assert choose_partial_prefills(gain, "short_request_first")[1].partial_prefills == "ordered"
    # Another policy's ordered gain does not make the chosen one "ordered".
    other = _with_ordered(FIRST, {"hrrn": {"short_p95": 50}, "short_request_first": {"short_p95": 200}})
    assert choose_partial_prefills(other, "short_request_first")[1].partial_prefills == "first"


@pytest.mark.parametrize("ordered, why", [
    ({"short_p95": 100, "long_p95": 1000 + DEFAULT_W_SLO_MS + 1}, "W_slo"),
    ({"short_p95": 100, "tps": 960}, "throughput"),
])
def test_ordered_outside_the_limits_is_not_recommended(ordered: dict, why: str) -> None:
    summaries = _with_ordered(FIRST, {"short_request_first": ordered})
    policy, choice = choose_partial_prefills(summaries, "short_request_first")
    assert (policy, choice.partial_prefills) == ("short_request_first", "first")
    assert why in choice.reason and not choice.per_policy["short_request_first"]["within_limits"]


def test_a_kept_default_switches_only_to_an_ordered_run_that_beats_it_clearly() -> None:
    flat = {"default": 900, "promote_shortest": 890, "hrrn": 880, "short_request_first": 880}
    ties = _with_ordered(flat, {"promote_shortest": {"short_p95": 500}, "hrrn": {"short_p95": 505},
                                "short_request_first": {"short_p95": 504}})
    assert choose_partial_prefills(ties, "default", bimodal=True)[0] == "short_request_first"
    assert choose_partial_prefills(ties, "default", bimodal=False)[0] == "hrrn"
    small = _with_ordered(flat, {"hrrn": {"short_p95": 870}})
    policy, choice = choose_partial_prefills(small, "default")  # 870 against 900: within the tie tolerance
    assert (policy, choice.partial_prefills, choice.policy_switched_from) == ("default", "first", None)


def test_ordered_configs_carry_it_only_in_our_key() -> None:
    import json

    from prefillq.config import load_config

    configs = render_configs("hrrn", 512, 1500.0, partial_prefills="ordered")
    assert load_config(configs["vllm_additional_config"]).partial_prefills == "ordered"
    assert json.loads(configs["vllm_additional_config"]) == {"prefillq": {"policy": "hrrn",
                                                                          "partial_prefills": "ordered"}}
    assert load_config(configs["vllm_ascend_additional_config"]).partial_prefills == "first"
    assert "cannot express" in configs["vllm_ascend_note"] and "already orders" in configs["lightllm_note"]
    plain = render_configs("hrrn", 512, 1500.0)
    assert "partial_prefills" not in plain["vllm_additional_config"]
    assert plain["vllm_ascend_note"] == plain["lightllm_note"] == ""
