"""The measuring half of `prefillq calibrate` against a real vLLM engine (CPU, tiny random model).

A handful of short phases, not the whole design: enough to prove that each step's batch is recorded
with the right chunks and contexts, in-process and with the EngineCore in its own process (where vLLM
resolves the timed scheduler by its import path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_helpers import prompt_ids

pytestmark = pytest.mark.vllm

# (prompt tokens, output tokens) per phase; the budget of 256 splits the 600-token prompt into chunks.
PHASES = [[(prompt_ids(600, 1), 1)], [(prompt_ids(40, 2), 3), (prompt_ids(50, 3), 3)]]
EXPECTED_PREFILLS = [[(256, 0)], [(256, 256)], [(88, 512)], [(40, 0), (50, 0)]]


def _steps(samples: list) -> list[tuple[list, list]]:
    return [(sorted(s.prefill_chunks), sorted(s.decode_contexts)) for s in samples]


def test_in_process_probe_records_every_step_on_our_scheduler_with_the_default_policy(tiny_model: str) -> None:
    from prefillq.calibrate.probe import RecordingScheduler, measure_steps
    from prefillq.integrations.vllm import Scheduler

    assert issubclass(RecordingScheduler, Scheduler)
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFILLQ_CONFIG", "hrrn")  # calibration ignores it: the design needs FCFS batches
        samples, info = measure_steps(tiny_model, PHASES, max_num_batched_tokens=256, max_model_len=2048,
                                      on_phase=lambda index, count: seen.append((index, count)))
    prefills = [chunks for chunks, _ in _steps(samples) if chunks]
    assert prefills == EXPECTED_PREFILLS
    # two more decode steps for the second phase's pair (3 output tokens: 1 from the prefill step)
    assert [decodes for chunks, decodes in _steps(samples) if not chunks] == [[40, 50], [41, 51]]
    assert all(s.seconds > 0 for s in samples)
    assert seen == [(0, 3), (1, len(samples))]
    assert (info.max_num_batched_tokens, info.device, info.kv_bytes_per_token > 0) == (256, "cpu", True)


SCRIPT = """
import json, sys
from prefillq.calibrate.probe import TIMED_SCHEDULER_CLASS, measure_steps_engine_process

if __name__ == "__main__":
    phases = json.loads(sys.argv[2])
    samples, info, gap = measure_steps_engine_process(sys.argv[1], phases, max_num_batched_tokens=256,
                                                      max_model_len=2048)
    print(json.dumps({"class": TIMED_SCHEDULER_CLASS, "gap": gap, "kv_blocks": info.kv_blocks,
                      "steps": [[s.prefill_chunks, s.decode_contexts, s.seconds] for s in samples]}))
"""


def test_engine_process_probe_resolves_the_timed_scheduler_by_name_and_logs_every_step(
        tiny_model: str, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "PREFILLQ_CONFIG": "hrrn"}
    done = subprocess.run([sys.executable, str(script), tiny_model, json.dumps(PHASES)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["class"] == "prefillq.calibrate.probe.TimedRecordingScheduler"
    # The client hands requests to the engine process one by one, so a phase's requests may start in
    # different steps; every chunk is there all the same.
    chunks = sorted(tuple(c) for step_chunks, _, _ in result["steps"] for c in step_chunks)
    assert chunks == sorted(c for step in EXPECTED_PREFILLS for c in step)
    assert [sorted(tuple(c) for c in step[0]) for step in result["steps"][:3]] == EXPECTED_PREFILLS[:3]
    assert any(decodes and not step_chunks for step_chunks, decodes, _ in result["steps"])
    assert all(seconds > 0 for _, _, seconds in result["steps"])
    assert result["gap"] >= 0 and result["kv_blocks"] > 0


def test_step_trace_scheduler_keeps_the_configured_policy_and_writes_every_step(tiny_model: str,
                                                                                 tmp_path: Path) -> None:
    from vllm import LLM

    from prefillq.calibrate.probe import STEP_TRACE_ENV, StepTraceScheduler, run_phases

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFILLQ_CONFIG", "short_request_first")  # unlike calibration, the policy is kept
        patch.setenv(STEP_TRACE_ENV, str(tmp_path / "trace"))
        llm = LLM(model=tiny_model, scheduler_cls=StepTraceScheduler, enforce_eager=True,
                  max_num_batched_tokens=256, max_model_len=2048, seed=0)
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        assert scheduler.policy_config.policy == "short_request_first"
        run_phases(llm.llm_engine, PHASES)
        del llm
    [trace] = (tmp_path / "trace").glob("steps-*.jsonl")
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    prefills = [sorted(tuple(c) for c in step["prefill_chunks"]) for step in steps if step["prefill_chunks"]]
    assert prefills == EXPECTED_PREFILLS
    assert [sorted(step["decode_contexts"]) for step in steps if not step["prefill_chunks"]] == [[40, 50], [41, 51]]
    def ours(engine_id: str) -> str:  # vLLM appends a random suffix to the id we gave
        return engine_id.rsplit("-", 1)[0]

    firsts = [ours(rid) for step in steps for rid in step["first_token"]]
    admitted = {ours(rid): at for step in steps for rid, at in step["admitted"].items()}
    assert sorted(firsts) == sorted(admitted) == ["cal-0", "cal-1", "cal-2"]
    # the 600-token prompt is admitted in the first step and gets its first token in the third
    assert [[ours(rid) for rid in step["first_token"]] for step in steps[:3]] == [[], [], ["cal-0"]]
    assert all(step["end"] > step["start"] and step["end_wall"] >= at for step in steps for at in
               step["admitted"].values())
    assert all(isinstance(step["waiting"], int) and step["waiting"] >= 0 for step in steps)
