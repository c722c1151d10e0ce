"""The roofline cost form: its evaluation, profile validation, the fit's recovery, and the H200 profiles."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.calibrate import StepSample, fit_cost_model, gpu_step_samples, predict
from prefillq.sim.costs import (
    CostModel,
    ProfileError,
    RooflineCostModel,
    cost_from_dict,
    cost_to_dict,
    knee,
    list_profiles,
    load_profile,
    profile_from_dict,
)
from prefillq.sim.lightllm import lightllm_cost

DATA = Path(__file__).parent / "data" / "gpu"
TRUE = np.array([3.0e-3, 2.0e-5, 1.5e-9, 1.0e-6, 3.0e-8])
TRUE_SHAPE = (180.0, 2.0)


def sim_latency(cost: CostModel, sample: StepSample) -> float:
    """The simulator's evaluation of one step (node.py passes these aggregates)."""
    attention = sum(cost.attention_work(c, ctx) for c, ctx in sample.prefill_chunks)
    return cost.step_latency(sum(c for c, _ in sample.prefill_chunks), attention, len(sample.decode_contexts),
                             sum(sample.decode_contexts))


def roofline_steps(seed: int, shape: tuple[float, float], n: int = 120) -> list[StepSample]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        kind = rng.choice(["prefill", "decode", "mixed"])
        chunk = (rng.choice([1, 8, 32, 100, 256, 1024, 4096]), rng.choice([0, 512, 4000]))
        chunks = [chunk] if kind != "decode" else []
        seqs = rng.choice([1, 4, 16, 64, 256])
        decodes = [rng.randint(16, 4000) for _ in range(seqs)] if kind != "prefill" else []
        sample = StepSample(0.0, chunks, decodes)
        sample.seconds = predict(TRUE, sample, shape)
        steps.append(sample)
    return steps


@pytest.mark.parametrize("shape", [TRUE_SHAPE, (40.0, 0.5), (300.0, 16.0)])
def test_the_fit_recovers_a_known_roofline_model_exactly(shape):
    fit = fit_cost_model(roofline_steps(seed=3, shape=shape), form="roofline")
    assert fit.form == "roofline"
    assert fit.shape[1] == shape[1]
    assert fit.shape[0] == pytest.approx(shape[0], rel=1e-4)
    assert fit.as_vector() == pytest.approx(TRUE, rel=1e-3)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_a_linear_fit_cannot_follow_a_roofline():
    steps = roofline_steps(seed=3, shape=TRUE_SHAPE)
    linear = fit_cost_model(steps, trim=False)
    errors = [abs(linear.predict(s) / s.seconds - 1.0) for s in steps]
    assert max(errors) > 0.05  # the knee is visible in the data, so the roofline recovery above means something


def test_the_simulator_and_the_fit_price_a_step_alike():
    cost = RooflineCostModel(*TRUE, knee_tokens=TRUE_SHAPE[0], knee_exponent=TRUE_SHAPE[1])
    for sample in roofline_steps(seed=5, shape=TRUE_SHAPE, n=40):
        assert sim_latency(cost, sample) == pytest.approx(sample.seconds, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(0, 100_000), knee_tokens=st.floats(0.5, 5000), exponent=st.floats(0.25, 200))
def test_knee_lies_between_the_larger_term_and_the_sum_below_p_1_above_it(tokens, knee_tokens, exponent):
    value = knee(tokens, knee_tokens, exponent)
    assert value >= max(tokens, knee_tokens) * (1 - 1e-12)  # never cheaper than either bound (the bound's premise)
    if exponent >= 1:
        assert value <= (tokens + knee_tokens) * (1 + 1e-12)
    else:
        assert value >= (tokens + knee_tokens) * (1 - 1e-12)


def test_knee_of_large_exponent_is_the_max_and_of_exponent_1_the_sum():
    assert knee(1000, 100, 1000.0) == pytest.approx(1000, rel=1e-6)
    assert knee(10, 100, 1000.0) == pytest.approx(100, rel=1e-6)
    assert knee(10, 100, 1.0) == pytest.approx(110)
    assert knee(0, 0.0, 2.0) == 0.0


def test_old_profiles_keep_the_linear_form_and_its_numbers():
    for name in ("h100-qwen3.5-0.8b", "cpu-tiny-llama", "cpu-tiny-llama-epyc"):
        profile = load_profile(name)
        cost = profile.cost
        assert type(cost) is CostModel and cost.form == "linear"
        expected = (cost.step_overhead_s + cost.prefill_token_s * 300 + cost.attention_token2_s * 300 * 650
                    + cost.decode_seq_s * 7 + cost.decode_context_token_s * 9000)
        assert cost.step_latency(300, 300 * 650, 7, 9000) == expected
        assert "cost_form" not in cost_to_dict(cost)


def test_a_profile_declares_its_form_and_round_trips():
    data = {"cost_form": "roofline", "step_overhead_s": 0.003, "prefill_token_s": 2e-5, "knee_tokens": 150,
            "knee_exponent": 2}
    cost = cost_from_dict(data)
    assert isinstance(cost, RooflineCostModel)
    assert cost_from_dict(cost_to_dict(cost)) == cost
    assert cost.step_latency(0, 0, 1, 0) == pytest.approx(0.003 + 2e-5 * knee(1, 150, 2))


@pytest.mark.parametrize(("change", "message"), [
    ({"cost_form": "quadratic"}, "unknown cost_form 'quadratic'; valid: linear, roofline"),
    ({"knee_tokens": None}, "needs knee_tokens"),
    ({"knee_exponent": 0}, "knee_exponent must be"),
    ({"knee_tokens": -5}, "knee_tokens must be"),
    ({"cost_form": "linear"}, "only apply to cost_form \"roofline\""),
])
def test_profile_validation_names_the_bad_value(change, message):
    data = {"name": "x", "cost_form": "roofline", "step_overhead_s": 0.003, "prefill_token_s": 2e-5,
            "knee_tokens": 150, "knee_exponent": 2, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ProfileError, match=message.replace("(", r"\(")):
        profile_from_dict(data)


def test_lightllm_overrides_keep_the_roofline():
    profile = profile_from_dict({"cost_form": "roofline", "step_overhead_s": 0.003, "prefill_token_s": 2e-5,
                                 "knee_tokens": 150, "knee_exponent": 2, "lightllm": {"step_overhead_s": 0.01}})
    cost = lightllm_cost(profile)
    assert isinstance(cost, RooflineCostModel) and cost.knee_tokens == 150 and cost.step_overhead_s == 0.01


@pytest.mark.parametrize("model", ["qwen3-0.6b", "llama3-8b", "qwen3-32b"])
def test_each_h200_profile_predicts_its_measured_steps_within_target(model):
    assert f"h200-{model}" in list_profiles()
    cost = load_profile(f"h200-{model}").cost
    assert cost.form == "roofline"
    samples = gpu_step_samples(json.loads((DATA / f"h200-{model}-steps.json").read_text()))
    errors = np.array([abs(sim_latency(cost, s) / s.seconds - 1.0) for s in samples])
    assert len(samples) >= 30
    assert np.median(errors) <= 0.05
    assert errors.max() <= 0.20


@pytest.mark.parametrize("name", ["long-first", "sustained"])
def test_the_lower_bound_holds_on_a_roofline_profile(name):
    from prefillq.sim import lower_bounds, simulate
    from prefillq.workload import scenario

    w = scenario(name, seed=2)
    bound = lower_bounds(w, profile="h200-llama3-8b", budget=512)
    for policy in ("default", "hrrn", "short_request_first"):
        result = simulate(w, policy, profile="h200-llama3-8b", budget=512)
        ttfts = sorted(r.ttft_s for r in result.records if r.klass == "short")
        assert all(b <= t + 1e-12 for b, t in zip(sorted(bound["ttft_s"]), ttfts, strict=True))


def test_vllm_mode_defaults_to_the_measured_gpu_profile_and_lightllm_mode_to_the_published_fit():
    from prefillq.sim import simulate
    from prefillq.sim.costs import DEFAULT_PROFILES, default_profile
    from prefillq.workload import scenario

    assert DEFAULT_PROFILES == {"vllm": "h200-qwen3-0.6b", "lightllm": "h100-qwen3.5-0.8b"}
    w = scenario("low-load", seed=0)
    for mode in ("vllm", "lightllm"):
        implicit = simulate(w, "hrrn", mode=mode).summary
        explicit = simulate(w, "hrrn", mode=mode, profile=default_profile(mode)).summary
        assert implicit == explicit
    assert simulate(w, "hrrn").summary != simulate(w, "hrrn", profile="h100-qwen3.5-0.8b").summary


def test_calibrate_refuses_an_unknown_form(tmp_path):
    import typer
    from typer.testing import CliRunner

    from prefillq.cli.calibrate import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # two commands, so the calibrate command keeps its name
    result = CliRunner().invoke(app, ["calibrate", "--out", str(tmp_path / "p.json"), "--form", "cubic"])
    assert result.exit_code == 2
    assert "unknown --form 'cubic'; valid forms: linear, roofline" in result.output
