"""The plug-in's step records on vLLM's real scheduler (no model: the differential driver's made-up model).

* Recording does not change scheduling: every policy x partial-prefill mode, synchronous and
  asynchronous, schedules every step, produces every token and finishes every request exactly as the
  same configuration without recording.
* One record per step that scheduled tokens, in order, whose tokens, sequences and prefill/decode split
  add up to what that step scheduled; every request that finishes got its first token in exactly one
  recorded step.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.differential import BLOCK_SIZE, Stream, StreamRequest, model_config, run_stream

pytestmark = pytest.mark.vllm

POLICIES = [{"policy": name, "partial_prefills": mode}
            for name in ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
            for mode in ("first", "ordered")]
CHECKED = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def base_config(tiny_model: str) -> Any:
    return model_config(tiny_model)


@st.composite
def streams(draw: Any, async_scheduling: bool) -> Stream:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    requests = []
    for index in range(draw(st.integers(1, 10))):
        long = draw(st.booleans()) and draw(st.booleans())
        length = draw(st.integers(300, 1500)) if long else draw(st.integers(1, 200))
        prompt = tuple(rng.randrange(3, 2000) for _ in range(length))
        abort = draw(st.integers(0, 20)) if draw(st.integers(0, 6)) == 0 else None
        arrive = draw(st.integers(0, 20))
        requests.append(StreamRequest(str(index), prompt, draw(st.integers(1, 16)), arrive,
                                      None if abort is None else arrive + abort))
    biggest = max(-(-(len(r.prompt) + r.max_tokens) // BLOCK_SIZE) for r in requests)
    return Stream(tuple(requests), budget=draw(st.sampled_from([64, 128, 512])),
                  max_num_seqs=draw(st.integers(2, 12)), num_blocks=draw(st.integers(biggest + 2, 3 * biggest + 16)),
                  prefix_caching=draw(st.booleans()), async_scheduling=async_scheduling)


def _recorded(base_config: Any, stream: Stream, config: dict[str, Any], folder: Path) -> tuple[Any, list[dict]]:
    schedulers: list[Any] = []
    run = run_stream(base_config, stream, {**config, "record_steps": str(folder)}, setup=schedulers.append)
    [scheduler] = schedulers
    recorder = scheduler.step_recorder
    assert recorder is not None and recorder.path.parent == folder
    scheduler.shutdown()  # writes what the background writer still holds
    lines = [json.loads(line) for line in recorder.path.read_text().splitlines()]
    recorder.path.unlink()
    return run, lines


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_recording_changes_no_step_and_adds_up_to_what_was_scheduled(base_config: Any, async_scheduling: bool,
                                                                     tmp_path: Path) -> None:
    @CHECKED
    @given(stream=streams(async_scheduling), config=st.sampled_from(POLICIES))
    def check(stream: Stream, config: dict[str, Any]) -> None:
        plain = run_stream(base_config, stream, config)
        recorded, lines = _recorded(base_config, stream, config, tmp_path / "steps")
        assert [(s.scheduled, s.new, s.preempted) for s in recorded.steps] == \
            [(s.scheduled, s.new, s.preempted) for s in plain.steps]
        assert recorded.tokens == plain.tokens and recorded.finished == plain.finished
        busy = [step.scheduled for step in recorded.steps if step.scheduled]
        assert len(lines) == len(busy)
        for line, scheduled in zip(lines, busy, strict=True):
            assert line["tokens"] == sum(scheduled.values()) and line["seqs"] == len(scheduled)
            assert line["prefill_tokens"] + line["decode_tokens"] == line["tokens"]
            assert line["prefill_seqs"] + line["decode_seqs"] == line["seqs"]
            assert line["prefill_seqs"] == len(line["prefill_chunks"])
            assert line["prefill_tokens"] == sum(tokens for tokens, _ in line["prefill_chunks"])
            assert set(line["first_token"]) <= set(scheduled) and set(line["admitted"]) <= set(scheduled)
            assert line["end"] >= line["start"]
        assert [line["start"] for line in lines] == sorted(line["start"] for line in lines)
        firsts = [rid for line in lines for rid in line["first_token"]]
        finished = [rid for rid, reasons in recorded.finished.items() if reasons == ["length"]]
        assert len(firsts) == len(set(firsts)) and set(finished) <= set(firsts)

    check()


def test_the_environment_variable_records_and_the_key_is_not_a_policy_setting(base_config: Any, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration.differential import build_scheduler

    stream = Stream((StreamRequest("0", tuple(range(3, 40)), 2, 0),), budget=64, max_num_seqs=2, num_blocks=16,
                    prefix_caching=False, async_scheduling=False)
    monkeypatch.setenv("PREFILLQ_RECORD_STEPS", str(tmp_path / "env"))
    scheduler = build_scheduler(base_config, stream, {"policy": "hrrn"})
    assert scheduler.policy_config.policy == "hrrn" and scheduler.step_recorder.path.parent == tmp_path / "env"
    scheduler.shutdown()
    monkeypatch.delenv("PREFILLQ_RECORD_STEPS")
    scheduler = build_scheduler(base_config, stream, {"policy": "hrrn"})
    assert scheduler.step_recorder is None  # off by default
    scheduler.shutdown()


@settings(max_examples=200, deadline=None)
@given(requests=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 40), st.integers(0, 340), st.integers(1, 64)),
                         max_size=12))
def test_the_steps_prefill_tokens_are_what_step_records_count(requests: list[tuple[int, int, int, int]]) -> None:
    # the plug-in's per-step count against the step records' rule, request by request
    from types import SimpleNamespace

    from prefillq.integrations.vllm import _PrefillQueueMixin
    from prefillq.integrations.vllm_steps import prefill_tokens_scheduled

    table, scheduled, expected = {}, {}, 0
    for index, (prompt, output, computed_before, count) in enumerate(requests):
        total = prompt + output
        count = min(count, max(1, total - computed_before))
        computed_before = min(computed_before, total - 1)
        table[str(index)] = SimpleNamespace(num_computed_tokens=computed_before + count, num_prompt_tokens=prompt,
                                            num_tokens=total)
        scheduled[str(index)] = count
        expected += prefill_tokens_scheduled(computed_before, count, prompt, total)
    scheduled["gone"] = 5  # a request finished in the meantime: not counted
    fake = SimpleNamespace(requests=table)
    assert _PrefillQueueMixin._prefill_tokens_in(fake, SimpleNamespace(num_scheduled_tokens=scheduled)) == expected
