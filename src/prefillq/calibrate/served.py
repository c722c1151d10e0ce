"""Re-fit a profile on a *served* engine: the step traces and client records of ``prefillq bench`` runs.

``prefillq calibrate`` proper drives an engine through a designed workload; this module instead reads
what a served engine did under real traffic. The folders are ``prefillq bench --launch vllm
--record-steps`` results, whose servers ran the plug-in (any policy) recording its steps to ``DIR/steps``
(:mod:`prefillq.integrations.vllm_steps`; older folders: :class:`prefillq.calibrate.probe.StepTraceScheduler`
with ``PREFILLQ_STEP_TRACE``, as ``benchmarks/vllm_sustained.py`` sets up): ``steps/steps-<pid>.jsonl`` per
EngineCore, ``logs/server-*.log`` (which name the EngineCore's pid), ``runs.jsonl`` and
``requests/<run>.jsonl``. A ``stock`` row runs no plug-in and records nothing.

* :func:`served_samples`: every step of the chosen runs (``phase``: ``warmup``, ``measured`` or
  ``all``), timed as :func:`~prefillq.calibrate.fit.steps_from_log` times them: a step the next
  one follows at once (or, under async scheduling, overlaps) lasts until that one starts, so the
  engine loop's own work between steps counts.
* :func:`frontend_seconds`: per request, the client's TTFT minus the engine's (from the front-end's
  ``arrival_time`` to the end of the step that produced the first token), with the number of
  sequences in that step: the time outside the steps. Requests are matched to the engine's by send
  order. :func:`fit_frontend` fits ``frontend_s + frontend_per_seq_s * sequences`` to them (the
  server handles every running request's output each step, so the delay grows with the batch).
* :func:`refit_profile`: a base profile with the coefficients fitted to those steps and the two
  front-end terms; the engine limits stay the base profile's. ``prefillq calibrate --from-bench``
  fits on the error in seconds (``fit_cost_model(relative=False)``): served traffic is mostly small
  decode batches, and weighing each step's relative error alike let their fit decide the large
  batches too, which put the busy time near capacity 4-11% off (measured, docs/bench.md).

Pure Python and numpy: nothing here imports vLLM.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from prefillq.bench.results import BenchError, ResultsDir
from prefillq.calibrate.fit import FitResult, StepSample
from prefillq.sim.costs import ROOFLINE_KEYS

PHASES = ("warmup", "measured", "all")
IDLE_GAP_S = 0.05  # a longer pause between two steps means the engine was idle, not busy
WINDOW_AFTER_S = 5.0  # steps this long after a run's last request was due still belong to it
RUN_LEAD_S = 5.0  # a run starts at most this long before its server's first step (the wake-up request)
ARRIVAL_SLACK_S = 0.3  # the last request of a run reaches the engine within this of being sent


class ServedTraceError(ValueError):
    """A results folder without the step traces, logs or runs a served re-fit needs."""


@dataclass
class ServerTrace:
    """One launched server's step trace, the runs that were sent to it and the folder they are in."""

    name: str
    steps: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    results: ResultsDir

    def records(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        """The client's request lines of ``run``."""
        return self.results.read_records(run["run"])[1]


# what the functions below read: results folders, or the traces server_traces() already read from them
Sources = Iterable["str | Path | Sequence[ServerTrace]"]


def _traces(sources: Sources) -> Iterator[ServerTrace]:
    for source in sources:
        yield from (server_traces(source) if isinstance(source, str | Path) else source)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    lines = path.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # a last line cut short by a crash
            raise ServedTraceError(f"{path}:{number}: not a JSON line") from None
    return rows


def server_traces(folder: str | Path) -> list[ServerTrace]:
    """The folder's servers, each with its step trace and the runs sent to it.

    A trace belongs to the server whose log names its EngineCore pid; a run belongs to the server
    whose log started it on the run's port and whose steps span the run's start (ports can be reused
    across the servers of ``--servers one-at-a-time``; ``all-at-once`` servers run side by side).
    """
    root = Path(folder)
    for needed in ("steps", "logs", "runs.jsonl"):
        if not (root / needed).exists():
            raise ServedTraceError(f"{root}: no {needed} (a `prefillq bench --launch vllm --record-steps` folder, "
                                   "or one whose servers ran prefillq.calibrate.probe.StepTraceScheduler with "
                                   "PREFILLQ_STEP_TRACE=DIR/steps)")
    servers = {}
    for log in sorted((root / "logs").glob("server-*.log")):
        text = log.read_text(errors="replace")
        pid = re.search(r"EngineCore pid=(\d+)", text)
        port = re.search(r"--port[ =](\d+)", text.split("\n", 1)[0])
        if pid:
            servers[pid.group(1)] = (log.stem, port.group(1) if port else None)
    results = ResultsDir(root)
    try:
        runs = results.read_runs()
    except BenchError as exc:
        raise ServedTraceError(str(exc)) from None
    traces = []
    for path in sorted((root / "steps").glob("steps-*.jsonl")):
        server = servers.get(path.stem.split("-", 1)[1])
        steps = _json_lines(path)
        if server is None or not steps:
            continue
        name, port = server
        first, last = steps[0]["end_wall"], steps[-1]["end_wall"]
        mine = [run for run in runs if first - RUN_LEAD_S <= float(run.get("started_at_unix", 0.0)) <= last
                and (port is None or _port(run.get("url")) in (None, port))]
        traces.append(ServerTrace(name, steps, mine, results))
    if not traces:
        raise ServedTraceError(f"{root}: no step trace belongs to a server named in logs/")
    return traces


def _port(url: Any) -> str | None:
    match = re.search(r":(\d+)(?:/|$)", str(url or ""))
    return match.group(1) if match else None


def _window(trace: ServerTrace, run: dict[str, Any]) -> tuple[float, float]:
    """Wall-clock span of ``run``'s steps: from just before it started to a while after its last request
    finished, but never into the next run on the same server (one-at-a-time: warm-up, then measured)."""
    start = float(run["started_at_unix"])
    end = start + float(run.get("metrics", {}).get("duration_s") or 0.0) + WINDOW_AFTER_S
    later = [float(other["started_at_unix"]) for other in trace.runs if float(other["started_at_unix"]) > start]
    if later:
        end = min(end, min(later) - 0.01)
    return start - 0.5, end


def _chosen(runs: Iterable[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    if phase not in PHASES:
        raise ServedTraceError(f"unknown phase {phase!r}; valid phases: {', '.join(PHASES)}")
    return [run for run in runs if phase == "all" or run.get("phase") == phase]


def steps_of(trace: ServerTrace, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace lines of ``run``'s steps (by wall-clock end)."""
    low, high = _window(trace, run)
    return [step for step in trace.steps if low <= step["end_wall"] <= high]


def decode_contexts(step: dict[str, Any]) -> list[int]:
    """A step's decode contexts: the trace's list, or (the plug-in's records) ``decode_seqs`` contexts
    summing to ``decode_context``, as even as integers allow (the cost model reads only their count and sum)."""
    if "decode_contexts" in step:
        return list(step["decode_contexts"])
    count, total = int(step.get("decode_seqs", 0)), int(step.get("decode_context", 0))
    if count <= 0:
        return []
    base, extra = divmod(total, count)
    return [base + 1] * extra + [base] * (count - extra)


def sequences(step: dict[str, Any]) -> int:
    """How many sequences a step ran (prefilling and decoding)."""
    if "seqs" in step:
        return int(step["seqs"])
    return len(step["prefill_chunks"]) + len(step["decode_contexts"])


def samples_from_steps(steps: Sequence[dict[str, Any]]) -> list[StepSample]:
    """Step samples from consecutive trace lines (see the module docstring for how a step is timed).

    A next step that starts before this one ended (async scheduling: vLLM schedules it while this one
    runs) or within :data:`IDLE_GAP_S` of its end follows at once."""
    gaps = [nxt["start"] - cur["end"] for cur, nxt in itertools.pairwise(steps)
            if 0 <= nxt["start"] - cur["end"] < IDLE_GAP_S]
    gap = statistics.median(gaps) if gaps else 0.0
    samples = []
    for index, step in enumerate(steps):
        following = steps[index + 1] if index + 1 < len(steps) else None
        if following is not None and step["start"] < following["start"] < step["end"] + IDLE_GAP_S:
            seconds = following["start"] - step["start"]
        else:
            seconds = step["end"] - step["start"] + gap
        samples.append(StepSample(seconds, [tuple(c) for c in step["prefill_chunks"]], decode_contexts(step)))
    return samples


def served_samples(sources: Sources, phase: str = "warmup") -> list[StepSample]:
    """Every step of the ``phase`` runs in ``sources``."""
    samples: list[StepSample] = []
    for trace in _traces(sources):
        for run in _chosen(trace.runs, phase):
            samples.extend(samples_from_steps(steps_of(trace, run)))
    return samples


def frontend_seconds(sources: Sources, phase: str = "warmup", policy: str | None = None) -> list[tuple[float, int]]:
    """(client TTFT minus engine TTFT in seconds, sequences in the first token's step) of every matched
    request of the ``phase`` runs (of ``policy`` only, when given)."""
    values: list[tuple[float, int]] = []
    for trace in _traces(sources):
        for run in _chosen(trace.runs, phase):
            if policy is not None and run.get("policy") != policy:
                continue
            values.extend(_run_frontend(trace, run))
    return values


def _run_frontend(trace: ServerTrace, run: dict[str, Any]) -> list[tuple[float, int]]:
    steps = steps_of(trace, run)
    start = float(run["started_at_unix"])
    firsts = {rid: (step["end_wall"], sequences(step)) for step in steps for rid in step["first_token"]}
    records = sorted((r for r in trace.records(run) if r.get("ttft_s") is not None and not r.get("error")),
                     key=lambda r: r["sent_at"])
    if not records:
        return []
    # the run's requests reached the engine after the wake-up request sent just before it and before
    # the next run on the same server: the last ones admitted by then
    until = start + records[-1]["sent_at"] + ARRIVAL_SLACK_S
    engine = sorted((arrival, firsts[rid]) for step in steps for rid, arrival in step["admitted"].items()
                    if rid in firsts and start - 0.01 <= arrival <= until)
    if len(engine) < len(records):
        return []
    return [(record["ttft_s"] - (first - arrival), batch)
            for record, (arrival, (first, batch)) in zip(records, engine[-len(records):], strict=True)]


def fit_frontend(samples: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(``frontend_s``, ``frontend_per_seq_s``), both >= 0: a least-squares line through the median delay
    at each batch size, weighted by how many requests had that size (medians: a few requests delayed
    by something else must not tilt it)."""
    import numpy as np

    from prefillq.calibrate.fit import nnls

    if not samples:
        return 0.0, 0.0
    groups: dict[int, list[float]] = {}
    for value, batch in samples:
        groups.setdefault(batch, []).append(value)
    sizes = sorted(groups)
    weights = np.sqrt([len(groups[n]) for n in sizes])
    a = np.array([[1.0, float(n)] for n in sizes]) * weights[:, None]
    b = np.array([statistics.median(groups[n]) for n in sizes]) * weights
    if len(sizes) == 1:
        return max(0.0, float(statistics.median(groups[sizes[0]]))), 0.0
    intercept, slope = nnls(a, b)
    return float(intercept), float(slope)


def frontend_terms(samples: Sequence[tuple[float, int]], terms: Sequence[str]) -> tuple[float, float]:
    """(``frontend_s``, ``frontend_per_seq_s``) with only ``terms`` fitted (calibrate/terms.py chooses them):
    none, the median delay alone, or :func:`fit_frontend`'s line."""
    if "frontend_per_seq_s" in terms:
        return fit_frontend(samples)
    if "frontend_s" in terms and samples:
        return max(0.0, float(statistics.median(value for value, _ in samples))), 0.0
    return 0.0, 0.0


def refit_profile(base: dict[str, Any], fit: FitResult, frontend: Sequence[tuple[float, int]], *, name: str,
                  sources: Sequence[str], phase: str, selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (a profile's JSON) with the fitted coefficients, the front-end terms and a calibration record.

    ``selection`` (:mod:`prefillq.calibrate.terms`): ``{"steps": ..., "frontend": ...}``, the terms chosen by
    held-out error and every candidate's error; recorded under ``calibration.terms``, the chosen sets' errors
    under ``calibration.heldout``. Without it both front-end terms are fitted."""
    profile = {key: value for key, value in base.items()
               if key not in ("calibration", "frontend_s", "frontend_per_seq_s", "cost_form", *ROOFLINE_KEYS)}
    profile["name"] = name
    profile.update(fit.cost_keys())
    chosen = (selection or {}).get("frontend", {}).get("chosen", ("frontend_s", "frontend_per_seq_s"))
    profile["frontend_s"], profile["frontend_per_seq_s"] = frontend_terms(frontend, chosen)
    delays = sorted(value for value, _ in frontend)
    profile["source"] = (
        f"Re-fitted by `prefillq calibrate --from-bench` on {date.today().isoformat()}: {fit.samples_used} steps "
        f"of a served engine (the {phase} runs of {', '.join(sources)}), fitted by non-negative least squares "
        f"on the error in seconds; frontend_s and frontend_per_seq_s are fitted to client TTFT minus engine TTFT "
        f"of {len(frontend)} requests. Engine limits from the base profile ({base.get('name')}). "
        + str(base.get("source", "")))
    profile["calibration"] = {
        "r2": round(fit.r2, 4), "batches_fitted": fit.samples_used, "batches_trimmed": fit.samples_trimmed,
        "served": True, "phase": phase, "base_profile": base.get("name"),
        "classes": {k: {m: round(v, 4) for m, v in c.items()} for k, c in fit.classes.items()},
        "frontend_ms": {"requests": len(delays), **({
            "p10": round(delays[len(delays) // 10] * 1000, 3), "median": round(statistics.median(delays) * 1000, 3),
            "p90": round(delays[9 * len(delays) // 10] * 1000, 3)} if delays else {})},
    }
    if selection:
        profile["calibration"]["terms"] = selection
        profile["calibration"]["heldout"] = {**selection.get("steps", {}).get("heldout", {}),
                                             "frontend_mae_ms": selection.get("frontend", {}).get("heldout_mae_ms")}
    return profile
