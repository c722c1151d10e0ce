"""Step records of the vLLM plug-in: what each engine step scheduled and how long it took.

Off unless asked for. Turned on by the ``record_steps`` key of our ``--additional-config`` object
(``{"prefillq": {"policy": "hrrn", "record_steps": "DIR"}}``) or, when that key is absent, by the
``PREFILLQ_RECORD_STEPS`` environment variable (``DIR``). Each EngineCore process then appends one
JSON line per step that scheduled any token to ``DIR/steps-<pid>.jsonl``:

* ``start``: ``time.perf_counter()`` when ``schedule()`` was entered; ``end``: when
  ``update_from_output()`` for that step's output returned; ``end_wall``: ``time.time()`` then;
* ``tokens`` and ``seqs`` scheduled; the split: ``prefill_tokens``/``prefill_seqs`` and
  ``decode_tokens``/``decode_seqs``; ``prefill_chunks`` as ``[tokens, tokens computed before]`` per
  prefilling request and ``decode_context``, the summed context of the decoding ones (what the cost
  model's terms need, and no list that grows with the batch);
* ``waiting`` after scheduling, ``first_token`` (requests whose prompt this step completed) and
  ``admitted`` (requests that started here, with the front-end's ``arrival_time``, wall clock): what
  ``prefillq calibrate --from-bench`` needs to measure the time a request spends outside the steps.

How ``calibrate`` times a step (:mod:`prefillq.calibrate.served`): a step the next one follows at once
lasts from its ``schedule()`` to the next ``schedule()`` (the engine loop's own work between steps
counts, as it does when serving; under async scheduling, where the next ``schedule()`` runs before this
step's output is applied, that is the time between schedules); the last step before the engine idles
lasts from ``start`` to ``end`` plus the median gap between back-to-back steps.

Recording only reads the scheduler's output and requests after vLLM's ``schedule()`` returned: it
never changes what is scheduled. The engine thread appends a small dict to a list; a background
thread turns the list into JSON lines and writes them every :data:`FLUSH_INTERVAL_S`, and at shutdown
(a crash loses at most that much; readers skip a last line cut short).

Nothing here imports vLLM.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefillq.config import ADDITIONAL_CONFIG_KEY, NATIVE_KEYS, NEAR_MISS_CUTOFF, ConfigError
from prefillq.validation import close_key

RECORD_STEPS_KEY = "record_steps"
RECORD_STEPS_ENV = "PREFILLQ_RECORD_STEPS"
FLUSH_INTERVAL_S = 0.5
PENDING_LIMIT = 64  # outputs scheduled but never updated (an engine error) are dropped past this many


def prefill_tokens_scheduled(before: int, scheduled: int, num_prompt_tokens: int, num_tokens: int) -> int:
    """How many of ``scheduled`` tokens, starting at computed position ``before``, are prefill work.

    A fresh request prefills its prompt; a preempted one recomputes its prompt and its earlier output
    (all but the last token, whose step is the next decode). Decode steps contribute 0.
    """
    prefill_end = max(num_prompt_tokens, num_tokens - 1)
    return max(0, min(before + scheduled, prefill_end) - before)


def split_recording(additional_config: Any, environ: Mapping[str, str] | None = None) -> tuple[Any, str | None]:
    """``(additional_config`` without our ``record_steps`` key, the folder to record steps to or None).

    The key is read from our ``prefillq`` object (the policy's keys stay for :func:`prefillq.config.resolve_config`;
    an object left empty is dropped, so ``PREFILLQ_CONFIG`` still chooses the policy); without it,
    ``PREFILLQ_RECORD_STEPS``. A near-miss spelling of the key, or a value that is not a non-empty
    string, is a :class:`ConfigError` (SPEC §4: a typo must not silently leave recording off).
    """
    environ = os.environ if environ is None else environ
    folder: str | None = None
    inner = additional_config.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional_config, Mapping) else None
    if isinstance(inner, Mapping):
        for key in inner:
            if key != RECORD_STEPS_KEY and key not in NATIVE_KEYS and close_key(
                    key, (RECORD_STEPS_KEY,), cutoff=NEAR_MISS_CUTOFF):
                raise ConfigError(f"unknown key {key!r} in prefillq configuration: did you mean "
                                  f"{RECORD_STEPS_KEY!r}?")
        if RECORD_STEPS_KEY in inner:
            folder = inner[RECORD_STEPS_KEY]
            if not isinstance(folder, str) or not folder.strip():
                raise ConfigError(f"{RECORD_STEPS_KEY!r} must be a folder path (a non-empty string), got {folder!r}")
            rest = {key: value for key, value in inner.items() if key != RECORD_STEPS_KEY}
            additional_config = {key: value for key, value in additional_config.items()
                                 if key != ADDITIONAL_CONFIG_KEY}
            if rest:
                additional_config[ADDITIONAL_CONFIG_KEY] = rest
    if folder is None:
        folder = environ.get(RECORD_STEPS_ENV, "").strip() or None
    return additional_config, folder


class StepRecorder:
    """Records one engine's steps to ``folder/steps-<pid>.jsonl`` (module docstring).

    :meth:`scheduled` after each ``schedule()``, :meth:`updated` after each ``update_from_output()``
    (matched by the output object, so async scheduling's two steps in flight pair up), :meth:`close`
    at shutdown. ``clock`` and ``wall`` are for tests.
    """

    def __init__(self, folder: str | Path, *, pid: int | None = None, flush_interval_s: float = FLUSH_INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter, wall: Callable[[], float] = time.time) -> None:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"steps-{os.getpid() if pid is None else pid}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._clock = clock
        self._wall = wall
        self._pending: dict[int, dict[str, Any]] = {}
        self._done: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self.steps_recorded = 0
        self._thread = threading.Thread(target=self._run, name="prefillq-step-records", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def now(self) -> float:
        return self._clock()

    def scheduled(self, started: float, output: Any, requests: Mapping[str, Any], waiting: int) -> None:
        """The step ``output`` (vLLM's SchedulerOutput) that ``schedule()`` entered at ``started`` returned."""
        scheduled_tokens = output.num_scheduled_tokens
        if not scheduled_tokens:
            return
        chunks: list[list[int]] = []
        firsts: list[str] = []
        admitted: dict[str, float] = {}
        prefill_tokens = decode_tokens = decode_seqs = decode_context = 0
        for request_id, scheduled in scheduled_tokens.items():
            request = requests.get(request_id)
            if request is None:
                continue
            before = request.num_computed_tokens - scheduled  # schedule() has already advanced it
            prefill = prefill_tokens_scheduled(before, scheduled, request.num_prompt_tokens, request.num_tokens)
            if prefill:
                chunks.append([prefill, before])
                prefill_tokens += prefill
                # a preempted request recomputing its prompt and output: its last output token, when the
                # chunk reaches it, is the step's decode of that request (no second sequence)
                decode_tokens += scheduled - prefill
                fresh = request.num_output_tokens == 0
                if fresh and before == 0:
                    admitted[request_id] = request.arrival_time
                if fresh and before + scheduled >= request.num_prompt_tokens:
                    firsts.append(request_id)
            else:
                decode_seqs += 1
                decode_tokens += scheduled
                decode_context += before
        record = {"start": started, "tokens": prefill_tokens + decode_tokens, "seqs": len(chunks) + decode_seqs,
                  "prefill_tokens": prefill_tokens, "prefill_seqs": len(chunks), "decode_tokens": decode_tokens,
                  "decode_seqs": decode_seqs, "prefill_chunks": chunks, "decode_context": decode_context,
                  "waiting": waiting, "first_token": firsts, "admitted": admitted}
        pending = self._pending
        if len(pending) >= PENDING_LIMIT:
            del pending[next(iter(pending))]
        pending[id(output)] = record

    def updated(self, output: Any) -> None:
        """``update_from_output(output, ...)`` has returned: the step is over."""
        record = self._pending.pop(id(output), None)
        if record is None:
            return
        record["end"] = self._clock()
        record["end_wall"] = self._wall()
        with self._lock:
            self._done.append(record)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        """Write the steps recorded so far (called by the background thread)."""
        with self._lock:
            done, self._done = self._done, []
        if done and not self._file.closed:
            self._file.write("".join(json.dumps(record, separators=(",", ":")) + "\n" for record in done))
            self._file.flush()
            self.steps_recorded += len(done)

    def close(self) -> None:
        """Stop the writer and write what is left (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        self.flush()
        self._file.close()
        atexit.unregister(self.close)
