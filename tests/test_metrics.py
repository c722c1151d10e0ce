"""Metrics: one definition of TTFT/TPOT/E2E/throughput, checked against hand computations and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefillq.metrics import RequestRecord, percentile, relative_change, summarize, tpot_s, weighted_percentile


def rec(rid, klass, ttft, e2e, out=5, sent=0.0, error=None):
    return RequestRecord(rid, klass, 100 if klass == "short" else 5000, out, sent, sent, ttft, e2e, [], error)


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_of_nothing_is_none():
    assert percentile([], 50) is None


def test_tpot_definition():
    assert tpot_s(rec("a", "short", 1.0, 3.0, out=5)) == pytest.approx(0.5)
    assert tpot_s(rec("a", "short", 1.0, 1.0, out=1)) is None
    assert tpot_s(rec("a", "short", None, None)) is None
    assert tpot_s(rec("a", "short", 1.0, 3.0, error="boom")) is None


def test_summary_by_hand():
    records = [
        rec("s1", "short", 0.1, 0.5, sent=0.0),
        rec("s2", "short", 0.3, 0.7, sent=1.0),
        rec("l1", "long", 2.0, 4.0, sent=0.0),
        rec("x", "short", None, None, sent=0.5, error="timeout"),
    ]
    s = summarize(records)
    assert s["short_ttft_p50_ms"] == pytest.approx(200.0)
    assert s["short_ttft_p95_ms"] == pytest.approx(290.0)
    assert s["long_ttft_p95_ms"] == pytest.approx(2000.0)
    assert s["long_e2e_p95_ms"] == pytest.approx(4000.0)
    assert s["short_tpot_p50_ms"] == pytest.approx(100.0)  # (0.4 / 4) both
    assert s["duration_s"] == pytest.approx(4.0)  # first send 0 to last completion 4.0
    assert s["output_tokens_per_s"] == pytest.approx(15 / 4.0)
    assert (s["completed"], s["failed"]) == (3, 1)
    assert summarize(records, duration_s=10.0)["output_tokens_per_s"] == pytest.approx(1.5)


def test_summary_without_long_requests_has_none():
    s = summarize([rec("s1", "short", 0.1, 0.5)])
    assert s["long_ttft_p95_ms"] is None and s["long_e2e_p95_ms"] is None
    empty = summarize([])
    assert empty["completed"] == 0 and empty["output_tokens_per_s"] is None


def test_record_round_trip():
    r = RequestRecord("a", "long", 10, 3, 0.25, 0.26, 0.5, 0.9, [0.2, 0.2], None)
    assert RequestRecord.from_dict(r.to_dict()) == r
    assert RequestRecord.from_dict({**r.to_dict(), "extra": 1}) == r


def test_relative_change():
    assert relative_change(205.0, 1000.0) == pytest.approx(-0.795)
    assert relative_change(None, 1.0) is None and relative_change(1.0, 0.0) is None


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.013, 1 / 3, 0.0251, 7.5]) | st.floats(0, 1e3),
                          st.integers(0, 6)), min_size=1, max_size=12).filter(lambda pairs: any(c for _, c in pairs)),
       st.sampled_from([0, 1, 25, 50, 95, 99, 99.9, 100]) | st.floats(0, 100))
def test_weighted_percentile_is_numpys_percentile_of_the_expanded_values_exactly(pairs, q):
    values = [v for v, _ in pairs]
    counts = [c for _, c in pairs]
    assert weighted_percentile(values, counts, q) == float(np.percentile(np.repeat(values, counts), q))


def test_weighted_percentile_of_nothing_is_none():
    assert weighted_percentile([0.5], [0], 50) is None
