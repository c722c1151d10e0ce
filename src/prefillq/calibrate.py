"""Measure a real engine's step latencies and fit the simulator's five-coefficient cost model.

    step latency = c0 + c1 * sum(chunk) + c2 * sum(chunk * (context_before + chunk / 2))
                      + c3 * n_decode + c4 * sum(decode_context)

summed over the prefill chunks of the step (chunk tokens; tokens of that request computed before the
chunk) and its decode sequences (their context length). The measuring half drives vLLM -- by default with
its EngineCore in its own process, as vLLM's OpenAI server runs it (:func:`measure_steps_engine_process`),
or in-process (:func:`prefillq.integrations.vllm.measure_steps`) -- through a designed set of workloads: prefill-only
chunks of many sizes, chunked long prompts, small chunks on top of deep prefix-cached contexts, several
chunks in one step, and decode batches of many sizes and context lengths. Every engine step is one
sample. The whole design runs several rounds and each distinct batch keeps its fastest time (other
programs only ever slow a step down). The fit is non-negative least squares on relative error (a 5 ms
decode step counts as much as a 500 ms prefill step), with one round of outlier trimming.

Only numpy is needed here; vLLM is imported inside :func:`measure` through the integration module.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

COEFFICIENT_NAMES = ("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s",
                     "decode_context_token_s")
ASSUMED_LINK_BYTES_PER_S = 12.5e9  # 100 Gb/s; a CPU box has no KV transfer link to measure
TRIM_FACTOR = 4.0                  # a step whose relative error exceeds 4x the median is dropped once
TRIM_FLOOR = 0.25                  # ... but never one within 25%


@dataclass
class StepSample:
    """One engine step: its wall time, prefill chunks (tokens, context before) and decode contexts."""

    seconds: float
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_contexts: list[int] = field(default_factory=list)
    repeats: int = 1  # how many measured steps of this exact composition the time is the minimum of

    @property
    def batch_class(self) -> str:
        if self.prefill_chunks and self.decode_contexts:
            return "mixed"
        return "prefill" if self.prefill_chunks else "decode"


def step_features(sample: StepSample) -> np.ndarray:
    """The five regressors of the cost model for one step (same order as COEFFICIENT_NAMES)."""
    chunk_total = sum(c for c, _ in sample.prefill_chunks)
    attention = sum(c * (ctx + c / 2.0) for c, ctx in sample.prefill_chunks)
    return np.array([1.0, chunk_total, attention, len(sample.decode_contexts), sum(sample.decode_contexts)],
                    dtype=float)


def predict(coefficients: Sequence[float], sample: StepSample) -> float:
    return float(np.dot(np.asarray(coefficients, dtype=float), step_features(sample)))


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns: min ||a x - b||, x >= 0.

    The optimum is the unconstrained least-squares solution on its own support, so trying every
    support (2^5 = 32 small solves here) and keeping the best feasible one finds it exactly.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    n = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    scaled = a / scale
    best = np.zeros(n)
    best_residual = float(np.dot(b, b))
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            cols = list(support)
            solution, *_ = np.linalg.lstsq(scaled[:, cols], b, rcond=None)
            if np.any(solution < 0):
                continue
            residual = b - scaled[:, cols] @ solution
            value = float(np.dot(residual, residual))
            if value < best_residual - 1e-15 * max(1.0, best_residual):
                best_residual = value
                best = np.zeros(n)
                best[cols] = solution
    return best / scale


@dataclass
class FitResult:
    coefficients: dict[str, float]
    r2: float
    samples_used: int
    samples_trimmed: int
    classes: dict[str, dict[str, float]]

    def as_vector(self) -> np.ndarray:
        return np.array([self.coefficients[name] for name in COEFFICIENT_NAMES])


def _relative_fit(samples: Sequence[StepSample]) -> np.ndarray:
    x = np.array([step_features(s) for s in samples])
    y = np.array([s.seconds for s in samples])
    return nnls(x / y[:, None], np.ones(len(samples)))


def fit_cost_model(samples: Sequence[StepSample], *, trim: bool = True) -> FitResult:
    """Fit the five non-negative coefficients to measured steps; report R^2 and relative errors."""
    kept = [s for s in samples if s.seconds > 0 and (s.prefill_chunks or s.decode_contexts)]
    if len(kept) < len(COEFFICIENT_NAMES):
        raise ValueError(f"need at least {len(COEFFICIENT_NAMES)} measured steps, got {len(kept)}")
    coefficients = _relative_fit(kept)
    trimmed = 0
    if trim:
        errors = np.array([abs(predict(coefficients, s) / s.seconds - 1.0) for s in kept])
        limit = max(TRIM_FLOOR, TRIM_FACTOR * float(np.median(errors)))
        survivors = [s for s, e in zip(kept, errors, strict=True) if e <= limit]
        if len(survivors) >= len(COEFFICIENT_NAMES) and len(survivors) < len(kept):
            trimmed = len(kept) - len(survivors)
            kept = survivors
            coefficients = _relative_fit(kept)
    y = np.array([s.seconds for s in kept])
    predicted = np.array([predict(coefficients, s) for s in kept])
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else 1.0
    classes: dict[str, dict[str, float]] = {}
    for name in ("prefill", "decode", "mixed"):
        idx = [i for i, s in enumerate(kept) if s.batch_class == name]
        if not idx:
            continue
        rel = np.abs(predicted[idx] / y[idx] - 1.0)
        classes[name] = {"batches": len(idx), "median_abs_rel_error": float(np.median(rel)),
                         "mean_abs_rel_error": float(np.mean(rel)), "p90_abs_rel_error": float(np.quantile(rel, 0.9)),
                         "mean_step_ms": float(np.mean(y[idx]) * 1000.0)}
    return FitResult(coefficients=dict(zip(COEFFICIENT_NAMES, map(float, coefficients), strict=True)), r2=r2,
                     samples_used=len(kept), samples_trimmed=trimmed, classes=classes)


# --- the designed workload -------------------------------------------------------------------------

Phase = list[tuple[list[int], int]]  # requests submitted together: (prompt token ids, output tokens)


def design_phases(*, budget: int = 1024, max_model_len: int = 8192, vocab_size: int = 2048,
                  seed: int = 0) -> tuple[list[Phase], int]:
    """One round of the calibration workload, and how many leading phases are warm-up (not fitted).

    Prompts are random token ids (from 3 up; ids 0-2 are the tiny model's special tokens), fresh for
    every request so prefix caching hits only where a phase reuses a prefix on purpose. Rounds with
    different seeds schedule exactly the same batches (vLLM's scheduling depends on lengths only).
    """
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab_size) for _ in range(n)]

    longest = max_model_len - 64
    warmup: list[Phase] = [[(tokens(budget), 4), (tokens(64), 4)], [(tokens(256), 8)]]
    phases: list[Phase] = []
    # One prefill chunk alone, at context 0.
    for chunk in (16, 32, 64, 128, 256, 384, 512, 768, budget):
        phases.append([(tokens(min(chunk, budget)), 1)])
    # Several chunks in one step.
    phases.append([(tokens(budget // 4), 1), (tokens(budget // 4), 1), (tokens(budget // 3), 1)])
    phases.append([(tokens(32), 1) for _ in range(8)])
    # Long prompts run as budget-sized chunks at growing contexts.
    for prompt in (2 * budget, 4 * budget, 6 * budget, longest):
        phases.append([(tokens(min(prompt, longest)), 1)])
    # Small chunks on top of a deep prefix-cached context.
    for depth in (budget, 2 * budget, 4 * budget, 6 * budget):
        if depth + budget > longest:
            continue
        prefix = tokens(depth)
        phases.append([(prefix, 1)])
        for chunk in (32, 128, budget // 2):
            phases.append([(prefix + tokens(chunk), 1)])
    # Decode batches: (sequences, prompt length, output tokens).
    for sequences, prompt, output in ((1, 16, 48), (4, 16, 32), (16, 16, 32), (64, 16, 24), (128, 16, 16),
                                      (1, budget, 32), (8, budget, 32), (32, budget // 2, 24),
                                      (1, 4 * budget, 32), (4, 4 * budget, 24), (2, longest - 64, 24)):
        phases.append([(tokens(min(prompt, longest - output)), output) for _ in range(sequences)])
    return warmup + phases, len(warmup)


# --- measuring and writing the profile ---------------------------------------------------------------

def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def batch_key(sample: StepSample) -> tuple:
    return (tuple(sorted(sample.prefill_chunks)), tuple(sorted(sample.decode_contexts)))


def lower_envelope(samples: Sequence[StepSample]) -> list[StepSample]:
    """One sample per distinct batch: the fastest time it was measured at.

    Other programs on the machine only ever slow a step down, so the minimum over repeated rounds is
    the best estimate of the engine's own step time.
    """
    best: dict[tuple, StepSample] = {}
    for sample in samples:
        key = batch_key(sample)
        kept = best.get(key)
        if kept is None:
            best[key] = StepSample(sample.seconds, list(sample.prefill_chunks), list(sample.decode_contexts), 1)
        else:
            kept.seconds = min(kept.seconds, sample.seconds)
            kept.repeats += 1
    return list(best.values())


STEP_LOG_ENV = "PREFILLQ_CALIBRATE_STEP_LOG"
TIMED_SCHEDULER_CLASS = "prefillq.calibrate.TimedRecordingScheduler"


def _build_timed_scheduler() -> type:
    """vLLM's FCFS scheduler that appends every step's batch and times to the file named by STEP_LOG_ENV.

    Built on first use (module ``__getattr__``) so importing this module never imports vLLM; vLLM
    resolves ``prefillq.calibrate.TimedRecordingScheduler`` by name inside its EngineCore process.
    A step starts when ``schedule()`` is entered and ends when ``update_from_output()`` returns;
    ``busy_after`` says whether the engine had unfinished requests then (so the next step followed at once).
    """
    from prefillq.integrations.vllm import RecordingScheduler

    class TimedRecordingScheduler(RecordingScheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            path = os.environ.get(STEP_LOG_ENV)
            self._step_log = open(path, "a") if path else None  # noqa: SIM115 -- lives as long as the engine
            self._step_started = 0.0

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
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

    TimedRecordingScheduler.__module__ = __name__
    TimedRecordingScheduler.__qualname__ = "TimedRecordingScheduler"
    return TimedRecordingScheduler


def __getattr__(name: str) -> Any:
    if name == "TimedRecordingScheduler":
        cls = _build_timed_scheduler()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def steps_from_log(lines: Sequence[dict[str, Any]]) -> tuple[list[StepSample], float]:
    """Step samples from the scheduler's step log, and the median gap between back-to-back steps.

    A step followed at once by the next (the engine still had work) lasts from its start to the next
    step's start, so the engine loop's own work between steps (new requests, sending outputs) counts,
    as it does when serving. The last step of a burst lasts until its end plus that median gap.
    """
    gaps = [nxt["start"] - cur["end"] for cur, nxt in itertools.pairwise(lines) if cur["busy_after"]]
    gap = float(np.median(gaps)) if gaps else 0.0
    samples = []
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else None
        if line["busy_after"] and following is not None:
            seconds = following["start"] - line["start"]
        else:
            seconds = line["end"] - line["start"] + gap
        samples.append(StepSample(seconds, [tuple(c) for c in line["prefill_chunks"]],
                                  list(line["decode_contexts"])))
    return samples, gap


def server_default_max_num_seqs() -> int:
    """vLLM's default ``max_num_seqs`` for its OpenAI server on this platform (not the ``LLM`` class's).

    They differ on CPU (128 vs 256 in vLLM 0.32); the profile's default must be the server's, or the
    simulator admits more requests at once than a served engine does. Imports vLLM.
    """
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    _, max_num_seqs = EngineArgs.get_batch_defaults(world_size=1)
    return int(max_num_seqs[UsageContext.OPENAI_API_SERVER])


def measure_steps_engine_process(model: str, phases: Sequence[Phase], *, max_num_batched_tokens: int = 1024,
                                 max_model_len: int = 8192, enforce_eager: bool = True,
                                 max_num_seqs: int | None = None,
                                 on_phase: Callable[[int, int], None] | None = None,
                                 ) -> tuple[list[StepSample], Any, float]:
    """Run ``phases`` through a vLLM engine whose EngineCore runs in its own process, as in vLLM's server.

    Each step is timed inside the EngineCore process by :data:`TIMED_SCHEDULER_CLASS`. Returns the
    steps, the engine settings (``prefillq.integrations.vllm.EngineInfo``) and the median gap between
    back-to-back steps. ``max_num_seqs`` defaults to the OpenAI server's default, as served. The caller
    must have set VLLM_ENABLE_V1_MULTIPROCESSING=1 before vLLM is imported.
    """
    import tempfile

    from vllm import LLM

    from prefillq.integrations.vllm import engine_info, run_phases

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
    vocab_size = 2048
    config_file = Path(model) / "config.json"
    if config_file.exists():
        vocab_size = int(json.loads(config_file.read_text()).get("vocab_size", vocab_size))
    phases: list[Phase] = []
    warmup = 0
    for round_index in range(rounds):
        round_phases, round_warmup = design_phases(budget=budget, max_model_len=max_model_len,
                                                   vocab_size=vocab_size, seed=seed + round_index)
        if round_index == 0:
            phases += round_phases
            warmup = round_warmup
        else:
            phases += round_phases[round_warmup:]

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
        from prefillq.integrations.vllm import measure_steps  # imports vLLM

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


def _device_name(engine: dict[str, Any]) -> str:
    device = str(engine.get("device", "cpu"))
    if device == "cpu":
        return f"CPU ({_cpu_name()})"
    return device.upper()


def build_profile(name: str, fit: FitResult, engine: dict[str, Any], *, model: str) -> dict[str, Any]:
    """A profile file in the simulator's format, with the fit quality kept alongside."""
    from importlib.metadata import PackageNotFoundError, version

    vllm_version = "(version unknown)"
    for distribution in ("vllm-cpu", "vllm"):
        try:
            vllm_version = version(distribution)
            break
        except PackageNotFoundError:
            continue
    spec = {}
    marker = Path(model) / "prefillq-tiny-model.json"
    if marker.exists():
        spec = json.loads(marker.read_text())
    shape = (f"Random-weight tiny Llama ({spec.get('num_layers')} layers, hidden {spec.get('hidden_size')}, "
             f"vocab {spec.get('vocab_size')}, {engine['dtype']})" if spec
             else f"Model {Path(model).name} ({engine['dtype']})")
    where = ("an engine whose EngineCore ran in its own process, as in vLLM's OpenAI server"
             if engine.get("engine_process", False) else "an in-process engine")
    calibration_extra = {}
    if "step_gap_median_s" in engine:
        calibration_extra["step_gap_median_ms"] = round(engine["step_gap_median_s"] * 1000.0, 3)
    return {
        "name": name,
        "description": (f"{shape} served by vLLM {vllm_version} on {_device_name(engine)}, "
                        f"{'eager mode' if engine.get('enforce_eager', True) else 'compiled'}, prefill budget "
                        f"{engine['max_num_batched_tokens']} tokens per step."),
        "source": (f"Measured by `prefillq calibrate` on {date.today().isoformat()}: {fit.samples_used} "
                   f"distinct batches of {where} (each the fastest of {engine.get('rounds', 1)} "
                   f"rounds), fitted by non-negative least squares on relative error. "
                   f"kv_transfer.link_bytes_per_s is assumed (100 Gb/s), not measured."),
        **{key: fit.coefficients[key] for key in COEFFICIENT_NAMES},
        "defaults": {"max_num_batched_tokens": engine["max_num_batched_tokens"],
                     "max_num_seqs": engine["max_num_seqs"], "block_size": engine["block_size"],
                     "kv_blocks": engine["kv_blocks"], "long_prefill_token_threshold": 0},
        "kv_transfer": {"bytes_per_token": engine["kv_bytes_per_token"],
                        "link_bytes_per_s": ASSUMED_LINK_BYTES_PER_S},
        "calibration": {"r2": round(fit.r2, 4), "batches_fitted": fit.samples_used,
                        "batches_trimmed": fit.samples_trimmed, "rounds": engine.get("rounds", 1),
                        "classes": {k: {m: round(v, 4) for m, v in c.items()} for k, c in fit.classes.items()},
                        "max_model_len": engine["max_model_len"],
                        "engine_process": bool(engine.get("engine_process", False)), **calibration_extra},
    }


def write_samples(samples: Sequence[StepSample], path: str | Path) -> Path:
    """Every measured step as one JSON line (seconds, prefill_chunks, decode_contexts)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as handle:
        for s in samples:
            handle.write(json.dumps({"seconds": s.seconds, "prefill_chunks": s.prefill_chunks,
                                     "decode_contexts": s.decode_contexts, "repeats": s.repeats}) + "\n")
    return out


def read_samples(path: str | Path) -> list[StepSample]:
    samples = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            samples.append(StepSample(float(data["seconds"]), [tuple(c) for c in data["prefill_chunks"]],
                                      list(data["decode_contexts"]), int(data.get("repeats", 1))))
    return samples


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    return out
