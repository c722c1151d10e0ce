"""The achievable reference (SPEC §7, sim/clairvoyant.py): clairvoyant schedules run on the same engine
model, so each figure is reached by a real schedule and the optimum lies between the bound and it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefillq.config import PolicyConfig
from prefillq.sim import simulate
from prefillq.sim.clairvoyant import KEYS, SCHEDULES, STATS, ClairvoyantQueue, Schedule
from prefillq.sim.compare import CompareSettings, compare_policies, prepare_comparison
from prefillq.sim.pd import PdConfig
from prefillq.workload import RequestSpec, Workload, scenario
from tests.test_compare_cli import _app


class Item:
    """A stand-in request: what the queue's view and key read."""

    def __init__(self, request_id: str, key: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = 1
        self.key = key


def _queue() -> ClairvoyantQueue:
    from prefillq.requests import QueuedRequest

    return ClairvoyantQueue(lambda item: item.key, PolicyConfig(), clock=lambda: 0.0,
                            view=lambda item: QueuedRequest(item.request_id, item.prompt_tokens))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("add"), st.integers(0, 5)), st.just(("pop", 0)),
                              st.just(("prepend", 0))), max_size=40))
def test_the_queue_pops_the_least_key_then_the_earliest_as_a_sorted_list_does(ops):
    queue, naive = _queue(), []  # naive: (key, position) sorted; prepends go ahead of every add
    popped: list[Item] = []
    adds, fronts = 0, 0
    for op, key in ops:
        if op == "add":
            item = Item(f"r{adds}", key)
            queue.add_request(item)
            naive.append((key, adds, item))
            adds += 1
        elif op == "pop" and naive:
            naive.sort(key=lambda entry: entry[:2])
            expected = naive.pop(0)[2]
            assert queue.peek_request() is expected
            assert queue.pop_request() is expected
            popped.append(expected)
        elif op == "prepend" and popped:
            item = popped.pop()
            fronts -= 1
            queue.prepend_request(item)
            naive.append((item.key, fronts, item))
        assert len(queue) == len(naive)
        assert list(queue) == [entry[2] for entry in sorted(naive, key=lambda entry: entry[:2])]


def test_ordered_short_first_serves_a_short_request_inside_a_long_prefill():
    # A 4000-token prompt starts first; a 16-token one arrives during its prefill. With "ordered" the key
    # ranks the waiting short ahead of the running partial prefill, so it runs in the next step; with
    # "first" the partial keeps the budget until it finishes.
    work = Workload("hand", [RequestSpec("long", 0.0, 4000, 2, "long"), RequestSpec("short", 0.001, 16, 2, "short")])
    ttft = {}
    for mode in ("ordered", "first"):
        schedule = Schedule("short-first-srpt", mode)
        result = simulate(work, schedule.config(), budget=256, **schedule.engine_options("vllm"))
        ttft[mode] = result.summary["short_ttft_p50_ms"]
    alone = simulate(Workload("alone", [work.requests[1]]), "default", budget=256).summary["short_ttft_p50_ms"]
    step_ms = 2 * alone  # a step carrying up to the whole budget costs no more than this here
    assert ttft["ordered"] < step_ms + alone < ttft["first"]


def test_lightllm_mode_ranks_its_ready_list_by_the_key():
    work = scenario("long-first")
    plain = simulate(work, "default", mode="lightllm").summary["short_ttft_p95_ms"]
    schedule = Schedule("short-first-fcfs")
    clairvoyant = simulate(work, schedule.config(), mode="lightllm", **schedule.engine_options("lightllm"))
    assert clairvoyant.summary["short_ttft_p95_ms"] < plain / 10


@pytest.mark.parametrize("mode", ["vllm", "lightllm"])
def test_every_achievable_figure_is_a_run_of_a_named_schedule_and_no_lower_than_the_bound(mode):
    work = scenario("long-first")
    comparison = compare_policies(lambda _seed: work, ["default", "hrrn"], mode=mode)
    reference = comparison.achievable
    assert set(reference["schedules"]) == {s.name for s in SCHEDULES}
    for schedule in SCHEDULES:
        rerun = simulate(work, schedule.config(), mode=mode, **schedule.engine_options(mode)).summary
        assert reference["schedules"][schedule.name] == {key: rerun[key] for key in STATS}
    for key in STATS:
        assert reference[key] == min(figures[key] for figures in reference["schedules"].values())
        assert reference["schedules"][reference["best"][key]][key] == reference[key]
        assert comparison.bound[key] <= reference[key]
        bracket = reference["optimum"][key]
        assert bracket["at_least"] == comparison.bound[key]
        assert bracket["at_most"] == min(reference[key], *(s[key] for s in comparison.summaries.values()))
        hrrn = comparison.summaries["hrrn"][key]
        assert reference["rows_vs_achievable"]["hrrn"][key] == pytest.approx(hrrn / reference[key] - 1)


def test_the_reference_beats_every_policy_on_long_first():
    # Not vacuous: on the default scenario the clairvoyant schedule is far below the best fixed policy (auto
    # with ordered partial prefills, which compare adds by default, reaches it: tests/test_recommend.py).
    from prefillq.sim.compare import DEFAULT_POLICIES

    comparison = prepare_comparison(CompareSettings(policies=list(DEFAULT_POLICIES))).run()
    for key in STATS:
        assert comparison.achievable[key] < min(s[key] for s in comparison.summaries.values()) / 2


def test_keys_know_the_class_the_remaining_prefill_and_the_output():
    from prefillq.sim.node import SimRequest

    short = SimRequest(RequestSpec("s", 0.0, 100, 7, "short"))
    long = SimRequest(RequestSpec("l", 0.0, 50, 3, "long"))
    short.num_computed = 40
    assert KEYS["short-first-srpt"](short) == 60 < KEYS["short-first-srpt"](long)
    assert KEYS["short-first-fcfs"](short) == 0 < KEYS["short-first-fcfs"](long)
    assert KEYS["srpt-known-output"](short) == 60 + 7 > KEYS["srpt-known-output"](long) == 50 + 3


def test_compare_prints_the_bracket_and_writes_it_beside_the_bound(tmp_path):
    out = tmp_path / "s.json"
    runner = CliRunner()
    result = runner.invoke(_app(), ["compare", "--policies", "default,hrrn", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "│ best reached by a " in text and "a clairvoyant schedule reaches" in text
    data = json.loads(out.read_text())
    assert data["achievable"]["short_ttft_p95_ms"] >= data["bound"]["short_ttft_p95_ms"]
    assert "clairvoyant" in data["achievable"]["method"]
    skipped = runner.invoke(_app(), ["compare", "--policies", "default", "--no-achievable", "--json", str(out)])
    assert skipped.exit_code == 0 and "clairvoyant schedule reaches" not in skipped.output
    assert "no clairvoyant reference (--no-achievable)" in " ".join(skipped.output.split())
    assert json.loads(out.read_text())["achievable"] is None


def test_no_reference_on_the_1p1d_topology():
    comparison = compare_policies(lambda _seed: scenario("long-first"), ["default"], topology="1p1d",
                                  pd=PdConfig())
    assert comparison.achievable is None
