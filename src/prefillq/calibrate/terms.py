"""Which terms of the cost model a served engine's data pays for, chosen by held-out error.

``prefillq calibrate --from-bench`` fits the step model and the front-end model on a served engine's
records. Not every term earns its place: a term the data barely constrains fits noise and predicts
worse on steps it has not seen. So each candidate set of terms is fitted on all but one of ``folds``
contiguous blocks of the data (in time order, so neighbouring, alike steps do not sit on both sides)
and judged on the block left out; the set with the lowest held-out error is chosen, except that a set
with fewer terms within :data:`TOLERANCE` of that error wins (a term must pay its way).

* steps (:func:`select_step_terms`): ``step_overhead_s`` and ``prefill_token_s`` always, and any subset of
  the attention, per-decode-sequence and decode-context terms; judged on the root mean square error in
  seconds (the served fit's own objective: it keeps the busy time right); the held-out busy-time error
  (predicted over measured seconds, all blocks) and median relative step error are recorded too;
* front end (:func:`select_frontend_terms`): none, a per-request constant ``frontend_s``, or that plus
  ``frontend_per_seq_s`` per sequence in the step that produced the token; judged on the mean absolute
  error of each request's time outside the steps.

Only numpy is needed here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prefillq.calibrate.fit import COEFFICIENT_NAMES, StepSample, fit_cost_model

FOLDS = 5
TOLERANCE = 0.01  # a smaller set within 1% of the best held-out error is chosen
REQUIRED = COEFFICIENT_NAMES[:2]
OPTIONAL = COEFFICIENT_NAMES[2:]
FRONTEND_CANDIDATES = ((), ("frontend_s",), ("frontend_s", "frontend_per_seq_s"))


def blocks(count: int, folds: int) -> list[range]:
    """``folds`` contiguous index ranges covering ``range(count)`` (fewer when there is less data)."""
    folds = max(1, min(folds, count))
    edges = np.linspace(0, count, folds + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def _choose(table: list[dict[str, Any]], error_key: str) -> dict[str, Any]:
    """The candidate with the lowest error, or a smaller one within TOLERANCE of it (ties: table order)."""
    best = min(row[error_key] for row in table)
    close = [row for row in table if row[error_key] <= best * (1.0 + TOLERANCE) + 1e-15]
    return min(close, key=lambda row: len(row["terms"]))


def _held_out(count: int, folds: int, fit_and_predict: Callable[[list[int], list[int]], np.ndarray | None]
              ) -> np.ndarray | None:
    """Predictions for every index from a model fitted without its block (None: a block could not be fitted)."""
    predicted = np.zeros(count)
    for block in blocks(count, folds):
        train = [i for i in range(count) if i not in block]
        values = fit_and_predict(train, list(block))
        if values is None:
            return None
        predicted[list(block)] = values
    return predicted


def select_step_terms(samples: Sequence[StepSample], *, folds: int = FOLDS, relative: bool = False
                      ) -> dict[str, Any]:
    """``{"chosen": terms, "folds": n, "candidates": [...]}``: every candidate set's held-out errors."""
    kept = [s for s in samples if s.seconds > 0 and (s.prefill_chunks or s.decode_contexts)]
    y = np.array([s.seconds for s in kept])
    table = []
    for size in range(len(OPTIONAL) + 1):
        for extra in itertools.combinations(OPTIONAL, size):
            terms = (*REQUIRED, *extra)

            def fit_and_predict(train: list[int], test: list[int], terms: tuple[str, ...] = terms) -> np.ndarray | None:
                try:
                    fit = fit_cost_model([kept[i] for i in train], relative=relative, terms=terms)
                except ValueError:
                    return None
                return np.array([fit.predict(kept[i]) for i in test])

            predicted = _held_out(len(kept), folds, fit_and_predict)
            if predicted is None:
                continue
            table.append({"terms": list(terms), "heldout_rmse_ms": float(np.sqrt(np.mean((predicted - y) ** 2))) * 1e3,
                          "heldout_busy_time_error": float(predicted.sum() / y.sum() - 1.0),
                          "heldout_median_abs_rel_error": float(np.median(np.abs(predicted / y - 1.0)))})
    if not table:
        return {"chosen": list(COEFFICIENT_NAMES), "folds": 0, "candidates": []}
    chosen = _choose(table, "heldout_rmse_ms")
    return {"chosen": chosen["terms"], "folds": len(blocks(len(kept), folds)), "candidates": table,
            "heldout": {k: v for k, v in chosen.items() if k != "terms"}}


def select_frontend_terms(delays: Sequence[tuple[float, int]], fit: Callable[[Sequence[tuple[float, int]]],
                          tuple[float, float]], *, folds: int = FOLDS) -> dict[str, Any]:
    """The front-end candidates' held-out mean absolute error (ms) per request; ``fit`` is
    :func:`prefillq.calibrate.served.fit_frontend` (the two-term line)."""
    if len(delays) < 2:
        return {"chosen": list(FRONTEND_CANDIDATES[1] if delays else ()), "folds": 0, "candidates": []}
    values = np.array([value for value, _ in delays])
    sizes = np.array([batch for _, batch in delays], dtype=float)
    table = []
    for terms in FRONTEND_CANDIDATES:
        def fit_and_predict(train: list[int], test: list[int], terms: tuple[str, ...] = terms) -> np.ndarray:
            if not terms:
                return np.zeros(len(test))
            if len(terms) == 1:
                return np.full(len(test), max(0.0, float(np.median(values[train]))))
            intercept, slope = fit([delays[i] for i in train])
            return intercept + slope * sizes[test]

        predicted = _held_out(len(delays), folds, fit_and_predict)
        assert predicted is not None
        table.append({"terms": list(terms), "heldout_mae_ms": float(np.mean(np.abs(predicted - values))) * 1e3})
    chosen = _choose(table, "heldout_mae_ms")
    return {"chosen": chosen["terms"], "folds": len(blocks(len(delays), folds)), "candidates": table,
            "heldout_mae_ms": chosen["heldout_mae_ms"]}
