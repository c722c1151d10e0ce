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
