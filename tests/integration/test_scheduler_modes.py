"""One class name right in every scheduling mode, and the supported vLLM range (SPEC §4.1).

The pipelined engine is vLLM's own ``EngineCore.step_with_batch_queue`` with two batches in flight, as
on a GPU with async scheduling (the CPU build turns async scheduling off when it builds a config, so the
test turns it back on for the engine it builds). The executor starts the real worker (KV cache sizing)
but makes up each step's output at once, deterministic per request and position: the test is about how
the engine pipelines the scheduler's batches, and stays free of threads and timing.
"""

from __future__ import annotations

import copy
import logging
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any
from unittest.mock import PropertyMock, patch

import pytest

from prefillq.config import ConfigError
from prefillq.integrations import vllm as plugin
from prefillq.integrations.vllm_log import quiet_scheduler_warning
from tests.integration.engine_helpers import SCHEDULER, prompt_ids

STOCK_ASYNC = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"


def _pipelined_run(model: str, scheduler_cls: str) -> dict[str, Any]:
    """4 requests x 8 tokens through a two-batch pipelined EngineCore; what the scheduler did."""
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.outputs import ModelRunnerOutput

    def done(value: Any) -> Future:
        future: Future = Future()
        future.set_result(value)
        return future

    class ScriptedExecutor(UniProcExecutor):
        """Real worker for start-up; each step's output made up from the scheduler's state at once."""

        scheduler: Any = None
        pending: Any = None

        def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
            ids = list(scheduler_output.num_scheduled_tokens)
            tokens = []
            for request_id in ids:
                request = self.scheduler.requests[request_id]
                position = request.num_computed_tokens  # after this step (schedule() has advanced it)
                finished_prefill = position >= request.num_prompt_tokens
                tokens.append([3 + (7 * position + int(request_id)) % 1000] if finished_prefill else [])
            self.pending = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                             sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={},
                                             pooler_output=[])
            # As the real runner: an empty step's output comes from execute_model, else from sample_tokens.
            return done(None if ids else copy.deepcopy(self.pending))

        def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
            return done(copy.deepcopy(self.pending))

    config = EngineArgs(model=model, enforce_eager=True, scheduler_cls=scheduler_cls, max_num_batched_tokens=512,
                        max_model_len=1024, seed=0).create_engine_config()
    config.scheduler_config.async_scheduling = True
    with patch.object(VllmConfig, "max_concurrent_batches", new_callable=PropertyMock, return_value=2):
        core = EngineCore(vllm_config=config, log_stats=False, executor_class=ScriptedExecutor)
    core.model_executor.scheduler = core.scheduler
    seen = {"calls": 0, "empty": 0, "overlapped": 0, "batches": 0}
    schedule = core.scheduler.schedule

    def counting_schedule(*args: Any, **kwargs: Any) -> Any:
        seen["calls"] += 1
        output = schedule(*args, **kwargs)
        if output.total_num_scheduled_tokens == 0:
            seen["empty"] += 1
        else:
            seen["batches"] += 1
            # overlapped: another batch with work is still in flight (queued entries: future, output, ...)
            seen["overlapped"] += any(entry[1].total_num_scheduled_tokens > 0 for entry in core.batch_queue)
        return output

    core.scheduler.schedule = counting_schedule
    try:
        for i in range(4):
            request = EngineCoreRequest(
                request_id=str(i), prompt_token_ids=prompt_ids(20 + 7 * i, seed=i), mm_features=None,
                sampling_params=SamplingParams(max_tokens=8, ignore_eos=True), pooling_params=None,
                arrival_time=float(i), lora_request=None, cache_salt=None, data_parallel_rank=None)
            core.add_request(*core.preprocess_add_request(request))
        tokens: dict[str, list[int]] = {}
        while core.scheduler.has_requests() or core.batch_queue:
            outputs = core.step_with_batch_queue()[0] or {}
            for engine_outputs in outputs.values():
                for out in engine_outputs.outputs:
                    tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        seen["tokens"] = tokens
        seen["class"] = type(core.scheduler)
    finally:
        core.shutdown()
    return seen


def test_scheduler_runs_on_vllm_async_scheduler_in_the_pipelined_engine(vllm_env_root: Any, tiny_model: str) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler

    stock = _pipelined_run(tiny_model, STOCK_ASYNC)
    ours = _pipelined_run(tiny_model, SCHEDULER)
    assert issubclass(ours["class"], VllmAsyncScheduler)
    assert issubclass(ours["class"], plugin.Scheduler)
    # batches overlap with the one in flight exactly as with stock vLLM's AsyncScheduler
    assert stock["overlapped"] > stock["batches"] // 2
    for key in ("calls", "empty", "batches", "overlapped", "tokens"):
        assert ours[key] == stock[key], key
    assert sorted(ours["tokens"]) == ["0", "1", "2", "3"]
    assert all(len(t) == 8 for t in ours["tokens"].values())


@pytest.mark.parametrize("name", ["Scheduler", "AsyncScheduler"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_class_name_picks_vllm_base_by_mode(name: str, async_scheduling: bool) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler

    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    cls = getattr(plugin, name)
    for instance in (cls.__new__(cls, vllm_config=config), cls.__new__(cls, config)):
        assert isinstance(instance, plugin.Scheduler) and isinstance(instance, VllmScheduler)
        assert isinstance(instance, VllmAsyncScheduler) is async_scheduling


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize(("name", "other_name"), [
    ("prefillq.integrations.vllm.Scheduler", "collections.UserDict"),
    ("prefillq.integrations.vllm.AsyncScheduler", "collections.UserList"),
])
def test_vllm_does_not_warn_that_our_class_disables_async_scheduling(name: str, other_name: str) -> None:
    """vLLM warns once per class name; another class (a fresh name each case) still gets its warning."""
    from vllm.config.scheduler import SchedulerConfig

    quiet_scheduler_warning()
    quiet_scheduler_warning()  # idempotent
    target = logging.getLogger("vllm.config.scheduler")
    records = _Records()
    target.addHandler(records)
    try:
        ours = SchedulerConfig.get_scheduler_cls(SimpleNamespace(scheduler_cls=name, async_scheduling=True))
        other = SchedulerConfig.get_scheduler_cls(SimpleNamespace(scheduler_cls=other_name, async_scheduling=True))
    finally:
        target.removeHandler(records)
    assert ours is plugin.Scheduler
    assert other.__name__ == other_name.split(".")[1]
    assert not any(name in m for m in records.messages)
    assert any(other_name in m and "async scheduling" in m for m in records.messages)


def test_supported_range_is_stated_and_enforced() -> None:
    assert plugin.version_in_range(plugin.vllm_version())  # the vLLM under test is a supported one
    for version in ("0.32.0", "0.33.0", "0.34.0"):
        assert plugin.check_vllm_version(version, []) is None
    for version in ("0.34.2", "0.33.1rc1", "0.34.1.dev45+g1234abc"):  # in the range, not a tested build: a word
        untested = plugin.check_vllm_version(version, [])
        assert untested is not None and version in untested and "0.34.0" in untested
    warning = plugin.check_vllm_version("0.35.0", [])
    assert warning is not None and ">=0.32,<0.35" in warning and "0.35.0" in warning
    with pytest.raises(ConfigError, match=r"0\.31\.2 is outside the range prefillq supports \(>=0\.32,<0\.35.*"
                                          r"Scheduler\._reserve_prefill_lookahead"):
        plugin.check_vllm_version("0.31.2", ["Scheduler._reserve_prefill_lookahead"])
    with pytest.raises(ConfigError, match="outside the range"):
        plugin.check_vllm_version("1.0.0.dev0+abc", ["Scheduler.waiting"])


def test_every_needed_hook_is_present_in_this_vllm() -> None:
    assert plugin._missing_methods() == []


def _engine_view(**overrides: Any) -> SimpleNamespace:
    """What _check_engine reads of a scheduler after vLLM's own __init__."""
    view = SimpleNamespace(cache_aware_window=0)
    for name in plugin.NEEDED_ATTRIBUTES:  # dotted names are attributes of attributes
        obj = view
        *path, last = name.split(".")
        for part in path:
            if not hasattr(obj, part) or not isinstance(getattr(obj, part), SimpleNamespace):
                setattr(obj, part, SimpleNamespace())
            obj = getattr(obj, part)
        setattr(obj, last, object())
    for name, value in overrides.items():
        setattr(view, name, value)
    return view


def test_engine_outside_the_range_with_every_hook_warns_once(caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from prefillq.config import PolicyConfig

    monkeypatch.setattr(plugin, "_warned", set())
    outside = plugin.check_vllm_version("0.35.0", [])
    with caplog.at_level(logging.WARNING, logger="prefillq"):
        for _ in range(3):
            plugin._PrefillQueueMixin._check_engine(_engine_view(), PolicyConfig(), outside)
    warnings = [r.getMessage() for r in caplog.records if "outside the range" in r.getMessage()]
    assert len(warnings) == 1 and "0.35.0" in warnings[0]


def test_engine_missing_a_hook_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefillq.config import PolicyConfig

    view = _engine_view()
    del view.kv_holding_waiting
    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.36.0")
    with pytest.raises(ConfigError, match=r"vLLM 0\.36\.0 is outside the range .*Scheduler\.kv_holding_waiting"):
        plugin._PrefillQueueMixin._check_engine(view, PolicyConfig(), plugin.check_vllm_version("0.36.0", []))
    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.34.9")
    with pytest.raises(ConfigError, match=r"vLLM 0\.34\.9 lacks Scheduler\.kv_holding_waiting"):
        plugin._PrefillQueueMixin._check_engine(view, PolicyConfig(), None)


@pytest.mark.parametrize("policy", ["default", "hrrn"])
def test_cache_aware_window_only_with_default(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefillq.config import PolicyConfig

    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.34.0")  # the release that has the window
    view = _engine_view(cache_aware_window=8)
    if policy == "default":
        plugin._PrefillQueueMixin._check_engine(view, PolicyConfig(policy=policy), None)
    else:
        with pytest.raises(ConfigError, match=r"cache_aware_admission_window=8 .*'hrrn' policy"):
            plugin._PrefillQueueMixin._check_engine(view, PolicyConfig(policy=policy), None)
