"""Everything of ``prefillq calibrate`` that runs vLLM: drive an engine through the design, time each step.

The engine runs our own scheduler plug-in (:class:`RecordingScheduler` is a
:class:`prefillq.integrations.vllm.Scheduler` on the default, FCFS, policy), so the measured steps are
those of an engine served with prefillq. By default the EngineCore runs in its own process, as vLLM's
OpenAI server runs it (:func:`measure_steps_engine_process`); or in-process (:func:`measure_steps`).

Importing this module imports vLLM; ``import prefillq.calibrate`` does not. Set
``VLLM_ENABLE_V1_MULTIPROCESSING`` (``1`` for the engine-process mode, ``0`` in-process) before
importing it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from prefillq.calibrate.design import Phase, design_rounds, model_vocab_size
from prefillq.calibrate.fit import StepSample, steps_from_log
from prefillq.config import PolicyConfig
from prefillq.integrations.vllm import Scheduler
from prefillq.integrations.vllm_steps import prefill_tokens_scheduled

STEP_LOG_ENV = "PREFILLQ_CALIBRATE_STEP_LOG"
TIMED_SCHEDULER_CLASS = "prefillq.calibrate.probe.TimedRecordingScheduler"


def scheduled_pieces(scheduler: Scheduler, output: SchedulerOutput) -> Iterator[tuple[str, Any, int, int, int]]:
    """Per request in a step just scheduled: (id, request, tokens computed before, tokens scheduled,
    of those the prompt tokens prefilled; 0 for a decode)."""
    for request_id, scheduled in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        before = request.num_computed_tokens - scheduled  # schedule() has already advanced it
        yield (request_id, request, before, scheduled,
               prefill_tokens_scheduled(before, scheduled, request.num_prompt_tokens, request.num_tokens))


class RecordingScheduler(Scheduler):
    """Our scheduler on the default (FCFS) policy that remembers the composition of the last batch.

    The policy is fixed, whatever ``--additional-config`` or ``PREFILLQ_CONFIG`` say: the design relies
    on first-come-first-served batches.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_batch: StepSample | None = None

    def _policy_config(self, vllm_config: Any, additional: Any) -> tuple[PolicyConfig, str]:
        return PolicyConfig(), "prefillq calibrate (always the default policy)"

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        output = super().schedule(*args, **kwargs)
        batch = StepSample(seconds=0.0)
        for _, _, before, _, prefill in scheduled_pieces(self, output):
            if prefill:
                batch.prefill_chunks.append((prefill, before))
            else:
                batch.decode_contexts.append(before)
        self.last_batch = batch if output.num_scheduled_tokens else None
        return output


class TimedRecordingScheduler(RecordingScheduler):
    """:class:`RecordingScheduler` that appends every step's batch and times to the file named by STEP_LOG_ENV.

    vLLM resolves it by name (:data:`TIMED_SCHEDULER_CLASS`) inside its EngineCore process. A step
    starts when ``schedule()`` is entered and ends when ``update_from_output()`` returns;
    ``busy_after`` says whether the engine had unfinished requests then (so the next step followed at once).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(STEP_LOG_ENV)
        self._step_log = open(path, "a") if path else None  # noqa: SIM115 -- lives as long as the engine
        self._step_started = 0.0

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self._step_started = time.perf_counter()
        return super().schedule(*args, **kwargs)

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        ended = time.perf_counter()
        batch, self.last_batch = self.last_batch, None
        if batch is not None and self._step_log is not None:
            self._step_log.write(json.dumps({
                "start": self._step_started, "end": ended, "prefill_chunks": batch.prefill_chunks,
                "decode_contexts": batch.decode_contexts,
                "busy_after": bool(self.has_unfinished_requests())}) + "\n")
            self._step_log.flush()
        return outputs


@dataclass
class EngineInfo:
    """The engine settings a cost-model profile records."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    kv_blocks: int
    kv_bytes_per_token: int
    dtype: str
    device: str


def engine_info(vllm_config: Any) -> EngineInfo:
    """The engine settings a cost-model profile records (KV bytes per token from the model's shape)."""
    from vllm.platforms import current_platform

    model_config = vllm_config.model_config
    num_kv_heads = model_config.get_num_kv_heads(vllm_config.parallel_config)
    layers = model_config.get_num_layers(vllm_config.parallel_config)
    dtype_bytes = model_config.dtype.itemsize if hasattr(model_config.dtype, "itemsize") else 2
    return EngineInfo(
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
        block_size=vllm_config.cache_config.block_size,
        kv_blocks=int(vllm_config.cache_config.num_gpu_blocks or 0),
        kv_bytes_per_token=2 * layers * num_kv_heads * model_config.get_head_size() * dtype_bytes,
        dtype=str(model_config.dtype).replace("torch.", ""),
        device=str(current_platform.device_type),
    )


def run_phases(engine: Any, phases: Iterable[Phase], on_phase: Callable[[int], None] | None = None) -> None:
    """Submit each phase's requests together (exact prompt ids, exact output length) and run it to completion."""
    from vllm import SamplingParams

    counter = 0
    for index, phase in enumerate(phases):
        for prompt, output_tokens in phase:
            params = SamplingParams(max_tokens=output_tokens, ignore_eos=True, temperature=0.0)
            engine.add_request(f"cal-{counter}", {"prompt_token_ids": list(prompt)}, params)
            counter += 1
        while engine.has_unfinished_requests():
            engine.step()
        if on_phase is not None:
            on_phase(index)


def measure_steps(model: str, phases: Iterable[Phase], *, max_num_batched_tokens: int = 1024,
                  max_model_len: int = 8192, enforce_eager: bool = True,
                  on_phase: Callable[[int, int], None] | None = None,
                  engine_kwargs: Mapping[str, Any] | None = None) -> tuple[list[StepSample], EngineInfo]:
    """Run ``phases`` (each a list of (prompt token ids, output tokens) submitted together and run to
    completion) through an in-process engine; return every step's batch and wall time.

    The time is that of the EngineCore step alone (schedule + forward pass + update), without the
    front-end's output processing. Set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before importing vLLM.
    """
    from vllm import LLM

    llm = LLM(model=model, scheduler_cls=RecordingScheduler, enforce_eager=enforce_eager,
              max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, seed=0,
              **dict(engine_kwargs or {}))
    engine = llm.llm_engine
    core = engine.engine_core.engine_core  # in-process client -> EngineCore
    scheduler: RecordingScheduler = core.scheduler
    samples: list[StepSample] = []
    original_step = core.step_fn

    def timed_step():
        start = time.perf_counter()
        result = original_step()
        elapsed = time.perf_counter() - start
        if scheduler.last_batch is not None:
            scheduler.last_batch.seconds = elapsed
            samples.append(scheduler.last_batch)
            scheduler.last_batch = None
        return result

    core.step_fn = timed_step
    run_phases(engine, phases, None if on_phase is None else lambda index: on_phase(index, len(samples)))
    info = engine_info(engine.vllm_config)
    del llm
    return samples, info


def server_default_max_num_seqs() -> int:
    """vLLM's default ``max_num_seqs`` for its OpenAI server on this platform (not the ``LLM`` class's).

    They differ on CPU (128 vs 256 in vLLM 0.32); the profile's default must be the server's, or the
    simulator admits more requests at once than a served engine does.
    """
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    _, max_num_seqs = EngineArgs.get_batch_defaults(world_size=1)
    return int(max_num_seqs[UsageContext.OPENAI_API_SERVER])


def measure_steps_engine_process(model: str, phases: Sequence[Phase], *, max_num_batched_tokens: int = 1024,
                                 max_model_len: int = 8192, enforce_eager: bool = True,
                                 max_num_seqs: int | None = None,
                                 on_phase: Callable[[int, int], None] | None = None,
                                 ) -> tuple[list[StepSample], EngineInfo, float]:
    """Run ``phases`` through a vLLM engine whose EngineCore runs in its own process, as in vLLM's server.

    Each step is timed inside the EngineCore process by :data:`TIMED_SCHEDULER_CLASS`. Returns the
    steps, the engine settings and the median gap between back-to-back steps. ``max_num_seqs``
    defaults to the OpenAI server's default, as served. The caller must have set
    VLLM_ENABLE_V1_MULTIPROCESSING=1 before vLLM is imported.
    """
    from vllm import LLM

    with tempfile.TemporaryDirectory(prefix="prefillq-calibrate-") as folder:
        log_path = Path(folder) / "steps.jsonl"
        log_path.touch()
        previous = os.environ.get(STEP_LOG_ENV)
        os.environ[STEP_LOG_ENV] = str(log_path)
        try:
            llm = LLM(model=model, scheduler_cls=TIMED_SCHEDULER_CLASS, enforce_eager=enforce_eager,
                      max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, seed=0,
                      max_num_seqs=max_num_seqs or server_default_max_num_seqs())
        finally:
            if previous is None:
                os.environ.pop(STEP_LOG_ENV, None)
            else:
                os.environ[STEP_LOG_ENV] = previous
        engine = llm.llm_engine

        def phase_done(index: int) -> None:
            with log_path.open() as handle:
                on_phase(index, sum(1 for _ in handle))

        run_phases(engine, phases, None if on_phase is None else phase_done)
        info = engine_info(engine.vllm_config)
        if info.kv_blocks == 0 and info.device == "cpu":  # the client may not see the engine's count
            kv_blocks = int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")) * 2**30
                            // (info.kv_bytes_per_token * info.block_size))
            info = dataclasses.replace(info, kv_blocks=kv_blocks)
        llm.llm_engine.engine_core.shutdown()
        del llm
        lines = [json.loads(text) for text in log_path.read_text().splitlines() if text.strip()]
    samples, gap = steps_from_log(lines)
    return samples, info, gap


def measure(model: str, *, budget: int = 1024, max_model_len: int = 8192, seed: int = 0, rounds: int = 3,
            enforce_eager: bool = True, engine_process: bool = True,
            on_progress: Callable[[int, int], None] | None = None,
            ) -> tuple[list[StepSample], dict[str, Any]]:
    """Run ``rounds`` rounds of the designed workload through a vLLM engine.

    ``engine_process=True`` (the default) runs the EngineCore in its own process, as vLLM's OpenAI
    server does (the caller must have set VLLM_ENABLE_V1_MULTIPROCESSING=1 before vLLM is imported);
    ``False`` runs it in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0). On vLLM's CPU backend the two
    differ: a separate EngineCore binds its OpenMP threads to one core. Returns every measured step
    (warm-up excluded) and the engine settings used.
    """
    phases, warmup = design_rounds(rounds=rounds, budget=budget, max_model_len=max_model_len,
                                   vocab_size=model_vocab_size(model), seed=seed)
    boundaries: list[int] = []

    def phase_done(index: int, samples_so_far: int) -> None:
        boundaries.append(samples_so_far)
        if on_progress is not None:
            on_progress(index + 1, len(phases))

    gap = None
    if engine_process:
        samples, info, gap = measure_steps_engine_process(model, phases, max_num_batched_tokens=budget,
                                                          max_model_len=max_model_len, enforce_eager=enforce_eager,
                                                          on_phase=phase_done)
    else:
        samples, info = measure_steps(model, phases, max_num_batched_tokens=budget, max_model_len=max_model_len,
                                      enforce_eager=enforce_eager, on_phase=phase_done)
    first_measured = boundaries[warmup - 1] if warmup else 0
    engine = {"max_num_batched_tokens": info.max_num_batched_tokens, "max_num_seqs": info.max_num_seqs,
              "block_size": info.block_size, "kv_blocks": info.kv_blocks,
              "kv_bytes_per_token": info.kv_bytes_per_token, "dtype": info.dtype, "max_model_len": max_model_len,
              "device": info.device, "rounds": rounds, "enforce_eager": enforce_eager,
              "engine_process": engine_process}
    if gap is not None:
        engine["step_gap_median_s"] = gap
    return samples[first_measured:], engine


STEP_TRACE_ENV = "PREFILLQ_STEP_TRACE"
STEP_TRACE_CLASS = "prefillq.calibrate.probe.StepTraceScheduler"


class StepTraceScheduler(Scheduler):
    """Our scheduler, with the configured policy, that appends one JSON line per step to a file.

    For diagnosing the simulator against a served engine: start the server with
    ``--scheduler-cls prefillq.calibrate.probe.StepTraceScheduler`` and ``PREFILLQ_STEP_TRACE=DIR``;
    each EngineCore writes ``DIR/steps-<pid>.jsonl`` with the step's ``start``/``end``
    (``time.perf_counter`` inside the engine process, from ``schedule()`` entered to
    ``update_from_output()`` returned), its prefill chunks ``[tokens, computed before]``, decode
    contexts, the number waiting after scheduling, the requests that got their first token, the
    requests admitted with their front-end ``arrival_time`` (wall clock) and the step's wall-clock end.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        folder = os.environ.get(STEP_TRACE_ENV)
        self._trace = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self._trace = open(Path(folder) / f"steps-{os.getpid()}.jsonl", "a")  # noqa: SIM115 -- engine lifetime
        self._step: dict[str, Any] | None = None

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        started = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        chunks, decodes, firsts, admitted = [], [], [], {}
        for request_id, request, before, scheduled, prefill in scheduled_pieces(self, output):
            if prefill:
                chunks.append([prefill, before])
                if before == 0:
                    admitted[request_id] = request.arrival_time
                if before + scheduled >= request.num_prompt_tokens:
                    firsts.append(request_id)
            else:
                decodes.append(before)
        self._step = {"start": started, "prefill_chunks": chunks, "decode_contexts": decodes,
                      "waiting": len(self.waiting), "first_token": firsts,
                      "admitted": admitted} if output.num_scheduled_tokens else None
        return output

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        step, self._step = self._step, None
        if step is not None and self._trace is not None:
            step["end"] = time.perf_counter()
            step["end_wall"] = time.time()
            self._trace.write(json.dumps(step) + "\n")
            self._trace.flush()
        return outputs
