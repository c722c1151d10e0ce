"""The recommendation compare prints: the best short TTFT P95 among the rows that keep long requests and
throughput within the limits and have a starvation bound; default as the fallback; LightLLM's own flag."""

from __future__ import annotations

import json

import pytest

from prefillq.config import PolicyConfig, load_config, parse_policy_spec
from prefillq.sim.recommend import has_starvation_bound, native_config, recommend, vllm_command


def _row(short_p95: float, long_p95: float = 1000.0, tput: float = 100.0, tpot: float = 10.0) -> dict:
    return {"short_ttft_p95_ms": short_p95, "long_ttft_p95_ms": long_p95, "output_tokens_per_s": tput,
            "short_tpot_p50_ms": tpot}


def _configs(*specs: str) -> dict[str, PolicyConfig]:
    return dict(parse_policy_spec(spec) for spec in specs)


def test_the_best_short_p95_within_the_limits_wins_and_carries_its_command_and_cost():
    configs = _configs("default", "hrrn", "auto:partial_prefills=ordered")
    summaries = {"default": _row(500, tpot=5), "hrrn": _row(100),
                 "auto:partial_prefills=ordered": _row(50, 1100, tpot=8)}
    rec = recommend(summaries, configs, baseline="default")
    assert rec["row"] == "auto:partial_prefills=ordered" and rec["config"] == {"policy": "auto",
                                                                                "partial_prefills": "ordered"}
    assert rec["short_ttft_p95_ms"] == {"before": 500, "after": 50}
    assert rec["long_ttft_p95_change"] == pytest.approx(0.10)
    assert rec["short_tpot_p50_change"] == pytest.approx(0.60)
    prefix = "vllm serve MODEL --scheduler-cls prefillq.integrations.vllm.Scheduler --additional-config '"
    assert rec["command"].startswith(prefix) and rec["command"].endswith("'")
    pasted = json.loads(rec["command"].removeprefix(prefix)[:-1])
    assert load_config(pasted["prefillq"]) == configs["auto:partial_prefills=ordered"]  # the line runs that row


@pytest.mark.parametrize(("long_p95", "tput", "chosen"), [
    (1150, 100, "fast"),      # exactly +15% long TTFT p95: allowed
    (1151, 100, "hrrn"),      # over it: the next best
    (1000, 98, "fast"),       # exactly -2% throughput: allowed
    (1000, 97.9, "hrrn"),     # under it
])
def test_the_limits_on_long_ttft_and_throughput(long_p95, tput, chosen):
    configs = {"default": PolicyConfig(), "hrrn": PolicyConfig("hrrn"), "fast": PolicyConfig("auto")}
    summaries = {"default": _row(500), "hrrn": _row(100), "fast": _row(10, long_p95, tput)}
    rec = recommend(summaries, configs, baseline="default")
    assert rec["row"] == chosen
    assert (rec["candidates"]["fast"] is None) == (chosen == "fast")


def test_strict_short_first_has_no_starvation_bound_and_is_never_recommended():
    assert not has_starvation_bound(load_config({"policy": "srf"}))
    assert has_starvation_bound(load_config({"policy": "srf", "long_max_wait_ms": 2000}))
    for policy in ("default", "promote_shortest", "hrrn", "auto"):
        assert has_starvation_bound(PolicyConfig(policy))
    configs = _configs("default", "srf", "srf:long_max_wait_ms=2000")
    summaries = {"default": _row(500), "srf": _row(10), "srf:long_max_wait_ms=2000": _row(20)}
    rec = recommend(summaries, configs, baseline="default")
    assert rec["row"] == "srf:long_max_wait_ms=2000"
    assert "starvation bound" in rec["candidates"]["srf"]
    assert rec["config"] == {"policy": "short_request_first", "threshold": 256, "long_max_wait_ms": 2000}


def test_default_is_the_fallback_and_runs_stock_vllm():
    configs = _configs("default", "hrrn", "srf")
    summaries = {"default": _row(500), "hrrn": _row(100, long_p95=2000), "srf": _row(10)}
    rec = recommend(summaries, configs, baseline="default")
    assert rec["row"] == "default" and rec["is_default"] and rec["command"] == "vllm serve MODEL"
    assert rec["short_ttft_p95_ms"] == {"before": 500, "after": 500}


def test_ties_go_to_the_lower_long_ttft_then_to_the_earlier_row():
    configs = _configs("default", "hrrn", "promote_shortest", "auto")
    summaries = {"default": _row(500), "hrrn": _row(100, 1010), "promote_shortest": _row(100, 1005),
                 "auto": _row(100, 1005)}
    assert recommend(summaries, configs, baseline="default")["row"] == "promote_shortest"


def test_without_a_default_row_only_the_bound_is_checked_and_the_cost_is_unknown():
    configs = _configs("hrrn", "srf")
    summaries = {"hrrn": _row(100, 9999, 1), "srf": _row(10)}
    rec = recommend(summaries, configs, baseline=None)
    assert rec["row"] == "hrrn" and rec["short_ttft_p95_ms"]["before"] is None
    assert rec["long_ttft_p95_change"] is None and rec["rule"]["limits_checked"] is False


def test_lightllm_mode_names_one_of_its_own_strategies_and_what_auto_would_add():
    configs = _configs("default", "promote_shortest", "hrrn", "srf:long_max_wait_ms=500", "auto")
    summaries = {"default": _row(500), "promote_shortest": _row(150), "hrrn": _row(140),
                 "srf:long_max_wait_ms=500": _row(20), "auto": _row(90, 1100)}
    rec = recommend(summaries, configs, baseline="default", mode="lightllm")
    assert rec["row"] == "hrrn" and rec["command"] == "--prefill_queue_strategy hrrn"
    assert rec["auto"]["row"] == "auto" and rec["auto"]["qualifies"]
    assert rec["auto"]["short_ttft_p95_ms"]["after"] == 90
    summaries["auto"] = _row(90, 1500)
    auto = recommend(summaries, configs, baseline="default", mode="lightllm")["auto"]
    assert not auto["qualifies"] and "long TTFT p95 +50%" in auto["why_not"]


def test_native_config_names_what_differs_from_the_defaults():
    assert native_config(PolicyConfig("hrrn")) == {"policy": "hrrn"}
    assert native_config(load_config({"policy": "default", "partial_prefills": "ordered"})) == {
        "policy": "default", "partial_prefills": "ordered"}
    assert vllm_command(load_config({"policy": "hrrn"})).endswith("""'{"prefillq": {"policy": "hrrn"}}'""")


def test_the_default_compare_run_recommends_auto_with_ordered_partial_prefills():
    from prefillq.sim.compare import CompareSettings, comparison_details, prepare_comparison

    settings = CompareSettings(jobs=1)
    comparison = prepare_comparison(settings).run()
    rec = comparison_details(settings, comparison)["recommendation"]
    assert rec["row"] == "auto:partial_prefills=ordered"
    # within 1.25x of the best a clairvoyant schedule reaches, and long requests within the limit
    assert rec["short_ttft_p95_ms"]["after"] <= 1.25 * comparison.achievable["short_ttft_p95_ms"]
    assert rec["long_ttft_p95_change"] <= 0.15


# --- emulations of other engines' options (--policies peers) --------------------------------------------------

@pytest.mark.parametrize("mode", ["vllm", "lightllm"])
def test_an_emulated_peer_option_is_never_recommended_however_good_its_numbers(mode):
    configs = _configs("default", "hrrn", "sglang_spf:partial_prefills=ordered", "trtllm_suf", "dynamo_wspt")
    summaries = {"default": _row(500), "hrrn": _row(100), "sglang_spf:partial_prefills=ordered": _row(5),
                 "trtllm_suf": _row(6), "dynamo_wspt": _row(7)}
    rec = recommend(summaries, configs, baseline="default", mode=mode)
    assert rec["row"] == "hrrn"
    engine = "prefillq's vLLM plug-in" if mode == "vllm" else "LightLLM"
    for label in ("sglang_spf:partial_prefills=ordered", "trtllm_suf", "dynamo_wspt"):
        assert rec["candidates"][label].startswith("an emulation of ")
        assert rec["candidates"][label].endswith(f"{engine} does not run it")
    assert "SGLang --schedule-policy shortest-prefill-first" in rec["candidates"]["sglang_spf:partial_prefills=ordered"]


def test_in_vllm_mode_prefillq_s_own_rows_still_win_beside_the_peers_and_default_is_the_fallback():
    configs = _configs("default", "auto:partial_prefills=ordered", "sglang_hrrn")
    summaries = {"default": _row(500), "auto:partial_prefills=ordered": _row(50), "sglang_hrrn": _row(10)}
    assert recommend(summaries, configs, baseline="default")["row"] == "auto:partial_prefills=ordered"
    summaries["auto:partial_prefills=ordered"] = _row(50, long_p95=5000)  # over the long TTFT limit
    rec = recommend(summaries, configs, baseline="default")
    assert rec["row"] == "default" and rec["command"] == "vllm serve MODEL"


def test_in_lightllm_mode_only_lightllm_s_own_strategies_are_the_answer_beside_peers():
    configs = _configs("default", "auto", "sglang_hrrn", "dynamo_wspt")
    summaries = {"default": _row(500), "auto": _row(50), "sglang_hrrn": _row(10), "dynamo_wspt": _row(9)}
    rec = recommend(summaries, configs, baseline="default", mode="lightllm")
    assert rec["row"] == "default" and rec["command"] == "--prefill_queue_strategy default"
    assert rec["auto"]["row"] == "auto"  # what prefillq's auto would add, never a peer


def test_with_only_emulated_rows_there_is_no_recommendation():
    configs = _configs("sglang_hrrn", "trtllm_suf")
    summaries = {"sglang_hrrn": _row(10), "trtllm_suf": _row(20)}
    assert recommend(summaries, configs, baseline=None) is None
    assert recommend(summaries, configs, baseline=None, mode="lightllm") is None


def test_every_peer_policy_names_the_engine_option_it_emulates():
    from prefillq.config import PEER_POLICIES
    from prefillq.sim.recommend import PEER_OPTIONS, emulated_option, emulations

    assert set(PEER_OPTIONS) == set(PEER_POLICIES)
    assert emulated_option(load_config("sglang-hrrn")) == "SGLang --schedule-policy hrrn"
    assert emulated_option(load_config("auto")) is None and emulated_option(PolicyConfig()) is None
    configs = _configs("default", "trtllm_suf", "auto", "dynamo_wspt")
    assert emulations(configs) == {"trtllm_suf": PEER_OPTIONS["trtllm_suf"], "dynamo_wspt": PEER_OPTIONS["dynamo_wspt"]}


@pytest.mark.parametrize(("fast_short", "fast_long", "named"), [
    (10, 1400, True),       # far better short tail, long TTFT p95 +40%: named beside the answer
    (95, 1400, False),      # within a tenth of the answer's 100 ms: not worth naming
    (10, 1100, False),      # within the limits: it is the answer itself
])
def test_the_better_short_tail_the_limits_turned_down_is_named_not_chosen(fast_short, fast_long, named):
    from prefillq.cli.recommendation import over_limit_line

    configs = _configs("default", "hrrn", "srf", "auto:partial_prefills=ordered")
    summaries = {"default": _row(500), "hrrn": _row(100), "srf": _row(1),  # strict srf: no bound, never named
                 "auto:partial_prefills=ordered": _row(fast_short, fast_long)}
    rec = recommend(summaries, configs, baseline="default")
    over = rec["over_limit"]
    if fast_long <= 1150:
        assert rec["row"] == "auto:partial_prefills=ordered" and over is None
        return
    assert rec["row"] == "hrrn"  # the recommendation never crosses the limits
    assert (over is not None) == named
    if named:
        assert over["row"] == "auto:partial_prefills=ordered"
        assert over["long_ttft_p95_change"] == pytest.approx(0.40)
        line = over_limit_line(rec)
        assert "auto:partial_prefills=ordered reaches 10.0 ms" in line and "+40%" in line and "limit +15%" in line
        assert line.endswith("; --long-cost-limit 40 accepts it.")
        # the limit the line names is the one that lets the row through
        wider = recommend(summaries, configs, baseline="default", long_limit=0.40)
        assert wider["row"] == "auto:partial_prefills=ordered" and wider["over_limit"] is None
        assert wider["rule"]["long_ttft_p95_max_change"] == 0.40
        assert recommend(summaries, configs, baseline="default", long_limit=0.39)["row"] == "hrrn"
    else:
        assert over_limit_line(rec) is None


def test_compare_s_long_cost_limit_lets_the_named_trade_through() -> None:
    import os
    import subprocess
    import sys

    def run(*extra: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "prefillq", "compare", "--scenario", "long-then-stream",
                               "--no-achievable", "--format", "json", *extra], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "COLUMNS": "80"})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["recommendation"]

    plain = run()
    assert plain["row"] == "promote_shortest"  # every short-first row costs long requests +31% or more
    over = plain["over_limit"]
    assert over["row"] == "auto:partial_prefills=ordered" and over["long_ttft_p95_change"] > 0.15
    wider = run("--long-cost-limit", str(int(over["long_ttft_p95_change"] * 100) + 1))
    assert wider["row"] == "auto:partial_prefills=ordered" and wider["over_limit"] is None
