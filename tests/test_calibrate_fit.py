"""The fitting half of `prefillq calibrate`, on synthetic steps (no vLLM needed)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.calibrate import (
    COEFFICIENT_NAMES,
    StepSample,
    build_profile,
    design_phases,
    design_rounds,
    fit_cost_model,
    lower_envelope,
    model_vocab_size,
    nnls,
    predict,
    step_features,
    steps_from_log,
)

TRUE = np.array([2.0e-3, 9.0e-5, 2.0e-8, 4.0e-4, 6.0e-8])


def synthetic_steps(seed: int, n: int = 300, noise: float = 0.0) -> list[StepSample]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        kind = rng.choice(["prefill", "decode", "mixed"])
        chunks = ([(rng.randint(16, 1024), rng.choice([0, 0, 512, 2048, 6000]))
                   for _ in range(rng.randint(1, 3))] if kind != "decode" else [])
        decodes = [rng.randint(16, 7000) for _ in range(rng.randint(1, 64))] if kind != "prefill" else []
        sample = StepSample(0.0, chunks, decodes)
        sample.seconds = predict(TRUE, sample) * (1.0 + rng.gauss(0.0, noise))
        steps.append(sample)
    return steps


def test_features_follow_the_cost_model_formula():
    sample = StepSample(0.1, prefill_chunks=[(100, 0), (50, 200)], decode_contexts=[10, 30, 60])
    assert step_features(sample).tolist() == [1.0, 150.0, 100 * 50 + 50 * 225, 3.0, 100.0]
    assert sample.batch_class == "mixed"
    assert StepSample(0.1, [(1, 0)], []).batch_class == "prefill"
    assert StepSample(0.1, [], [5]).batch_class == "decode"


def test_noise_free_steps_recover_the_coefficients_exactly():
    fit = fit_cost_model(synthetic_steps(seed=1))
    assert fit.as_vector() == pytest.approx(TRUE, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.samples_trimmed == 0
    assert set(fit.classes) == {"prefill", "decode", "mixed"}
    assert all(c["median_abs_rel_error"] < 1e-6 for c in fit.classes.values())


def test_noisy_steps_recover_the_coefficients_closely():
    fit = fit_cost_model(synthetic_steps(seed=2, n=600, noise=0.03))
    assert fit.as_vector() == pytest.approx(TRUE, rel=0.2)
    assert fit.r2 > 0.98
    assert 0.0 < fit.classes["decode"]["median_abs_rel_error"] < 0.05


def test_disturbed_steps_are_trimmed_once_and_do_not_bend_the_fit():
    steps = synthetic_steps(seed=3, n=400, noise=0.01)
    for sample in steps[::40]:  # 10 steps slowed 5x by another process
        sample.seconds *= 5.0
    fit = fit_cost_model(steps)
    assert fit.samples_trimmed == 10
    assert fit.samples_used == 390
    assert fit.as_vector() == pytest.approx(TRUE, rel=0.05)
    untrimmed = fit_cost_model(steps, trim=False)
    assert untrimmed.samples_trimmed == 0
    assert np.max(np.abs(untrimmed.as_vector() / TRUE - 1)) > np.max(np.abs(fit.as_vector() / TRUE - 1))


def test_coefficients_are_never_negative_even_when_least_squares_wants_it():
    # The decode-context term truly is 0 and the noise pushes its unconstrained estimate below 0.
    true = TRUE.copy()
    true[4] = 0.0
    rng = random.Random(5)
    steps = []
    for _ in range(200):
        sample = StepSample(0.0, [(rng.randint(16, 512), 0)] if rng.random() < 0.5 else [],
                            [rng.randint(16, 7000) for _ in range(rng.randint(1, 8))])
        context = sum(sample.decode_contexts)
        sample.seconds = predict(true, sample) - 2e-9 * context + 1e-4  # anti-correlated with context
        steps.append(sample)
    x = np.array([step_features(s) for s in steps])
    y = np.array([s.seconds for s in steps])
    unconstrained, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    assert unconstrained[4] < 0
    fit = fit_cost_model(steps, trim=False)
    assert all(v >= 0 for v in fit.coefficients.values())
    assert fit.coefficients["decode_context_token_s"] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=6, max_value=30))
def test_nnls_matches_a_brute_force_reference(seed, rows):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(rows, 4))
    b = rng.normal(size=rows)
    x = nnls(a, b)
    assert np.all(x >= 0)
    # Reference: the best over every support of the non-negative least-squares solutions, by a
    # different route (normal equations per support), must not beat ours.
    best = float(np.sum(b ** 2))
    for size in range(1, 5):
        for cols in itertools.combinations(range(4), size):
            sub = a[:, cols]
            sol = np.linalg.solve(sub.T @ sub, sub.T @ b)
            if np.all(sol >= 0):
                best = min(best, float(np.sum((sub @ sol - b) ** 2)))
    assert float(np.sum((a @ x - b) ** 2)) <= best + 1e-9


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 5 measured steps"):
        fit_cost_model(synthetic_steps(seed=4, n=3))


def test_lower_envelope_keeps_the_fastest_time_of_each_distinct_batch():
    a1 = StepSample(0.30, [(100, 0)], [])
    a2 = StepSample(0.10, [(100, 0)], [])
    b = StepSample(0.05, [(50, 0), (20, 8)], [7, 3])
    b_reordered = StepSample(0.04, [(20, 8), (50, 0)], [3, 7])   # same batch, listed in another order
    c = StepSample(0.02, [], [7])
    envelope = lower_envelope([a1, b, a2, c, b_reordered])
    assert sorted((s.seconds, s.repeats) for s in envelope) == [(0.02, 1), (0.04, 2), (0.10, 2)]
    assert a1.seconds == 0.30  # inputs untouched


def test_design_covers_every_batch_class_within_the_engine_limits():
    phases, warmup = design_phases(budget=1024, max_model_len=8192, vocab_size=2048, seed=0)
    assert warmup == 2
    other_round, _ = design_phases(budget=1024, max_model_len=8192, vocab_size=2048, seed=1)
    assert [[(len(p), o) for p, o in phase] for phase in other_round] == \
        [[(len(p), o) for p, o in phase] for phase in phases]  # same batches, fresh tokens
    assert other_round[5][0][0] != phases[5][0][0]
    requests = [r for phase in phases for r in phase]
    assert all(3 <= t < 2048 for prompt, _ in requests for t in prompt)
    assert all(len(prompt) + out <= 8192 for prompt, out in requests)
    lengths = {len(prompt) for prompt, _ in requests}
    assert min(lengths) <= 16 and max(lengths) > 6000          # tiny chunks and deep contexts
    assert max(len(phase) for phase in phases) >= 64            # large decode batches
    assert any(len(phase) > 1 and all(out == 1 for _, out in phase) for phase in phases)  # multi-chunk steps
    # prefix reuse on purpose: some prompt starts with an earlier prompt of >= 1024 tokens
    prompts = [tuple(p) for p, _ in requests]
    assert any(len(a) >= 1024 and len(b) > len(a) and b[:len(a)] == a for a in prompts for b in prompts)
    again, _ = design_phases(budget=1024, max_model_len=8192, vocab_size=2048, seed=0)
    assert again == phases


def test_a_small_design_stays_within_a_small_engine():
    phases, _ = design_phases(budget=256, max_model_len=2048, vocab_size=512, seed=1)
    requests = [r for phase in phases for r in phase]
    assert all(len(prompt) + out <= 2048 and max(prompt) < 512 for prompt, out in requests)
    assert all(len(prompt) > 0 and out >= 1 for prompt, out in requests)


def test_profile_has_the_simulator_format_and_the_fit_quality():
    fit = fit_cost_model(synthetic_steps(seed=6))
    engine = {"max_num_batched_tokens": 1024, "max_num_seqs": 256, "block_size": 128, "kv_blocks": 4096,
              "kv_bytes_per_token": 4096, "dtype": "bfloat16", "max_model_len": 8192}
    profile = build_profile("cpu-test", fit, engine, model="/nonexistent/model")
    assert profile["name"] == "cpu-test"
    for key in COEFFICIENT_NAMES:
        assert profile[key] == pytest.approx(fit.coefficients[key])
    assert profile["defaults"] == {"max_num_batched_tokens": 1024, "max_num_seqs": 256, "block_size": 128,
                                   "kv_blocks": 4096, "long_prefill_token_threshold": 0}
    assert profile["kv_transfer"]["bytes_per_token"] == 4096
    assert profile["calibration"]["r2"] == pytest.approx(1.0)


def test_profile_says_how_the_engine_ran():
    fit = fit_cost_model(synthetic_steps(seed=7))
    engine = {"max_num_batched_tokens": 1024, "max_num_seqs": 256, "block_size": 128, "kv_blocks": 4096,
              "kv_bytes_per_token": 4096, "dtype": "bfloat16", "max_model_len": 8192, "engine_process": True,
              "step_gap_median_s": 0.0005}
    profile = build_profile("cpu-test", fit, engine, model="/nonexistent/model")
    assert profile["calibration"]["engine_process"] is True
    assert profile["calibration"]["step_gap_median_ms"] == pytest.approx(0.5)
    assert "own process" in profile["source"]
    engine.pop("engine_process")
    engine.pop("step_gap_median_s")
    profile = build_profile("cpu-test", fit, engine, model="/nonexistent/model")
    assert profile["calibration"]["engine_process"] is False
    assert "in-process" in profile["source"]


def _log_line(start: float, end: float, busy_after: bool, chunks=((64, 0),), decodes=()) -> dict:
    return {"start": start, "end": end, "busy_after": busy_after, "prefill_chunks": [list(c) for c in chunks],
            "decode_contexts": list(decodes)}


def test_step_log_times_back_to_back_steps_start_to_start_and_burst_ends_with_the_median_gap():
    lines = [
        _log_line(10.000, 10.050, True),                      # next starts 2 ms after its end
        _log_line(10.052, 10.080, True, decodes=(5, 9)),      # next starts 4 ms after its end
        _log_line(10.084, 10.100, False, chunks=()),          # last of a burst: idle afterwards
        _log_line(20.000, 20.030, True),                      # new burst; gap 3 ms
        _log_line(20.033, 20.040, False),
    ]
    samples, gap = steps_from_log(lines)
    assert gap == pytest.approx(0.003)                        # median of 2, 4, 3 ms
    assert [round(s.seconds, 6) for s in samples] == [0.052, 0.032, 0.019, 0.033, 0.010]
    assert samples[1].decode_contexts == [5, 9] and samples[1].prefill_chunks == [(64, 0)]
    assert samples[2].prefill_chunks == [] and samples[2].batch_class == "decode"


def test_step_log_without_back_to_back_steps_uses_the_step_alone():
    samples, gap = steps_from_log([_log_line(1.0, 1.25, False)])
    assert gap == 0.0 and samples[0].seconds == pytest.approx(0.25)


def test_importing_calibrate_does_not_import_vllm_and_unknown_names_fail():
    import subprocess
    import sys

    import prefillq.calibrate as calibrate

    with pytest.raises(AttributeError, match="no attribute"):
        calibrate.NoSuchThing  # noqa: B018
    assert not hasattr(calibrate, "__getattr__")  # no lazily built classes: the probe is its own module
    probe = ("import sys, prefillq.calibrate, prefillq.calibrate.design, prefillq.calibrate.fit; "
             "print('vllm' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_rounds_repeat_the_design_after_one_warm_up():
    one, warmup = design_phases(budget=256, max_model_len=2048, seed=3)
    phases, warmup_all = design_rounds(rounds=3, budget=256, max_model_len=2048, seed=3)
    assert warmup_all == warmup and phases[:len(one)] == one
    assert len(phases) == len(one) + 2 * (len(one) - warmup)
    second, _ = design_phases(budget=256, max_model_len=2048, seed=4)
    assert phases[len(one):2 * len(one) - warmup] == second[warmup:]


def test_vocabulary_size_comes_from_the_model_folder(tmp_path):
    assert model_vocab_size(str(tmp_path)) == 2048
    (tmp_path / "config.json").write_text('{"vocab_size": 512}')
    assert model_vocab_size(str(tmp_path)) == 512
