"""The PD router: admission ordered by admission priority (never by the internal one), and busy-node
retry that is off by default, bounded by its timeout when on, and never applied after the first token."""

from __future__ import annotations

import pytest

from prefillq.sim import simulate
from prefillq.sim.pd import (
    BUSY_RETRY_ENV,
    PdConfig,
    busy_retry_timeout_from_env,
    parse_busy_retry_timeout,
    segment_view,
)
from prefillq.workload import RequestSpec, Workload

from .test_pd_topology import profile


def workload(*requests: tuple) -> Workload:
    specs = []
    for rid, at, prompt, out, *rest in requests:
        specs.append(RequestSpec(rid, at, prompt, out, "long" if prompt > 100 else "short",
                                 admission_priority=rest[0] if rest else 0))
    return Workload("tiny", sorted(specs, key=lambda s: s.arrival_s), {})


def run(w: Workload, policy: str = "default", **pd):
    return simulate(w, policy, profile=profile(), budget=100, topology="1p1d", pd=PdConfig(**pd), record_steps=True)


def clients(res):
    return {c.spec.request_id: c for c in res.node.clients}


@pytest.fixture(autouse=True)
def _no_retry_env(monkeypatch):
    monkeypatch.delenv(BUSY_RETRY_ENV, raising=False)


# --- admission ----------------------------------------------------------------------------------------


def held_workload() -> Workload:
    # A keeps the prefill node busy; with a waiting limit of 1, B waits on the node and C, D, E wait in
    # the router. E asks for admission first (-5), D next (-1); C (0) last.
    return workload(("A", 0.0, 300, 1), ("B", 0.001, 20, 1), ("C", 0.002, 20, 1), ("D", 0.003, 20, 1, -1),
                    ("E", 0.004, 20, 1, -5))


def test_router_admits_by_admission_priority_then_arrival_when_the_prefill_queue_is_full():
    c = clients(run(held_workload(), prefill_waiting_limit=1))
    assert c["A"].dispatched_s == 0.0 and c["B"].dispatched_s == pytest.approx(0.001)
    assert c["E"].dispatched_s <= c["D"].dispatched_s <= c["C"].dispatched_s
    assert c["E"].dispatched_s < c["C"].dispatched_s


def test_admission_priority_never_reaches_the_prefill_queue():
    # No router limit: everything is forwarded at once, and the prefill node's default policy (which
    # orders by internal priority) serves first segments in arrival order whatever their admission flag.
    res = run(held_workload())
    c = clients(res)
    assert [c[x].dispatched_s for x in "ABCDE"] == [0.0, 0.001, 0.002, 0.003, 0.004]
    order = [rid for step in res.node.pairs[0].prefill.steps for rid, _ in step.prefill_chunks]
    assert [rid for rid in dict.fromkeys(order)] == ["A", "B", "C", "D", "E"]
    for client in c.values():
        view = segment_view(client.segments[0])
        assert view.priority == 0
        assert view.admission_priority == client.spec.admission_priority


# --- busy-node retry ----------------------------------------------------------------------------------


def busy_home_workload(second_home_busy: bool = False) -> Workload:
    # Round-robin homes: A -> pair 0, B -> pair 1, C -> pair 0. A decodes for a long time on pair 0's
    # one-seat decode node, so pair 0 is busy when C arrives; pair 1 is free unless B decodes too.
    b_output = 2000 if second_home_busy else 1
    return workload(("A", 0.0, 10, 2000), ("B", 0.0, 10, b_output), ("C", 1.0, 10, 5))


def test_retry_is_off_by_default_even_when_another_pair_is_free():
    assert PdConfig().retry_timeout_s({}) == 0.0
    res = run(busy_home_workload(), pairs=2, decode_max_num_seqs=1)
    c = clients(res)
    assert c["C"].home == 0 and c["C"].pair == 0 and not c["C"].retried
    assert res.pd["retried"] == 0 and res.pd["busy_retry_timeout_s"] == 0.0


def test_enabled_retry_moves_a_request_whose_pair_is_busy_to_a_free_pair():
    res = run(busy_home_workload(), pairs=2, decode_max_num_seqs=1, busy_retry_timeout_s=5.0)
    c = clients(res)
    assert c["C"].home == 0 and c["C"].pair == 1 and c["C"].retried
    assert c["C"].dispatched_s == pytest.approx(1.0)
    assert res.pd["retried"] == 1
    # it pays off: without retry C waits for A's decode seat on pair 0
    without = run(busy_home_workload(), pairs=2, decode_max_num_seqs=1)
    e2e = {r.request_id: r.e2e_s for r in res.records}
    e2e_without = {r.request_id: r.e2e_s for r in without.records}
    assert e2e["C"] < e2e_without["C"]


def test_retry_is_bounded_by_its_timeout_when_every_pair_stays_busy():
    res = run(busy_home_workload(second_home_busy=True), pairs=2, decode_max_num_seqs=1, busy_retry_timeout_s=0.25)
    c = clients(res)
    assert c["C"].dispatched_s == pytest.approx(1.25)  # tried until the timeout, then sent home
    assert c["C"].pair == c["C"].home == 0 and not c["C"].retried


def test_with_one_pair_retry_has_nowhere_to_go_and_changes_nothing():
    w = busy_home_workload()
    off = run(w, decode_max_num_seqs=1)
    on = run(w, decode_max_num_seqs=1, busy_retry_timeout_s=5.0)
    assert [r.e2e_s for r in off.records] == [r.e2e_s for r in on.records]
    assert on.pd["retried"] == 0


def test_no_retry_after_the_first_token_continuations_stay_on_their_pair():
    # Pair 0's decode node is too small for A and B together, so one is cut; pair 1 is idle and retry
    # is on, yet the continuation goes back to the pair that streamed the first tokens.
    w = workload(("A", 0.0, 40, 40), ("X", 0.0, 5, 1), ("B", 0.0, 40, 40), ("Y", 0.0, 5, 1))
    res = run(w, pairs=2, decode_kv_blocks=8, busy_retry_timeout_s=10.0)
    assert res.pd["continuations"] >= 1
    for client in res.node.clients:
        pair = res.node.pairs[client.pair]
        for segment in client.segments:
            assert segment.prefill_node is pair.prefill
            assert segment.decode_node in (None, pair.decode)
    cut = [client for client in res.node.clients if len(client.segments) > 1]
    assert cut and all(client.pair == client.home for client in cut)


def test_retry_setting_from_the_environment_and_explicit_value_wins(monkeypatch):
    monkeypatch.setenv(BUSY_RETRY_ENV, "2.5")
    assert busy_retry_timeout_from_env() == 2.5
    assert PdConfig().retry_timeout_s() == 2.5
    assert PdConfig(busy_retry_timeout_s=0).retry_timeout_s() == 0.0
    res = simulate(busy_home_workload(), "default", profile=profile(), budget=100, topology="1p1d",
                   pd={"pairs": 2, "decode_max_num_seqs": 1})
    assert res.pd["retried"] == 1 and res.pd["busy_retry_timeout_s"] == 2.5
    monkeypatch.setenv(BUSY_RETRY_ENV, "soon")
    with pytest.raises(ValueError, match=BUSY_RETRY_ENV):
        PdConfig().retry_timeout_s()


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "", "x", True, -0.5])
def test_bad_retry_timeouts_are_clear_errors(value):
    with pytest.raises(ValueError, match="seconds"):
        parse_busy_retry_timeout(value, "timeout")
    if value != "":
        with pytest.raises(ValueError, match="busy_retry_timeout_s"):
            PdConfig(busy_retry_timeout_s=value)


def test_pd_settings_are_validated():
    with pytest.raises(ValueError, match="pairs"):
        PdConfig(pairs=0)
    with pytest.raises(ValueError, match="prefill_waiting_limit"):
        PdConfig(prefill_waiting_limit=0)
    with pytest.raises(ValueError, match="unknown key 'pairz' in PD settings"):
        PdConfig.from_value({"pairz": 2})
    with pytest.raises(ValueError, match="topology='1p1d'"):
        simulate(busy_home_workload(), "default", profile=profile(), pd={"pairs": 2})
