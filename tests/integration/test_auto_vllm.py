"""``auto``'s starvation bound in a real vLLM engine (in-process, CPU, tiny random model): the flood test.

A long prompt starts (its first chunk runs alone), then every step brings more short prompts than the
step's budget. With ``partial_prefills = "ordered"`` the shorts go ahead of the partial long prefill
until the engine's processed-prefill counter reaches the long request's deadline
(``P_at_arrival + SLOWDOWN * cost + GRACE_TOKENS``, docs/auto.md). The bound: no short that arrived
after that deadline is served before it (only the backlog with earlier deadlines may be), and once it
runs it runs every step until done. The constants are made small here (deadline after ~17 steps) to
keep CI cheap; the rule is the same at the real ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.engine_helpers import prompt_ids, scheduler_of, start_engine, stop_engine
from tests.integration.test_partial_prefills_vllm import BUDGET, LONG, SHORT, StepLog

pytestmark = pytest.mark.vllm

SLOWDOWN, GRACE = 4, 512


def test_auto_deadline_bounds_a_partial_long_prefill_under_a_short_flood(tiny_model: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import SamplingParams

    from prefillq.policies import auto

    monkeypatch.setattr(auto, "SLOWDOWN", SLOWDOWN)
    monkeypatch.setattr(auto, "GRACE_TOKENS", GRACE)
    llm = start_engine(tiny_model, additional_config={"prefillq": {"policy": "auto", "partial_prefills": "ordered",
                                                                   "stats_interval_s": 0}},
                       max_num_seqs=64, max_model_len=4096, max_num_batched_tokens=BUDGET, dtype="float32")
    try:
        queue = scheduler_of(llm).prefill_queue
        assert json.dumps(queue.config.policy) == '"auto"'
        core = llm.llm_engine
        log = StepLog(llm)
        counters: list[int] = []
        original = log.scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            counters.append(queue.processed_tokens)  # the counter each step is planned at
            return original(*args, **kwargs)

        log.scheduler.schedule = schedule
        params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
        arrived_at = queue.processed_tokens
        core.add_request("long", {"prompt_token_ids": prompt_ids(LONG, seed=91)}, params)
        core.step()  # its first chunk: from here on it is a partial prefill
        counter = 0
        arrived: dict[str, int] = {}  # flood request -> the counter when it arrived
        finished = False
        while not finished:
            for _ in range(BUDGET // SHORT + 2):  # more short work than one step's budget, every step
                arrived[f"flood-{counter}"] = queue.processed_tokens
                core.add_request(f"flood-{counter}", {"prompt_token_ids": prompt_ids(SHORT, seed=1000 + counter)},
                                 params)
                counter += 1
            finished = any(out.request_id == "long" and out.finished for out in core.step())
            assert len(counters) < 200, "the long request never finished"
        core.abort_request([f"flood-{i}" for i in range(counter)])
        log.scheduler.schedule = original
        log.close()
    finally:
        stop_engine(llm)
    deadline = arrived_at + SLOWDOWN * LONG + GRACE
    long_tokens = log.tokens("long")
    assert long_tokens[0] == BUDGET
    due = [i for i, p in enumerate(counters) if p >= deadline]
    assert due and due[0] > 3
    assert not any(long_tokens[1:due[0]])  # the flood held it for several steps, as long as it was not due
    served = next(i for i, t in enumerate(long_tokens) if i > 0 and t > 0)
    late = [name for name, p in arrived.items() if p >= deadline]  # arrived after its deadline
    assert late
    first_late = min((i for name in late for i, t in enumerate(log.tokens(name)) if t > 0), default=len(counters))
    assert served <= first_late  # none of them went before it
    assert all(t > 0 for t in long_tokens[served:])  # and once it runs, it runs every step until done
    assert sum(long_tokens) == LONG
