"""The plug-in's step records (integrations/vllm_steps.py) and reading them back (calibrate/served.py).

No vLLM here: requests and scheduler outputs are stand-ins with the fields the recorder reads. The real
scheduler with recording on is tests/integration/test_step_records_vllm.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefillq.bench.launch import LaunchedTargets, with_step_records
from prefillq.calibrate.served import decode_contexts, samples_from_steps, sequences
from prefillq.config import ConfigError, load_config, resolve_config
from prefillq.integrations.vllm_steps import RECORD_STEPS_ENV, StepRecorder, split_recording


@dataclass
class FakeRequest:
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    arrival_time: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass
class FakeOutput:
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def _recorder(tmp_path: Path) -> StepRecorder:
    clock = Clock()
    return StepRecorder(tmp_path / "steps", pid=7, flush_interval_s=3600.0, clock=clock, wall=clock)


def _lines(recorder: StepRecorder) -> list[dict]:
    recorder.close()
    return [json.loads(line) for line in recorder.path.read_text().splitlines()]


# --- configuration ------------------------------------------------------------------------------------

def test_the_key_is_taken_out_and_the_policy_keys_stay_for_the_policy() -> None:
    config = {"prefillq": {"policy": "hrrn", "record_steps": "/tmp/x"}, "other": 1}
    rest, folder = split_recording(config, environ={})
    assert folder == "/tmp/x" and rest == {"prefillq": {"policy": "hrrn"}, "other": 1}
    assert resolve_config(rest, environ={})[0].policy == "hrrn"
    assert config["prefillq"]["record_steps"] == "/tmp/x"  # vLLM's own object is left alone


def test_an_object_left_empty_leaves_the_policy_to_prefillq_config() -> None:
    rest, folder = split_recording({"prefillq": {"record_steps": "d"}}, environ={})
    assert folder == "d" and rest == {}
    assert resolve_config(rest, environ={"PREFILLQ_CONFIG": "srf"})[0].policy == "short_request_first"


def test_the_environment_variable_records_when_the_key_is_absent_and_the_key_wins() -> None:
    assert split_recording({}, environ={RECORD_STEPS_ENV: "/e"}) == ({}, "/e")
    assert split_recording(None, environ={RECORD_STEPS_ENV: " "}) == (None, None)
    assert split_recording({"prefillq": {"record_steps": "/k"}}, environ={RECORD_STEPS_ENV: "/e"})[1] == "/k"
    assert split_recording({"prefillq": {"policy": "hrrn"}}, environ={}) == ({"prefillq": {"policy": "hrrn"}}, None)


@pytest.mark.parametrize("bad", [{"record_step": "d"}, {"recordsteps": "d"}])
def test_a_near_miss_of_the_key_is_an_error_naming_it(bad: dict) -> None:
    with pytest.raises(ConfigError, match="did you mean 'record_steps'"):
        split_recording({"prefillq": bad}, environ={})


@pytest.mark.parametrize("value", ["", 3, None, ["d"]])
def test_a_value_that_is_no_folder_is_an_error(value: object) -> None:
    with pytest.raises(ConfigError, match="record_steps"):
        split_recording({"prefillq": {"record_steps": value}}, environ={})


# --- what a step records ------------------------------------------------------------------------------

def test_a_step_records_its_split_times_first_tokens_and_admissions(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    # after schedule(): "a" prefilled 100 of its 300 (fresh), "b" finished its 50-token prompt after 30,
    # "c" decodes at context 80 (2 tokens: speculative), "d" decodes at context 20
    requests = {"a": FakeRequest(300, 100, arrival_time=5.0), "b": FakeRequest(50, 50),
                "c": FakeRequest(70, 82, 11), "d": FakeRequest(10, 21, 11)}
    output = FakeOutput({"a": 100, "b": 20, "c": 2, "d": 1})
    recorder.scheduled(recorder.now(), output, requests, waiting=4)
    recorder.updated(output)
    [line] = _lines(recorder)
    assert line["tokens"] == 123 and line["seqs"] == 4
    assert (line["prefill_tokens"], line["prefill_seqs"], line["decode_tokens"], line["decode_seqs"]) == (120, 2, 3, 2)
    assert line["prefill_chunks"] == [[100, 0], [20, 30]] and line["decode_context"] == 80 + 20
    assert line["first_token"] == ["b"] and line["admitted"] == {"a": 5.0} and line["waiting"] == 4
    assert line["start"] < line["end"] <= line["end_wall"]


def test_empty_steps_are_not_recorded_and_an_unknown_output_is_ignored(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    empty = FakeOutput({})
    recorder.scheduled(recorder.now(), empty, {}, waiting=0)
    recorder.updated(empty)
    recorder.updated(FakeOutput({"x": 1}))
    assert _lines(recorder) == []


def test_async_scheduling_pairs_each_update_with_its_own_step(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    requests = {"a": FakeRequest(64, 32), "b": FakeRequest(8, 9, 1)}
    first, second = FakeOutput({"a": 32}), FakeOutput({"b": 1})
    recorder.scheduled(recorder.now(), first, requests, waiting=0)
    recorder.scheduled(recorder.now(), second, requests, waiting=0)  # scheduled before the first is applied
    recorder.updated(first)
    recorder.updated(second)
    one, two = _lines(recorder)
    assert one["prefill_tokens"] == 32 and two["decode_seqs"] == 1
    assert one["start"] < two["start"] < one["end"] < two["end"]


def test_the_background_writer_writes_without_close(tmp_path: Path) -> None:
    recorder = StepRecorder(tmp_path, pid=1, flush_interval_s=0.01)
    output = FakeOutput({"a": 4})
    recorder.scheduled(recorder.now(), output, {"a": FakeRequest(4, 4)}, waiting=0)
    recorder.updated(output)
    recorder._thread.join(timeout=0.0)
    for _ in range(500):
        if recorder.path.read_text():
            break
        recorder._stop.wait(0.01)
    assert json.loads(recorder.path.read_text())["prefill_tokens"] == 4
    recorder.close()
    recorder.close()  # idempotent


def test_a_preempted_request_recomputing_up_to_its_last_output_counts_every_scheduled_token(tmp_path: Path) -> None:
    """vLLM's real scheduler under a tight KV cache (tests/integration/test_step_records_vllm.py found it):
    a 1-token prompt with 1 output token, preempted, comes back and is scheduled both tokens in one step:
    its prompt is recomputed (prefill) and its last output token is the step's decode of it."""
    recorder = _recorder(tmp_path)
    requests = {"0": FakeRequest(1, 2, 1)}
    output = FakeOutput({"0": 2})
    recorder.scheduled(recorder.now(), output, requests, waiting=0)
    recorder.updated(output)
    [line] = _lines(recorder)
    assert line["tokens"] == 2 and line["seqs"] == 1
    assert (line["prefill_tokens"], line["prefill_seqs"], line["decode_tokens"], line["decode_seqs"]) == (1, 1, 1, 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(0, 6), st.integers(0, 500), st.integers(1, 4)),
                min_size=1, max_size=12))
def test_the_split_matches_a_naive_count(tmp_path_factory: pytest.TempPathFactory,
                                         pieces: list[tuple[int, int, int, int]]) -> None:
    """Random requests at random points: prompt length, output so far, computed before, scheduled now."""
    recorder = _recorder(tmp_path_factory.mktemp("r"))
    requests, scheduled = {}, {}
    expected_prefill = expected_decode_seqs = expected_context = 0
    for index, (prompt, outputs, before, count) in enumerate(pieces):
        before = min(before, prompt + outputs)
        if before < prompt + outputs - 1:
            outputs = 0  # a request still prefilling has no output (no preemption here)
            before = min(before, prompt - 1)
            count = min(count + 60, prompt - before)
        else:
            before = prompt + outputs - 1  # a decode: one token from its last
            count = 1
        rid = f"r{index}"
        requests[rid] = FakeRequest(prompt, before + count, outputs)
        scheduled[rid] = count
        # naive: a token at position p (0-based) of the prompt is prefill work
        prefill_here = sum(1 for p in range(before, before + count) if p < prompt)
        expected_prefill += prefill_here
        if not prefill_here:
            expected_decode_seqs += 1
            expected_context += before
    output = FakeOutput(scheduled)
    recorder.scheduled(recorder.now(), output, requests, waiting=0)
    recorder.updated(output)
    [line] = _lines(recorder)
    assert line["prefill_tokens"] == expected_prefill == sum(c for c, _ in line["prefill_chunks"])
    assert line["decode_seqs"] == expected_decode_seqs and line["decode_context"] == expected_context
    assert line["tokens"] == sum(scheduled.values()) and line["seqs"] == len(scheduled)


# --- reading records back -----------------------------------------------------------------------------

@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.integers(0, 300), st.integers(0, 10**6))
def test_decode_contexts_from_a_record_keep_the_count_and_the_sum(count: int, total: int) -> None:
    contexts = decode_contexts({"decode_seqs": count, "decode_context": total if count else 0})
    assert len(contexts) == count and sum(contexts) == (total if count else 0)
    assert not contexts or max(contexts) - min(contexts) <= 1
    assert decode_contexts({"decode_contexts": [3, 9]}) == [3, 9]
    assert sequences({"seqs": 5, "prefill_chunks": []}) == 5
    assert sequences({"prefill_chunks": [[1, 0]], "decode_contexts": [4, 4]}) == 3


def test_overlapping_async_steps_last_from_schedule_to_schedule() -> None:
    base = {"prefill_chunks": [], "decode_seqs": 1, "decode_context": 10}
    steps = [{**base, "start": 0.0, "end": 0.030}, {**base, "start": 0.012, "end": 0.045},
             {**base, "start": 0.024, "end": 0.060}, {**base, "start": 5.0, "end": 5.010}]
    seconds = [round(s.seconds, 6) for s in samples_from_steps(steps)]
    assert seconds[:2] == [0.012, 0.012]
    assert seconds[2] == 0.036 and seconds[3] == 0.010  # before an idle gap: start to end (no sync gap seen)


def test_sync_steps_back_to_back_count_the_gap_to_the_next_schedule() -> None:
    base = {"prefill_chunks": [[8, 0]], "decode_seqs": 0, "decode_context": 0}
    steps = [{**base, "start": 0.0, "end": 0.010}, {**base, "start": 0.011, "end": 0.020}]
    assert [round(s.seconds, 6) for s in samples_from_steps(steps)] == [0.011, 0.010]


# --- bench --record-steps -----------------------------------------------------------------------------

def test_bench_asks_every_plug_in_server_but_stock_to_record(tmp_path: Path) -> None:
    configs = {"stock": None, "hrrn": load_config("hrrn")}
    targets = LaunchedTargets("vllm", configs, model="/models/m", log_dir=tmp_path, base_port=8300,
                              record_steps="/res/steps")
    hrrn = targets.server("hrrn", tmp_path / "h.log").argv
    stock = targets.server("stock", tmp_path / "s.log").argv
    config = json.loads(hrrn[hrrn.index("--additional-config") + 1])
    assert config["prefillq"]["record_steps"] == "/res/steps" and config["prefillq"]["policy"] == "hrrn"
    assert not any("record_steps" in arg for arg in stock)
    assert targets.describe()["record_steps"] == "/res/steps"
    plain = LaunchedTargets("vllm", configs, model="/models/m", log_dir=tmp_path).server("hrrn", tmp_path / "p.log")
    assert not any("record_steps" in arg for arg in plain.argv)


def test_with_step_records_keeps_the_users_other_keys() -> None:
    argv = ["vllm", "--additional-config", json.dumps({"x": 1, "prefillq": {"policy": "srf"}}), "--port", "1"]
    out = with_step_records(argv, "/d")
    assert out[:3] == ["vllm", "--port", "1"]
    assert json.loads(out[-1]) == {"x": 1, "prefillq": {"policy": "srf", "record_steps": "/d"}}
    assert json.loads(with_step_records(["vllm"], "/d")[-1]) == {"prefillq": {"record_steps": "/d"}}
