"""SPEC §3.0 on the real vLLM scheduler: a request vLLM pops only to skip it is not a dispatch.

vLLM's own skip path runs (``skip_request`` pops, adds to ``deferred_waiting``, prepends at the end of
the step). What makes the request skippable is forced: the blocked-request check answers "not ready"
for one request during its first steps, as it does for a request whose structured-output grammar is
still compiling (that compile is asynchronous, so on CPU whether a real grammar is ready in time is a
race; forcing the answer keeps the test deterministic).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.engine_helpers import record_dispatches, scheduler_of, start_engine, stop_engine
from tests.integration.test_vllm_engine import generate

pytestmark = pytest.mark.vllm

LENGTHS = [1800, 1200, 40, 120]  # submitted in this order; "40" is the one made to wait


@pytest.fixture(scope="module")
def promote_llm(tiny_model: str) -> Iterator[Any]:
    import json

    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

    # An earlier engine test (a refused kv_consumer deployment) leaves vLLM's process-wide KV connector
    # set up; this engine has none, so clear it.
    ensure_kv_transfer_shutdown()
    llm = start_engine(tiny_model, max_num_seqs=8, max_num_batched_tokens=512,
                       additional_config=json.loads('{"prefillq": {"policy": "promote_shortest"}}'))
    yield llm
    stop_engine(llm)


def test_a_skipped_request_is_not_a_dispatch_and_keeps_the_promotion(promote_llm: Any) -> None:
    scheduler = scheduler_of(promote_llm)
    queue = scheduler.waiting
    assert queue is scheduler.prefill_queue
    blocked_checks = {"left": 2}
    original = scheduler._handle_blocked_waiting_request
    waiting_one: list[str] = []

    def not_ready_yet(request: Any) -> bool:
        if request.num_prompt_tokens == 40 and blocked_checks["left"] > 0:
            blocked_checks["left"] -= 1
            waiting_one.append(request.request_id)
            return False
        return original(request)

    scheduler._handle_blocked_waiting_request = not_ready_yet
    log = record_dispatches(promote_llm)
    before = queue.stats()
    try:
        outputs = generate(promote_llm, LENGTHS, max_tokens=2, seed=7)
    finally:
        scheduler._handle_blocked_waiting_request = original
    after = queue.stats()
    assert blocked_checks["left"] == 0 and len(set(waiting_one)) == 1  # vLLM skipped it twice
    pops = log.prompt_lengths
    # Step 1: "40" is the shortest and is popped, but only to be skipped; the step's promotion is still
    # there, so the next shortest (120) goes first, ahead of the FCFS head.
    assert pops[:3] == [40, 120, 1800]
    assert pops.count(40) == 3  # two skips, then the real dispatch
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2] * len(LENGTHS)
    dispatched = sum(after["dispatched"].values()) - sum(before["dispatched"].values())
    assert dispatched == len(LENGTHS)  # the two skipped pops count nowhere
    assert after["prepends"] == before["prepends"]
