"""Regression streams of the differential driver for ``partial_prefills="ordered"`` in the vLLM plug-in
(SPEC §3.6: a step never leaves budget idle while a capped partial prefill could use it). Each stream is a
case the plan once got wrong; the random streams are in ``test_differential.py``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.integration.differential import Stream, StreamRequest, expected_tokens, model_config, run_stream

pytestmark = pytest.mark.vllm

ORDERED = [{"policy": name, "partial_prefills": "ordered", "threshold": 256}
           for name in ("short_request_first", "hrrn", "promote_shortest")]


@pytest.fixture(scope="module")
def base_config(tiny_model: str) -> Any:
    return model_config(tiny_model)


def _stream(rows: list[tuple[int, int, int]], shared: int = 0, **limits: Any) -> Stream:
    """(prompt tokens, output tokens, arrival step) per request; the first ``shared`` tokens are common."""
    rng = random.Random(0)
    common = [rng.randrange(3, 2000) for _ in range(shared)]
    requests = tuple(StreamRequest(str(i), tuple(common[:n] + [rng.randrange(3, 2000) for _ in range(n - shared)]),
                                   out, arrive) for i, (n, out, arrive) in enumerate(rows))
    defaults = {"budget": 64, "max_num_seqs": 8, "num_blocks": 64, "prefix_caching": False, "async_scheduling": False}
    return Stream(requests, **{**defaults, **limits})


def _no_idle_budget(base_config: Any, stream: Stream, config: dict[str, Any]) -> Any:
    run = run_stream(base_config, stream, config)
    assert not run.livelock and run.free_blocks_at_end == run.total_blocks
    assert {r.request_id: run.tokens[r.request_id] for r in stream.requests} == \
        {r.request_id: expected_tokens(r) for r in stream.requests}
    assert run.idle_caps == [], run.idle_caps[:3]
    stock = run_stream(base_config, stream, None)  # async pipelining has empty steps of its own
    assert sum(not step.scheduled for step in run.steps) <= sum(not step.scheduled for step in stock.steps)
    return run


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("config", ORDERED, ids=lambda c: c["policy"])
def test_a_waiting_request_whose_whole_prompt_does_not_fit_keeps_no_budget(base_config: Any, config: dict[str, Any],
                                                                           async_scheduling: bool) -> None:
    """vLLM (``scheduler_reserve_full_isl``, on by default) admits a waiting request only if its whole
    prompt fits the free blocks: a 600-token partial holds 36 of 47 blocks when a 200-token short arrives
    (its first chunk fits, its 13 blocks do not). The plan kept the budget for the short and capped the
    partial to 0: an empty step."""
    stream = _stream([(600, 4, 0), (200, 4, 9)], num_blocks=48, async_scheduling=async_scheduling)
    _no_idle_budget(base_config, stream, config)


@pytest.mark.parametrize("config", ORDERED, ids=lambda c: c["policy"])
def test_a_prefix_the_partial_fills_in_the_same_step_leaves_no_budget_idle(base_config: Any,
                                                                           config: dict[str, Any]) -> None:
    """Issue 20 item 3 in the plug-in: a 400-token partial and a 100-token short sharing 96 tokens, budget 64.
    vLLM caches the partial's blocks when it allocates them, before the waiting loop, so the short hits
    more than the plan's first estimate."""
    stream = _stream([(400, 2, 0), (100, 2, 1)], shared=96, prefix_caching=True)
    run = _no_idle_budget(base_config, stream, config)
    assert all(sum(step.scheduled.values()) == 64 for step in run.steps[:5])
