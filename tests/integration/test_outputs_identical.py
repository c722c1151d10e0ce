"""Reordering never changes what a request generates: greedy outputs in float32 are the same token for
token under every policy and both ``partial_prefills`` modes (real vLLM, in-process, CPU, tiny model).

Two long prompts start first; four short ones arrive after the first step, while the long ones are
mid-prefill, with a budget small enough that every long prompt is cut into several chunks. The
policies then schedule these prompts differently (which chunk runs in which step, beside whom), and
the tokens must not move. float32 on purpose: in bf16 a prefill summed over other chunk boundaries
rounds differently, and a random-weight model's near-tied logits can flip a greedy token, as stock
vLLM does with another ``--max-num-batched-tokens`` (docs/partial-prefills.md, "Outputs").
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.engine_helpers import prompt_ids, scheduler_of, start_engine, stop_engine

pytestmark = pytest.mark.vllm

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
MODES = ("first", "ordered")
BUDGET = 128
LONG = {"long0": 700, "long1": 450}
SHORT = {"short0": 24, "short1": 40, "short2": 64, "short3": 90}
MAX_TOKENS = 4

Schedule = tuple[tuple[tuple[str, int], ...], ...]  # per step: (request, tokens scheduled), sorted


def run_mix(model: str, policy: str, mode: str) -> tuple[dict[str, list[int]], Schedule]:
    """One engine with ``policy``/``mode``: the greedy tokens of every request and what each step scheduled."""
    from vllm import SamplingParams

    config = {"prefillq": {"policy": policy, "partial_prefills": mode, "stats_interval_s": 0}}
    llm = start_engine(model, additional_config=config, dtype="float32", max_num_batched_tokens=BUDGET,
                       max_model_len=1024, max_num_seqs=16)
    try:
        scheduler = scheduler_of(llm)
        original = scheduler.schedule
        steps: list[tuple[tuple[str, int], ...]] = []

        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            # vLLM may suffix the ids it is given ("short0-1a2b"); ours have no '-' of their own
            steps.append(tuple(sorted((rid.split("-")[0], n) for rid, n in output.num_scheduled_tokens.items())))
            return output

        scheduler.schedule = schedule
        core = llm.llm_engine
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        outputs: dict[str, list[int]] = {}

        def step() -> None:
            for out in core.step():
                if out.finished:
                    outputs[out.request_id.split("-")[0]] = list(out.outputs[0].token_ids)

        for i, (name, length) in enumerate(LONG.items()):
            core.add_request(name, {"prompt_token_ids": prompt_ids(length, seed=500 + i)}, params)
        step()
        for i, (name, length) in enumerate(SHORT.items()):
            core.add_request(name, {"prompt_token_ids": prompt_ids(length, seed=600 + i)}, params)
        deadline = time.monotonic() + 120
        while core.has_unfinished_requests():
            assert time.monotonic() < deadline, f"{policy}/{mode}: requests never finished"
            step()
        scheduler.schedule = original
        return outputs, tuple(steps)
    finally:
        stop_engine(llm)


@pytest.fixture(scope="module")
def runs(tiny_model: str) -> dict[tuple[str, str], tuple[dict[str, list[int]], Schedule]]:
    # In-process engines cannot coexist (vLLM's process-wide state): one engine per configuration, in turn.
    return {(policy, mode): run_mix(tiny_model, policy, mode) for policy in POLICIES for mode in MODES}


def test_greedy_float32_outputs_are_identical_under_every_policy_and_mode(runs) -> None:
    reference, _ = runs[("default", "first")]  # arrival order, partial prefills first: what stock vLLM does
    assert sorted(reference) == sorted([*LONG, *SHORT])
    assert all(len(tokens) == MAX_TOKENS for tokens in reference.values())
    assert len({tuple(tokens) for tokens in reference.values()}) > 1  # outputs depend on the prompt: a mix-up shows
    differing = {key: sorted(name for name in reference if outputs.get(name) != reference[name])
                 for key, (outputs, _) in runs.items()}
    assert {key: names for key, names in differing.items() if names} == {}


def test_the_configurations_really_scheduled_the_prompts_differently(runs) -> None:
    """Without this the identity above could hold only because every engine ran the same steps."""
    schedules = {key: schedule for key, (_, schedule) in runs.items()}
    lengths = {**LONG, **SHORT}
    for schedule in schedules.values():
        # every prompt token computed once (nothing preempted and recomputed), plus one token per decode step
        computed = {name: sum(n for step in schedule for rid, n in step if rid == name) for name in lengths}
        assert computed == {name: length + MAX_TOKENS - 1 for name, length in lengths.items()}
        assert all(sum(n for _, n in step) <= BUDGET for step in schedule)
        assert sum(1 for step in schedule for rid, _ in step if rid == "long0") >= -(-LONG["long0"] // BUDGET)
    # default orders nothing differently with "ordered" (it plans no caps); the reordering policies do
    assert schedules[("default", "first")] == schedules[("default", "ordered")]
    assert schedules[("short_request_first", "ordered")] != schedules[("short_request_first", "first")]
    assert schedules[("short_request_first", "ordered")] != schedules[("default", "first")]
    assert len(set(schedules.values())) >= 3
