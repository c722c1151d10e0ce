"""SPEC §3.6 in a real vLLM engine (in-process, CPU, tiny random model): ``partial_prefills="ordered"``.

The engine is driven step by step (``add_request`` + ``step``) so that short prompts arrive while a long
prompt is mid-prefill. What each step scheduled is read from vLLM's own ``SchedulerOutput``. The
engines run in float32: greedy argmax over a random-weight model's logits has near-ties that bf16
rounding can flip when the batch composition changes, and these tests compare outputs across
schedules.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.engine_helpers import prompt_ids, scheduler_of, start_engine, stop_engine

pytestmark = pytest.mark.vllm

BUDGET = 512
LONG = 2000
SHORT = 60
# SRF's aging bound. Far above a burst's few steps (so aging never decides the burst tests, even on a
# loaded machine), short enough for the flood test to run past it in a few seconds.
WAIT_MS = 3000.0


def srf(partial_prefills: str, **extra: Any) -> str:
    return json.dumps({"prefillq": {"policy": "short_request_first", "threshold": 256,
                                    "long_max_wait_ms": WAIT_MS, "partial_prefills": partial_prefills,
                                    "stats_interval_s": 0, **extra}})


def engine(model: str, partial_prefills: str, **overrides: Any) -> Any:
    return start_engine(model, additional_config=json.loads(srf(partial_prefills)), max_num_seqs=64,
                        max_model_len=4096, max_num_batched_tokens=BUDGET, dtype="float32", **overrides)


class StepLog:
    """Every ``schedule()`` of the engine: when it was called (the queue's clock) and what it scheduled."""

    def __init__(self, llm: Any) -> None:
        self.scheduler = scheduler_of(llm)
        self.steps: list[tuple[float, dict[str, int]]] = []
        original = self.scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            at = time.monotonic()
            output = original(*args, **kwargs)
            self.steps.append((at, dict(output.num_scheduled_tokens)))
            return output

        self.scheduler.schedule = schedule
        self._original = original

    def close(self) -> None:
        self.scheduler.schedule = self._original

    def tokens(self, request_id: str) -> list[int]:
        """Tokens scheduled per step for a request (vLLM adds a suffix to the ids it is given)."""
        prefix = request_id + "-"
        return [sum(n for rid, n in scheduled.items() if rid == request_id or rid.startswith(prefix))
                for _, scheduled in self.steps]


def run_burst(llm: Any, max_tokens: int = 4, seed: int = 0) -> tuple[dict[str, list[int]], StepLog]:
    """A long prompt starts; after its first chunk, four short prompts arrive; run to completion.
    (A new ``seed`` gives new prompts: an engine reused for another burst finds no prefix-cache hit.)"""
    from vllm import SamplingParams

    core = llm.llm_engine
    log = StepLog(llm)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    outputs: dict[str, list[int]] = {}

    def step() -> None:
        for out in core.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)

    core.add_request("long", {"prompt_token_ids": prompt_ids(LONG, seed=71 + 100 * seed)}, params)
    step()
    for i in range(4):
        core.add_request(f"short-{i}", {"prompt_token_ids": prompt_ids(SHORT, seed=80 + i + 100 * seed)}, params)
    while core.has_unfinished_requests():
        step()
    log.close()
    return outputs, log


# In-process engines cannot coexist (vLLM's process-wide parallel state): one at a time, "first" then
# "ordered" (kept for the module's other tests).

@pytest.fixture(scope="module")
def first_run(tiny_model: str) -> tuple[dict[str, list[int]], StepLog]:
    llm = engine(tiny_model, "first")
    try:
        return run_burst(llm)
    finally:
        stop_engine(llm)


@pytest.fixture(scope="module")
def ordered_llm(tiny_model: str, first_run: Any) -> Iterator[Any]:
    llm = engine(tiny_model, "ordered")
    yield llm
    stop_engine(llm)


@pytest.fixture(scope="module")
def burst_runs(first_run: Any, ordered_llm: Any) -> dict[str, Any]:
    runs: dict[str, Any] = {"first": first_run, "ordered": run_burst(ordered_llm)}
    runs["ordered-prepends"] = scheduler_of(ordered_llm).prefill_queue.stats()["prepends"]
    counters = scheduler_of(ordered_llm).partial_prefill_counters
    runs["ordered-counters"] = (counters.deferred, counters.tokens_yielded)
    return runs


def test_first_keeps_vllms_rule_the_partial_long_prefill_goes_first(burst_runs) -> None:
    _, log = burst_runs["first"]
    assert log.tokens("long")[:2] == [BUDGET, BUDGET]
    assert all(log.tokens(f"short-{i}")[1] == 0 for i in range(4))  # they wait for the long prompt


def test_ordered_runs_short_prompts_ahead_of_the_partial_long_prefill(burst_runs) -> None:
    _, log = burst_runs["ordered"]
    assert log.tokens("long")[:2] == [BUDGET, BUDGET - 4 * SHORT]  # it gets what the short ones leave
    assert all(log.tokens(f"short-{i}")[1] == SHORT for i in range(4))


def test_ordered_counts_the_deferred_partial_prefill_for_the_metrics_endpoint(burst_runs) -> None:
    deferred, tokens_yielded = burst_runs["ordered-counters"]
    assert deferred >= 1  # the long prompt's second chunk was cut for the four short prompts
    assert tokens_yielded >= 4 * SHORT


def test_ordered_gives_identical_greedy_outputs(burst_runs) -> None:
    first, _ = burst_runs["first"]
    ordered, _ = burst_runs["ordered"]
    assert sorted(first) == ["long", "short-0", "short-1", "short-2", "short-3"]
    assert ordered == first


def test_partial_long_prefill_is_never_preempted_or_recomputed(burst_runs) -> None:
    _, log = burst_runs["ordered"]
    prefill = [t for t in log.tokens("long") if t > 1]
    assert sum(prefill) == LONG  # every prompt token computed once: nothing recomputed
    assert burst_runs["ordered-prepends"] == 0  # nothing was preempted back into the waiting queue


def test_user_long_prefill_token_threshold_stays_a_ceiling(ordered_llm: Any, burst_runs) -> None:
    # The field --long-prefill-token-threshold sets; vLLM reads it at the start of every schedule().
    config = scheduler_of(ordered_llm).scheduler_config
    saved = config.long_prefill_token_threshold
    config.long_prefill_token_threshold = 128
    try:
        outputs, log = run_burst(ordered_llm, max_tokens=2, seed=1)
    finally:
        config.long_prefill_token_threshold = saved
    assert len(outputs) == 5
    # vLLM lifts the threshold for a request that is alone; whenever others are there it caps every chunk.
    assert log.tokens("long")[0] == BUDGET
    assert max(t for _, scheduled in log.steps if len(scheduled) > 1 for t in scheduled.values()) <= 128
    assert log.tokens("long")[1] == 128  # min(threshold, what the short ones leave: 512 - 240)
    assert all(log.tokens(f"short-{i}")[1] == SHORT for i in range(4))  # ahead of the partial prefill
    assert sum(t for t in log.tokens("long") if t > 1) == LONG


def test_srf_long_max_wait_bounds_a_partial_long_prefill_under_a_short_flood(ordered_llm: Any) -> None:
    """Strict short-first would hold the partial long prefill for as long as shorts keep coming; with
    long_max_wait_ms it is promoted once it has waited that long since it first entered the queue: the
    first step planned after that moment gives it tokens, so its wait exceeds the bound by at most the
    interval between two scheduling steps (measured here, not assumed)."""
    from vllm import SamplingParams

    core = ordered_llm.llm_engine
    log = StepLog(ordered_llm)
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    before = time.monotonic()
    core.add_request("long", {"prompt_token_ids": prompt_ids(LONG, seed=91)}, params)
    after = time.monotonic()  # the queue's first-enqueue time of "long" lies in [before, after]
    core.step()  # its first chunk: from here on it is a partial prefill
    counter = 0
    finished = False
    while not finished:
        for _ in range(BUDGET // SHORT + 2):  # more short work than one step's budget, every step
            core.add_request(f"flood-{counter}", {"prompt_token_ids": prompt_ids(SHORT, seed=1000 + counter)},
                             params)
            counter += 1
        finished = any(out.request_id == "long" and out.finished for out in core.step())
        assert time.monotonic() - before < 60, "the long request never finished"
    core.abort_request([f"flood-{i}" for i in range(counter)])
    while core.has_unfinished_requests():
        core.step()
    log.close()
    bound_s = WAIT_MS / 1000.0
    times = [at for at, _ in log.steps]
    long_tokens = log.tokens("long")
    assert long_tokens[0] == BUDGET
    # Until it has aged, the flood keeps it waiting (strict short-first would forever) ...
    held = [t for at, t in zip(times[1:], long_tokens[1:], strict=True) if at < before + bound_s]
    assert held and not any(held)
    # ... and the first step planned after it aged serves it, and every later one until it is done.
    aged = [i for i, at in enumerate(times) if at >= after + bound_s]
    assert aged and long_tokens[aged[0]] > 0
    served = long_tokens[aged[0]:]
    assert sum(served) == LONG - BUDGET - sum(long_tokens[1:aged[0]])
    # Measured: its wait beyond long_max_wait_ms is at most one scheduling interval.
    step_gap = max(b - a for a, b in itertools.pairwise(times))
    first_served = next(at for at, t in zip(times[1:], long_tokens[1:], strict=True) if t > 0)
    assert first_served - before <= bound_s + step_gap
