"""prefillq inside a real vLLM engine (in-process, CPU, tiny random model).

Each test reads the dispatch order from the engine's own waiting queue (every ``pop_request`` vLLM
made), not from completion times. Prompts are submitted longest first, so FCFS and every other policy
disagree.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from prefillq.config import ConfigError
from tests.integration.engine_helpers import (
    prompt_ids,
    record_dispatches,
    scheduler_of,
    start_engine,
    stop_engine,
)

pytestmark = pytest.mark.vllm

LONGEST_FIRST = [1800, 1200, 700, 300, 120, 40]
FCFS_ORDER = LONGEST_FIRST


def generate(llm: Any, lengths: list[int], *, max_tokens: int = 1, priority: list[int] | None = None,
             seed: int = 0) -> list[Any]:
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": prompt_ids(n, seed * 1000 + i)} for i, n in enumerate(lengths)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return llm.generate(prompts, params, priority=priority, use_tqdm=False)


def assert_dispatch_order(llm: Any, policy: str, expected: list[int], *, max_tokens: int = 1) -> None:
    """Submit LONGEST_FIRST at once; vLLM must pop them from our queue in ``expected`` order."""
    scheduler = scheduler_of(llm)
    assert scheduler.waiting is scheduler.prefill_queue
    assert scheduler.waiting.policy == policy
    log = record_dispatches(llm)
    processed_before = scheduler.waiting.stats()["processed_prefill_tokens"]
    outputs = generate(llm, LONGEST_FIRST, max_tokens=max_tokens, seed=1)
    assert log.prompt_lengths == expected
    if policy != "default":
        assert expected != FCFS_ORDER
    assert [len(o.outputs[0].token_ids) for o in outputs] == [max_tokens] * len(LONGEST_FIRST)
    assert len(scheduler.waiting) == 0
    # After each step the queue heard exactly the prefill tokens vLLM scheduled (decode tokens are not
    # prefill; fresh random prompts get no prefix-cache hits).
    processed = scheduler.waiting.stats()["processed_prefill_tokens"] - processed_before
    assert processed == sum(LONGEST_FIRST)


# Each class starts one engine (class scope), so only one engine holds memory at a time. Engines run
# one request at a time (max_num_seqs=1): every pop happens in its own scheduling step and the order
# is the policy's alone.

@pytest.fixture(scope="class")
def default_llm(tiny_model: str) -> Iterator[Any]:
    """No prefillq configuration at all: the default policy (FCFS)."""
    llm = start_engine(tiny_model, max_num_seqs=1)
    yield llm
    stop_engine(llm)


class TestDefaultPolicy:
    def test_vllm_dispatches_in_arrival_order(self, default_llm: Any) -> None:
        assert_dispatch_order(default_llm, "default", [1800, 1200, 700, 300, 120, 40])

    def test_client_priority_cannot_jump_the_queue_by_default(self, default_llm: Any) -> None:
        log = record_dispatches(default_llm)
        # The 40-token request asks for elevated priority; the operator did not opt in.
        outputs = generate(default_llm, LONGEST_FIRST, priority=[0, 0, 0, 0, 0, -5], seed=2)
        assert log.prompt_lengths == FCFS_ORDER
        assert log.dispatches[-1].priority == -5  # vLLM carried the client's value; the policy ignored it
        assert all(len(o.outputs[0].token_ids) == 1 for o in outputs)

    def test_aborting_waiting_requests_mid_queue_keeps_the_queue_consistent(self, default_llm: Any) -> None:
        from vllm import SamplingParams

        engine = default_llm.llm_engine
        scheduler = scheduler_of(default_llm)
        queue = scheduler.waiting
        log = record_dispatches(default_llm)
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        for i in range(6):
            engine.add_request(f"abort-{i}", {"prompt_token_ids": prompt_ids(300 + i, seed=500 + i)}, params)
        finished: dict[str, Any] = {}

        def step() -> None:
            for out in engine.step():
                if out.finished:
                    assert out.request_id not in finished, "a request finished twice"
                    finished[out.request_id] = out

        step()  # abort-0 is admitted (one running request at a time); five wait
        assert [r.num_prompt_tokens for r in queue] == [301, 302, 303, 304, 305]
        engine.abort_request(["abort-2", "abort-4"])
        assert [r.num_prompt_tokens for r in queue] == [301, 303, 305]
        assert len(queue) == 3 and bool(queue)
        engine.abort_request(["abort-2", "never-existed"])  # aborting twice or unknown ids is harmless
        engine.add_request("late", {"prompt_token_ids": prompt_ids(50, seed=599)}, params)
        assert [r.num_prompt_tokens for r in queue] == [301, 303, 305, 50]
        while engine.has_unfinished_requests():
            step()

        assert log.prompt_lengths == [300, 301, 303, 305, 50]
        completed = {rid for rid, out in finished.items() if out.outputs[0].finish_reason == "length"}
        assert completed == {"abort-0", "abort-1", "abort-3", "abort-5", "late"}
        assert all(len(finished[rid].outputs[0].token_ids) == 3 for rid in completed)
        assert len(queue) == 0 and not queue and list(queue) == []
        assert not scheduler.requests


@pytest.fixture(scope="class")
def promote_shortest_llm(tiny_model: str) -> Iterator[Any]:
    llm = start_engine(tiny_model, max_num_seqs=1, additional_config={"prefillq": {"policy": "promote_shortest"}})
    yield llm
    stop_engine(llm)


class TestPromoteShortest:
    def test_vllm_dispatches_shortest_first(self, promote_shortest_llm: Any) -> None:
        # one request per step, so every pop is that step's one promotion
        assert_dispatch_order(promote_shortest_llm, "promote_shortest", [40, 120, 300, 700, 1200, 1800])


@pytest.fixture(scope="class")
def hrrn_trusting_llm(tiny_model: str) -> Iterator[Any]:
    """HRRN configured through PREFILLQ_CONFIG (as a launcher without --additional-config would), with
    the operator's opt-in to client priorities."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFILLQ_CONFIG", json.dumps({"policy": "hrrn", "trust_request_priority": True}))
        llm = start_engine(tiny_model, max_num_seqs=1)
    yield llm
    stop_engine(llm)


class TestHrrnFromEnvironmentTrustingPriority:
    def test_vllm_dispatches_by_response_ratio(self, hrrn_trusting_llm: Any) -> None:
        # all scores 0 at the first pop (tie: arrival order); after 1800 processed tokens the
        # score 1800/cost ranks the cheapest first
        assert_dispatch_order(hrrn_trusting_llm, "hrrn", [1800, 40, 120, 300, 700, 1200])

    def test_client_priority_is_honoured_when_the_operator_trusts_it(self, hrrn_trusting_llm: Any) -> None:
        log = record_dispatches(hrrn_trusting_llm)
        outputs = generate(hrrn_trusting_llm, LONGEST_FIRST, priority=[0, 0, -5, 0, 0, 0], seed=3)
        # 700 goes first (elevated); then HRRN at counter 700: cheapest first
        assert log.prompt_lengths == [700, 40, 120, 300, 1200, 1800]
        assert all(len(o.outputs[0].token_ids) == 1 for o in outputs)

    def test_hrrn_costs_a_request_by_its_uncached_tokens(self, hrrn_trusting_llm: Any) -> None:
        from vllm import SamplingParams

        from prefillq.integrations.vllm import request_view

        scheduler = scheduler_of(hrrn_trusting_llm)
        prefix = prompt_ids(1024, seed=4242)  # 8 blocks of 128 tokens, cached by the first request
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        hrrn_trusting_llm.generate([{"prompt_token_ids": prefix}], params, use_tqdm=False)
        engine = hrrn_trusting_llm.llm_engine
        engine.add_request("shares-prefix", {"prompt_token_ids": prefix + prompt_ids(200, seed=4243)}, params)
        engine.add_request("fresh", {"prompt_token_ids": prompt_ids(1224, seed=4244)}, params)
        queued = {r.request_id.split("-")[0]: r for r in scheduler.waiting}
        assert set(queued) == {"shares", "fresh"}
        shared = request_view(queued["shares"], trust_priority=False, prefix_hit=scheduler._prefix_hit)
        fresh = request_view(queued["fresh"], trust_priority=False, prefix_hit=scheduler._prefix_hit)
        assert (shared.prompt_tokens, shared.cached_tokens) == (1224, 1024)
        assert (fresh.prompt_tokens, fresh.cached_tokens) == (1224, 0)
        while engine.has_unfinished_requests():
            engine.step()
        assert len(scheduler.waiting) == 0


@pytest.fixture(scope="class")
def ascend_srf_llm(tiny_model: str) -> Iterator[Any]:
    """An unchanged vLLM Ascend configuration; its other keys belong to other features."""
    config = {"scheduler_config": {"short_request_first_config": {"enabled": True, "threshold": 256},
                                   "enable_chunked_prefill": True},
              "some_other_feature": {"on": True}}
    llm = start_engine(tiny_model, max_num_seqs=1, additional_config=config)
    yield llm
    stop_engine(llm)


class TestShortRequestFirstFromAscendConfig:
    def test_vllm_dispatches_short_lane_first(self, ascend_srf_llm: Any) -> None:
        # short lane (<= 256 tokens) in arrival order, then the long lane in arrival order
        assert_dispatch_order(ascend_srf_llm, "short_request_first", [120, 40, 1800, 1200, 700, 300])


@pytest.fixture(scope="class")
def async_class_srf_llm(tiny_model: str) -> Iterator[Any]:
    """Our class on vLLM's AsyncScheduler, named explicitly (vLLM on CPU turns async scheduling off, so
    `Scheduler` would pick vLLM's Scheduler; this runs the async base's placeholder bookkeeping all the
    same); decodes included, so the prefill count must leave them out."""
    llm = start_engine(tiny_model, max_num_seqs=1, scheduler_cls="prefillq.integrations.vllm.AsyncModeScheduler",
                       additional_config={"prefillq": {"policy": "srf", "threshold": 256}})
    yield llm
    stop_engine(llm)


class TestAsyncSchedulerClass:
    def test_vllm_dispatches_short_lane_first(self, async_class_srf_llm: Any) -> None:
        from prefillq.integrations.vllm import AsyncModeScheduler

        assert type(scheduler_of(async_class_srf_llm)) is AsyncModeScheduler
        assert_dispatch_order(async_class_srf_llm, "short_request_first", [120, 40, 1800, 1200, 700, 300],
                              max_tokens=12)


@pytest.fixture
def tiny_kv_srf_engine(tiny_model: str) -> Iterator[Any]:
    """short_request_first with a KV cache of 10 blocks x 128 tokens: decodes run out and preempt."""
    llm = start_engine(tiny_model, num_gpu_blocks_override=10, max_model_len=1024,
                       additional_config={"prefillq": {"policy": "short_request_first", "threshold": 256}})
    yield llm
    stop_engine(llm)


def test_preempted_requests_resume_first_and_every_request_completes_once(tiny_kv_srf_engine: Any) -> None:
    llm = tiny_kv_srf_engine
    scheduler = scheduler_of(llm)
    log = record_dispatches(llm)
    lengths = [200, 150, 300, 100, 250, 180, 220, 120, 400, 90]
    outputs = generate(llm, lengths, max_tokens=120, seed=7)

    # Nothing lost, nothing duplicated: one output per request, each with all its tokens.
    assert sorted(o.request_id for o in outputs) == sorted(str(i) for i in range(len(lengths)))
    assert [len(o.outputs[0].token_ids) for o in outputs] == [120] * len(lengths)
    assert [len(o.prompt_token_ids) for o in outputs] == lengths
    # The KV cache really was too small: some requests were preempted and came back.
    resumed = [d for d in log.dispatches if d.was_preempted]
    assert resumed, "the tiny KV cache should have forced preemptions"
    assert scheduler.waiting.stats()["dispatched"].get("immediate", 0) == len(resumed)
    # Whenever a preempted request was waiting, vLLM was handed a preempted request first.
    for dispatch in log.dispatches:
        if dispatch.preempted_waiting:
            assert dispatch.was_preempted, f"fresh request dispatched while resumed ones waited: {dispatch}"
    # Every request was dispatched once fresh, then once per preemption.
    fresh = [d.request_id for d in log.dispatches if not d.was_preempted]
    assert len(fresh) == len(set(fresh)) == len(lengths)
    assert len(scheduler.waiting) == 0 and not scheduler.requests


@pytest.fixture
def aging_srf_engine(tiny_model: str) -> Iterator[Any]:
    """short_request_first whose long requests age after 1 ms: they overtake short ones at once,
    which is what the degradation warning exists to flag; statistics every 50 ms."""
    config = {"prefillq": {"policy": "short_request_first", "threshold": 256, "long_max_wait_ms": 1,
                           "stats_interval_s": 0.05}}
    llm = start_engine(tiny_model, max_num_seqs=1, additional_config=config)
    yield llm
    stop_engine(llm)


def test_statistics_line_and_degradation_warning_reach_the_log(aging_srf_engine: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    ours = logging.getLogger("prefillq")
    assert ours.getEffectiveLevel() <= logging.INFO  # the engine made INFO lines visible
    with caplog.at_level(logging.INFO, logger="prefillq"):
        log = record_dispatches(aging_srf_engine)
        generate(aging_srf_engine, [1500, 1400, 1300, 1200, 60, 50, 40, 30], max_tokens=2, seed=8)
    messages = [r.getMessage() for r in caplog.records if r.name == "prefillq"]
    assert any(m.startswith("prefillq stats policy=short_request_first") for m in messages)
    warnings = [r for r in caplog.records if r.name == "prefillq" and r.levelno == logging.WARNING]
    assert warnings and "consecutive aged-long promotions" in warnings[0].getMessage()
    order = log.prompt_lengths
    assert [n for n in order if n > 256] == [1500, 1400, 1300, 1200]
    assert sum(n > 256 for n in order[:4]) >= 3  # aged longs went ahead of waiting shorts


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        ({"additional_config": {"prefillq": {"policy": "sglang_hrrn"}}}, None,
         "'sglang_hrrn' is prefillq's emulation of another engine's queue option"),
        ({"additional_config": {"prefillq": {"policy": "short_request_first"}},
          "kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"}},
         None, "short_request_first cannot run on a decode-only node"),
        ({}, '{"policy": "hrrn",', "PREFILLQ_CONFIG: malformed JSON configuration"),
        ({"additional_config": {"prefillq": {"policy": "fastest"}}}, None, "unknown policy 'fastest'"),
        ({"additional_config": {"refresh": True,
                                "scheduler_config": {"short_request_frist_config": {"enabled": True}}}},
         None, "did you mean 'short_request_first_config'"),
    ],
    ids=["peer-emulation", "srf-on-kv-consumer", "malformed-env-config", "unknown-policy", "ascend-key-typo"],
)
def test_bad_configuration_is_refused_at_engine_start_with_a_clear_message(
        tiny_model: str, tmp_path: Any, caplog: pytest.LogCaptureFixture,
        overrides: dict, env: str | None, message: str) -> None:
    if "kv_transfer_config" in overrides:
        overrides["kv_transfer_config"]["kv_connector_extra_config"] = {"shared_storage_path": str(tmp_path)}
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.ERROR, logger="prefillq"):
        if env is not None:
            patch.setenv("PREFILLQ_CONFIG", env)
        with pytest.raises(ConfigError) as raised:
            start_engine(tiny_model, **overrides)
    # The exception the user gets is ours, with the reason in its first line, not a wrapped vLLM error.
    assert type(raised.value) is ConfigError
    text = str(raised.value)
    assert text.startswith("prefillq refuses to start the engine: ")
    assert message in text and "\n" not in text
    assert any(message in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
