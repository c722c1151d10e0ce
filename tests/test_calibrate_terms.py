"""Choosing the cost model's terms by held-out error (calibrate/terms.py) and fitting only those (fit.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefillq.calibrate import COEFFICIENT_NAMES, StepSample, fit_cost_model
from prefillq.calibrate.served import fit_frontend, frontend_terms
from prefillq.calibrate.terms import REQUIRED, blocks, select_frontend_terms, select_step_terms
from prefillq.sim.costs import CostModel


def _steps(model: CostModel, count: int = 200, noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        chunks = [(rng.randrange(16, 512), rng.randrange(0, 2048))] if rng.random() < 0.5 else []
        decodes = [rng.randrange(20, 3000) for _ in range(rng.randrange(0 if chunks else 1, 48))]
        seconds = model.step_latency(sum(c for c, _ in chunks), sum(c * (b + c / 2) for c, b in chunks),
                                     len(decodes), sum(decodes))
        samples.append(StepSample(seconds * (1.0 + rng.gauss(0.0, noise)), chunks, decodes))
    return samples


@given(st.integers(1, 500), st.integers(1, 12))
def test_the_blocks_cover_every_index_once_in_order(count: int, folds: int) -> None:
    parts = blocks(count, folds)
    assert [i for part in parts for i in part] == list(range(count))
    assert len(parts) == min(count, folds)


def test_fitting_some_terms_leaves_the_others_at_zero() -> None:
    samples = _steps(CostModel(0.003, 2e-5, 8e-9, 7e-5, 2e-7))
    fit = fit_cost_model(samples, relative=False, terms=("step_overhead_s", "prefill_token_s", "decode_seq_s"))
    assert fit.coefficients["attention_token2_s"] == 0.0 and fit.coefficients["decode_context_token_s"] == 0.0
    assert fit.coefficients["decode_seq_s"] > 0
    with pytest.raises(ValueError, match="unknown cost term"):
        fit_cost_model(samples, terms=("step_overhead_s", "bogus"))


def test_a_term_the_data_does_not_need_is_left_out() -> None:
    """Steps timed by overhead + per-token cost alone: every larger set fits them as well, so the smallest wins."""
    chosen = select_step_terms(_steps(CostModel(0.003, 2e-5)))
    assert chosen["chosen"] == list(REQUIRED)
    assert len(chosen["candidates"]) == 8 and chosen["folds"] == 5


def test_terms_that_carry_the_time_are_kept_even_with_noise() -> None:
    chosen = select_step_terms(_steps(CostModel(0.003, 2e-5, 0.0, 4e-4, 0.0), noise=0.03))
    assert "decode_seq_s" in chosen["chosen"]
    without = next(row for row in chosen["candidates"] if row["terms"] == list(REQUIRED))
    assert chosen["heldout"]["heldout_rmse_ms"] < without["heldout_rmse_ms"]


def test_all_five_terms_when_all_five_time_the_steps() -> None:
    assert select_step_terms(_steps(CostModel(0.003, 2e-5, 8e-9, 7e-5, 2e-7)))["chosen"] == list(COEFFICIENT_NAMES)


@pytest.mark.parametrize(("delay", "expected"), [
    (lambda n, r: 0.0, []),
    (lambda n, r: 0.004, ["frontend_s"]),
    (lambda n, r: 0.002 + 0.0005 * n + r.gauss(0, 0.0002), ["frontend_s", "frontend_per_seq_s"]),
])
def test_the_front_end_gets_the_terms_its_delays_need(delay, expected) -> None:
    rng = random.Random(1)
    delays = [(delay(n, rng), n) for n in [rng.randrange(1, 40) for _ in range(300)]]
    selection = select_frontend_terms(delays, fit_frontend)
    assert selection["chosen"] == expected
    intercept, slope = frontend_terms(delays, selection["chosen"])
    predicted = np.array([intercept + slope * n for _, n in delays])
    assert float(np.mean(np.abs(predicted - [v for v, _ in delays]))) * 1e3 <= selection["heldout_mae_ms"] + 1e-9
