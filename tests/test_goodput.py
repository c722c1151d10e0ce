"""TTFT-SLO goodput (SPEC §6): the SLO parser and the one definition, on hand-computed records."""

from __future__ import annotations

import pytest

from prefillq.metrics import RequestRecord, ttft_goodput
from prefillq.slo import SloError, SloTerm, parse_ttft_slo


@pytest.mark.parametrize(("text", "default", "per_class"), [
    ("200ms+0.1ms/token", SloTerm(200, 0.1), {}),
    ("0.1ms/token + 200ms", SloTerm(200, 0.1), {}),
    ("5s", SloTerm(5000, 0), {}),
    ("0.002s/token", SloTerm(0, 2), {}),
    ("short=200ms+0.1ms/token,long=5s", None, {"short": SloTerm(200, 0.1), "long": SloTerm(5000, 0)}),
    ("1s, long=5s", SloTerm(1000, 0), {"long": SloTerm(5000, 0)}),
])
def test_parses_slos_as_people_state_them(text, default, per_class) -> None:
    slo = parse_ttft_slo(text)
    assert slo.default == default
    assert slo.per_class == per_class


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty TTFT SLO"),
    ("200", "cannot read '200'"),
    ("200ms+", "cannot read ''"),
    ("200ms+300ms", "two base times"),
    ("0.1ms/token+0.2ms/token", "two per-token allowances"),
    ("medium=1s", "unknown request class 'medium'; valid classes: short, long"),
    ("short=1s,short=2s", "names class 'short' twice"),
    ("1s,2s", "two terms for every class"),
    ("0ms", "allows no time at all"),
    ("1s,", "empty part"),
    ("200 msec", "cannot read '200 msec'"),
])
def test_bad_slos_name_the_problem(text, message) -> None:
    with pytest.raises(SloError) as info:
        parse_ttft_slo(text)
    assert message in str(info.value)


def record(klass: str, prompt: int, ttft_ms: float | None, error: str | None = None) -> RequestRecord:
    ttft = None if ttft_ms is None else ttft_ms / 1000
    return RequestRecord(f"{klass}{prompt}{ttft_ms}", klass, prompt, 4, 0.0, 0.0, ttft,
                         None if ttft is None else ttft + 0.01, error=error)


def test_goodput_on_hand_computed_records() -> None:
    slo = parse_ttft_slo("200ms+0.1ms/token")
    records = [
        record("short", 100, 210.0),   # limit 210 ms: met (at the limit)
        record("short", 100, 210.5),   # missed
        record("short", 1000, 250.0),  # limit 300: met
        record("short", 50, None, error="timeout"),  # no first token: missed
        record("long", 8000, 900.0),   # limit 1000: met
        record("long", 8000, 1100.0),  # missed
    ]
    assert ttft_goodput(records, slo) == {"goodput": 3 / 6, "short_goodput": 2 / 4, "long_goodput": 1 / 2}


def test_goodput_per_class_and_uncovered_classes() -> None:
    records = [record("short", 100, 150.0), record("long", 8000, 4000.0), record("long", 8000, 6000.0)]
    assert ttft_goodput(records, parse_ttft_slo("short=100ms,long=5s")) == {
        "goodput": 1 / 3, "short_goodput": 0.0, "long_goodput": 0.5}
    # Only long requests have an SLO: short ones are left out, not counted as misses.
    assert ttft_goodput(records, parse_ttft_slo("long=5s")) == {
        "goodput": 0.5, "short_goodput": None, "long_goodput": 0.5}


# --- tune --ttft-slo: the configuration with the highest goodput -----------------------------------

def summaries_with(goodputs: dict[str, float]) -> dict[str, dict]:
    return {label: {"goodput": g, "short_ttft_p95_ms": 100.0} for label, g in goodputs.items()}


def test_tune_chooses_the_highest_goodput_first_or_ordered() -> None:
    from prefillq.tune.goodput import choose_by_goodput

    slo = parse_ttft_slo("200ms")
    summaries = summaries_with({"default": 0.5, "promote_shortest": 0.6, "hrrn": 0.7, "short_request_first": 0.8,
                                "auto": 0.81, "hrrn (ordered)": 0.9, "auto (ordered)": 0.85})
    best = choose_by_goodput(summaries, slo, usual=("short_request_first", "first"))
    assert (best.policy, best.partial_prefills, best.goodput) == ("hrrn", "ordered", 0.9)
    assert "90.0% of requests meet it" in best.reason


def test_tune_goodput_ties_keep_the_usual_recommendation() -> None:
    from prefillq.tune.goodput import choose_by_goodput

    summaries = summaries_with({"default": 1.0, "hrrn": 1.0, "short_request_first": 0.998, "auto (ordered)": 1.0})
    best = choose_by_goodput(summaries, parse_ttft_slo("5s"), usual=("short_request_first", "first"))
    assert (best.policy, best.partial_prefills) == ("short_request_first", "first")
    # Without the usual one among the equals, "first" beats "ordered", then the candidates' order.
    best = choose_by_goodput(summaries, parse_ttft_slo("5s"), usual=("promote_shortest", "first"))
    assert (best.policy, best.partial_prefills) == ("default", "first")


def test_tune_with_an_slo_recommends_its_choice(tmp_path) -> None:
    """Through the whole recipe: a simulator whose runs carry records, the goodput deciding."""
    from dataclasses import dataclass

    from prefillq.tune import tune
    from tests.test_tune_recipe import WAITS, bimodal_workload

    @dataclass
    class Result:
        summary: dict
        long_waits_s: list
        records: list

    def simulate(workload, policy, **kwargs):
        # hrrn with "ordered" meets a 300 ms SLO for every request; every other run for none.
        wins = policy.policy == "hrrn" and policy.partial_prefills == "ordered"
        records = [record(r.klass, r.prompt_tokens, 100.0 if wins else 1000.0) for r in workload.requests[:50]]
        summary = {"short_ttft_p50_ms": 50.0, "short_ttft_p95_ms": 200.0 if policy.policy != "default" else 900.0,
                   "long_ttft_p95_ms": 1500.0, "long_e2e_p95_ms": 3000.0, "short_tpot_p50_ms": 10.0,
                   "output_tokens_per_s": 1000.0, "completed": 50, "failed": 0}
        return Result(summary, list(WAITS), records)

    result = tune(bimodal_workload(), simulate=simulate, w_slo_ms=3000, ttft_slo=parse_ttft_slo("300ms"))
    assert result.choice.policy == "hrrn"
    assert result.partial_prefills == "ordered"
    assert result.summaries["hrrn (ordered)"]["goodput"] == 1.0
    assert result.summaries["default"]["goodput"] == 0.0
    assert "maximises goodput" in result.choice.reason


# --- compare --ttft-slo ----------------------------------------------------------------------------

def test_compare_reports_goodput_per_policy_short_and_long(tmp_path) -> None:
    import json

    from tests.test_compare_cli import run

    out = tmp_path / "c.json"
    result = run("--scenario", "interleaved", "--policy", "default", "--policy", "auto:partial_prefills=ordered",
                 "--ttft-slo",
                 "short=300ms+0.1ms/token,long=30s", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "TTFT-SLO goodput" in result.output
    policies = json.loads(out.read_text())["policies"]
    for row in policies.values():
        assert set(row) >= {"goodput", "short_goodput", "long_goodput"}
        assert 0 <= row["short_goodput"] <= 1 and row["long_goodput"] == 1.0  # nothing waits 30 s here
    assert policies["auto:partial_prefills=ordered"]["short_goodput"] > policies["default"]["short_goodput"]


def test_compare_refuses_a_bad_slo_with_exit_2() -> None:
    from tests.test_compare_cli import run

    result = run("--scenario", "interleaved", "--ttft-slo", "short=200")
    assert result.exit_code == 2
    assert "--ttft-slo" in result.output and "cannot read '200'" in result.output


# --- bench --ttft-slo: per-run goodput, medians over rounds and the paired interval ----------------

def test_bench_summary_has_goodput_with_its_paired_interval() -> None:
    import math

    from prefillq.bench.analysis import LoadedRun, ProtocolSettings, run_metrics, summarize_runs

    # Per round, of 10 short requests: default meets the 200 ms SLO with 4/5/5, auto with 8/9/10.
    met = {"default": [4, 5, 5], "auto": [8, 9, 10]}
    runs = []
    for round_index in range(3):
        for position, policy in enumerate(["default", "auto"] if round_index % 2 == 0 else ["auto", "default"]):
            records = [record("short", 100, 100.0 if i < met[policy][round_index] else 400.0) for i in range(10)]
            for i, r in enumerate(records):
                r.request_id, r.sent_at = f"{policy}-{round_index}-{i}", i * 0.01
                r.scheduled_at = r.sent_at
            info = {"policy": policy, "phase": "measured", "round": round_index, "position": position}
            runs.append(LoadedRun(info=info, records=records, metrics=run_metrics(records)))
    settings = ProtocolSettings(ttft_slo="200ms", lateness_limit_ms=1e9, throughput_drop=1.0)
    summary = summarize_runs(runs, settings)
    assert summary["policies"]["default"]["short_goodput"] == 0.5
    assert summary["policies"]["auto"]["short_goodput"] == 0.9
    assert summary["settings"]["ttft_slo"] == "200ms"
    interval = summary["intervals"]["auto_vs_default"]["metrics"]["short_goodput"]
    ratios = [math.log(a / d) for a, d in zip([0.8, 0.9, 1.0], [0.4, 0.5, 0.5], strict=True)]
    assert interval["n"] == 3
    assert interval["mean_log_ratio"] == pytest.approx(sum(ratios) / 3)
    assert interval["ci_low"] < interval["change"] < interval["ci_high"]
    # Without an SLO, no goodput anywhere.
    plain = summarize_runs([LoadedRun(r.info, r.records, run_metrics(r.records)) for r in runs],
                           ProtocolSettings(lateness_limit_ms=1e9, throughput_drop=1.0))
    assert "goodput" not in plain["policies"]["auto"]
    assert "goodput" not in plain["intervals"]["auto_vs_default"]["metrics"]


def test_bench_and_report_take_ttft_slo(tmp_path) -> None:
    import json

    from prefillq.bench.mockserver import MockServer
    from tests.test_bench_cli import SMALL, run

    out = tmp_path / "res"
    with MockServer() as a, MockServer() as b:
        result = run("bench", "--url", a.url, "--url", b.url, "--policies", "default,auto", *SMALL, "--reps", "2",
                     "--warmup", "0", "--out", str(out), "--no-plots", "--ttft-slo", "short=10s,long=10s")
    assert result.exit_code == 0, result.output
    assert "TTFT-SLO goodput" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policies"]["auto"]["goodput"] == 1.0  # every mock request answers within 10 s
    assert "goodput" in summary["intervals"]["auto_vs_default"]["metrics"]
    # report re-reads the SLO the bench used; a bad one on the command line exits 2.
    assert "TTFT-SLO goodput" in run("report", str(out), "--no-plots").output
    bad = run("report", str(out), "--ttft-slo", "fast")
    assert bad.exit_code == 2 and "cannot read 'fast'" in bad.output


# --- sweep --ttft-slo ------------------------------------------------------------------------------

def test_sweep_rows_carry_goodput_and_a_bad_slo_is_refused() -> None:
    from prefillq.sweep import SweepError, grid_from
    from prefillq.sweep.grid import run_cell

    grid = grid_from({"scenario": "interleaved", "policies": ["default"], "ttft_slo": "short=300ms,long=60s"})
    (row,) = [run_cell(cell) for cell in grid.cells()]
    assert row["long_goodput"] == 1.0 and 0 <= row["short_goodput"] < 1  # FCFS shorts wait behind 16K prompts
    assert row["goodput"] == pytest.approx((row["short_goodput"] * 144 + 48) / 192)  # 144 short + 48 long
    plain = run_cell(grid_from({"scenario": "interleaved", "policies": ["default"]}).cells()[0])
    assert "goodput" not in plain
    with pytest.raises((SweepError, SloError), match="cannot read 'fast'"):
        grid_from({"scenario": "interleaved", "ttft_slo": "fast"})
