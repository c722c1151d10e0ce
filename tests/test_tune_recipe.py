"""prefillq tune, the recipe around the simulator: which runs it makes, windows, JSON, histogram.

A scripted stand-in for the simulator keeps these tests exact; the real simulator is exercised in
tests/test_tune_cli.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefillq.config import PolicyConfig, load_config
from prefillq.tune import (
    SIM_REQUEST_TARGET,
    STRICT_ORDERED_WARNING,
    TuneError,
    choose_long_max_wait,
    plot_histogram,
    simulation_window,
    strict_ordered_warning,
    tune,
)
from prefillq.workload import RequestSpec, Workload


@dataclass
class FakeResult:
    summary: dict[str, Any]
    long_waits_s: list[float]


@dataclass
class ScriptedSimulator:
    """Returns fixed summaries per policy; records every call."""

    long_waits_s: list[float]
    short_p95: dict[str, float] = field(default_factory=lambda: {
        "default": 900.0, "promote_shortest": 500.0, "hrrn": 420.0, "short_request_first": 200.0,
        "auto": 260.0})
    ordered_short_p95: dict[str, float] = field(default_factory=dict)   # "ordered" runs; else as "first"
    ordered_long_p95: float = 1500.0
    calls: list[tuple[int, PolicyConfig, dict]] = field(default_factory=list)
    classes_follow: list[int | None] = field(default_factory=list)

    def __call__(self, workload: Workload, policy: PolicyConfig, **kwargs: Any) -> FakeResult:
        self.calls.append((len(workload.requests), policy, kwargs))
        longest_short = max((r.prompt_tokens for r in workload.requests if r.klass == "short"), default=0)
        shortest_long = min((r.prompt_tokens for r in workload.requests if r.klass == "long"), default=10**9)
        threshold = workload.params.get("long_threshold")
        ok = threshold is not None and longest_short <= threshold < shortest_long
        self.classes_follow.append(threshold if ok else None)
        ordered = policy.partial_prefills == "ordered"
        p95 = self.ordered_short_p95.get(policy.policy, self.short_p95[policy.policy]) if ordered \
            else self.short_p95[policy.policy]
        long_p95 = self.ordered_long_p95 if ordered else 1500.0
        summary = {"short_ttft_p50_ms": p95 / 3, "short_ttft_p95_ms": p95, "long_ttft_p95_ms": long_p95,
                   "long_e2e_p95_ms": 3000.0, "short_tpot_p50_ms": 10.0, "output_tokens_per_s": 1000.0,
                   "completed": len(workload.requests), "failed": 0}
        return FakeResult(summary=summary, long_waits_s=list(self.long_waits_s))


def bimodal_workload(count: int = 1200, seed: int = 0, rate: float = 10.0) -> Workload:
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        long = rng.random() < 0.25
        prompt = int(np.exp(rng.normal(np.log(8192 if long else 128), 0.25)))
        requests.append(RequestSpec(f"r{i}", round(i / rate, 6), prompt, 64, "long" if long else "short"))
    return Workload(name="synthetic", requests=requests, params={"trace": "synthetic.csv", "format": "azure-csv",
                                                                  "rate_scale": 1.0})


WAITS = [i / 1000 for i in range(0, 1001, 10)]  # P90 900 ms, P95 950 ms


def test_tune_runs_strict_then_the_five_policies_then_four_ordered_with_the_tuned_wait() -> None:
    sim = ScriptedSimulator(long_waits_s=WAITS)
    seen: list[tuple[str, int, int]] = []
    result = tune(bimodal_workload(), simulate=sim, profile="p", budget=2048, w_slo_ms=3000,
                  progress=lambda label, done, total: seen.append((label, done, total)))
    policies = [(c[1].policy, c[1].long_max_wait_ms) for c in sim.calls]
    assert policies[0] == ("short_request_first", 0.0)  # strict first, to measure W_normal
    assert [p for p, _ in policies[1:]] == ["default", "promote_shortest", "hrrn", "short_request_first", "auto",
                                            "promote_shortest", "hrrn", "short_request_first", "auto"]
    # The last four runs repeat the reordering policies with partial_prefills="ordered" (SPEC §3.6).
    assert [c[1].partial_prefills for c in sim.calls] == ["first"] * 6 + ["ordered"] * 4
    assert policies[4][1] == policies[-2][1] == result.wait.long_max_wait_ms
    assert 950 <= result.wait.long_max_wait_ms <= 3000
    assert all(c[2] == {"profile": "p", "budget": 2048} for c in sim.calls)
    assert all(c[1].threshold == result.threshold.threshold for c in sim.calls
               if c[1].policy == "short_request_first")
    # Every simulated request is classed by the tuned threshold, so "short" means the same in every row.
    assert sim.classes_follow == [result.threshold.threshold] * 10
    assert seen[0][1:] == (0, 10) and seen[-1] == ("done", 10, 10)
    assert result.policy == "short_request_first"
    assert result.threshold.method == "kde_valley"


def test_json_has_every_number_and_configs_round_trip(tmp_path: Path) -> None:
    result = tune(bimodal_workload(), simulate=ScriptedSimulator(long_waits_s=WAITS), w_slo_ms=3000)
    data = json.loads(result.write_json(tmp_path / "t.json").read_text())
    for key in ("threshold", "threshold_method", "long_max_wait_ms", "w_normal_p90_ms", "w_normal_p95_ms",
                "policy", "w_slo_ms", "favor", "lanes", "predicted", "configs", "explanation", "window"):
        assert key in data
    assert data["w_normal_p90_ms"] == pytest.approx(900)
    assert data["w_normal_p95_ms"] == pytest.approx(950)
    assert set(data["predicted"]) >= {"default", "promote_shortest", "hrrn", "short_request_first"}
    config = load_config(data["configs"]["vllm_additional_config"])
    assert (config.policy, config.threshold, config.long_max_wait_ms) == (
        "short_request_first", data["threshold"], data["long_max_wait_ms"])


def test_w_normal_at_or_above_w_slo_reports_threshold_or_capacity_with_evidence() -> None:
    sim = ScriptedSimulator(long_waits_s=WAITS)
    result = tune(bimodal_workload(), simulate=sim, w_slo_ms=500)
    assert result.wait.capacity_problem
    assert result.wait.long_max_wait_ms == pytest.approx(950)  # W_normal, not W_slo
    assert sim.calls[-2][1].long_max_wait_ms == pytest.approx(950)  # the last short_request_first run
    assert any("FCFS" in line and "capacity is short" in line for line in result.wait.evidence)
    text = "\n".join(result.explanation)
    assert "threshold or the capacity is the problem" in text
    assert "Evidence:" in text


def test_a_long_trace_is_simulated_on_its_busiest_window_and_says_so() -> None:
    workload = bimodal_workload(count=6000, rate=5.0)
    # Make one stretch busier: double the prompt tokens of requests 4000..4999.
    workload.requests[4000:5000] = [
        RequestSpec(r.request_id, r.arrival_s, r.prompt_tokens * 2, r.output_tokens, r.klass)
        for r in workload.requests[4000:5000]]
    window, info = simulation_window(workload, target_requests=2500)
    assert not info["whole_trace"]
    assert 2000 <= info["requests"] <= 3000
    assert window.requests[0].arrival_s == 0.0
    assert info["start_s"] <= 800 <= 1000 <= info["end_s"]  # covers the busy stretch (800-1000 s)
    assert "busiest" in info["description"]
    whole, info = simulation_window(workload, window_s=0, target_requests=2500)
    assert info["whole_trace"] and len(whole.requests) == 6000
    _, info = simulation_window(workload)  # 6,000 requests fit the default target: whole trace
    assert info["whole_trace"] == (len(workload.requests) <= SIM_REQUEST_TARGET)
    fixed, info = simulation_window(workload, window_s=60)
    assert info["end_s"] - info["start_s"] == 60 and len(fixed.requests) == 300


def test_tune_refuses_an_empty_workload_and_a_bad_favor() -> None:
    with pytest.raises(TuneError, match="no requests"):
        tune(Workload("empty", [], {}), simulate=ScriptedSimulator(long_waits_s=[]))
    with pytest.raises(TuneError, match="favor"):
        tune(bimodal_workload(), simulate=ScriptedSimulator(long_waits_s=[]), favor="middle")


def test_histogram_png_is_written(tmp_path: Path) -> None:
    result = tune(bimodal_workload(), simulate=ScriptedSimulator(long_waits_s=WAITS))
    path = plot_histogram(result, tmp_path / "sub" / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


# --- partial_prefills = "ordered" (SPEC §3.6) ----------------------------------------------------

def test_ordered_is_recommended_where_it_clearly_wins_and_the_configs_carry_it(tmp_path: Path) -> None:
    sim = ScriptedSimulator(long_waits_s=WAITS, ordered_short_p95={"short_request_first": 120.0})
    result = tune(bimodal_workload(), simulate=sim, w_slo_ms=3000)
    assert (result.policy, result.partial_prefills) == ("short_request_first", "ordered")
    config = load_config(result.configs["vllm_additional_config"])
    assert (config.policy, config.partial_prefills) == ("short_request_first", "ordered")
    assert "cannot express" in result.configs["vllm_ascend_note"]
    assert "already orders partial prefills" in result.configs["lightllm_note"]
    assert load_config(result.configs["vllm_ascend_additional_config"]).partial_prefills == "first"
    data = json.loads(result.write_json(tmp_path / "t.json").read_text())
    assert data["partial_prefills"] == "ordered" and data["warnings"] == []
    detail = data["partial_prefills_detail"]["per_policy"]["short_request_first"]
    assert detail["short_ttft_p95_first_ms"] == 200 and detail["short_ttft_p95_ordered_ms"] == 120
    assert detail["short_ttft_p95_gain"] == pytest.approx(0.4) and detail["supported"] is True
    assert set(data["predicted"]) >= {"hrrn (ordered)", "promote_shortest (ordered)",
                                      "short_request_first (ordered)"}
    assert any(line.startswith("Partial prefills ordered:") for line in result.explanation)


@pytest.mark.parametrize("ordered_p95, ordered_long, why", [
    (195.0, 1500.0, "not a clear gain"),          # within the 5% "same result" tolerance
    (260.0, 1500.0, "not a clear gain"),          # worse
    (100.0, 9000.0, "exceeds default"),           # a big gain, but long TTFT P95 beyond default + W_slo
])
def test_ordered_is_not_recommended_without_a_clear_gain_within_the_slo(
        ordered_p95: float, ordered_long: float, why: str) -> None:
    sim = ScriptedSimulator(long_waits_s=WAITS, ordered_short_p95={"short_request_first": ordered_p95},
                            ordered_long_p95=ordered_long)
    result = tune(bimodal_workload(), simulate=sim, w_slo_ms=3000)
    assert (result.policy, result.partial_prefills) == ("short_request_first", "first")
    assert why in result.ordered.reason
    assert "partial_prefills" not in json.loads(result.configs["vllm_additional_config"])["prefillq"]
    assert result.configs["vllm_ascend_note"] == result.configs["lightllm_note"] == ""


def test_ordered_can_turn_a_kept_default_into_a_policy() -> None:
    flat = {"default": 900.0, "promote_shortest": 890.0, "hrrn": 880.0, "short_request_first": 870.0,
            "auto": 875.0}
    sim = ScriptedSimulator(long_waits_s=WAITS, short_p95=flat, ordered_short_p95={"hrrn": 500.0})
    result = tune(bimodal_workload(), simulate=sim, w_slo_ms=3000)
    assert (result.policy, result.partial_prefills) == ("hrrn", "ordered")
    assert result.ordered.policy_switched_from == "default"
    assert json.loads(result.configs["vllm_additional_config"]) == {
        "prefillq": {"policy": "hrrn", "partial_prefills": "ordered"}}


def test_strict_short_first_with_ordered_is_recommended_with_a_warning(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The recipe's wait is never 0 today (it lies in [W_normal, W_slo] and off 0); force a strict one to
    # check that the SPEC §3.6 warning reaches the result, the explanation and the JSON.
    import prefillq.tune.choose as choose

    def strict(long_waits_s: Any, **kwargs: Any) -> Any:
        return replace(choose_long_max_wait(long_waits_s, **kwargs), long_max_wait_ms=0.0)

    monkeypatch.setattr(choose, "choose_long_max_wait", strict)
    sim = ScriptedSimulator(long_waits_s=WAITS, ordered_short_p95={"short_request_first": 100.0})
    result = tune(bimodal_workload(), simulate=sim, w_slo_ms=3000)
    assert result.wait.long_max_wait_ms == 0
    assert (result.policy, result.partial_prefills) == ("short_request_first", "ordered")
    assert result.warnings == [STRICT_ORDERED_WARNING]
    assert "wait indefinitely" in STRICT_ORDERED_WARNING
    assert json.loads(result.write_json(tmp_path / "t.json").read_text())["warnings"] == [STRICT_ORDERED_WARNING]
    assert any("wait indefinitely" in line for line in result.explanation)


def test_the_strict_warning_needs_srf_ordered_and_a_zero_wait() -> None:
    assert strict_ordered_warning("short_request_first", 0.0, "ordered") == STRICT_ORDERED_WARNING
    assert strict_ordered_warning("short_request_first", 0.0, "first") is None
    assert strict_ordered_warning("short_request_first", 10.0, "ordered") is None
    assert strict_ordered_warning("hrrn", 0.0, "ordered") is None
