"""Trace replay: read request schedules recorded elsewhere into a :class:`Workload`.

Formats (detected from the file's first meaningful line):

* Azure LLM inference trace CSV (as distributed with microsoft/vidur): header
  ``arrived_at,num_prefill_tokens,num_decode_tokens`` (seconds, prompt tokens, output tokens);
* Mooncake-style JSONL: ``{"timestamp": ms, "input_length": n, "output_length": m, ...}``;
* prefillq bench per-request JSONL (``RequestRecord.to_dict()`` lines): ``scheduled_at`` (s),
  ``prompt_tokens``, ``output_tokens`` and optionally ``klass`` and ``request_id``.
* the Azure LLM inference 2023/2024 CSV and the BurstGPT CSV as their publishers distribute them
  (:mod:`prefillq.workload.published`; absolute times become seconds from the first request).

A path ending in ``.gz`` is read through gzip, and ``sample:<name>`` names a trace shipped in the package
(:mod:`prefillq.workload.samples`).

Every malformed line raises :class:`WorkloadError` naming the file and the line number.

The file is streamed line by line (never read whole, so a pipe works too) into flat arrays of a few
dozen bytes per record, and the selected window comes back as :class:`TraceRequests`: a read-only
sequence that builds each :class:`RequestSpec` when it is read. A week of production traffic (millions
of requests) fits in memory that way.

Priorities (SPEC §5): a JSONL record (or CSV column) named ``admission_priority`` is read as the
router's admission flag (an integer). A field named ``priority`` (an integer, default 0) is the request's
priority class as its client sent it to vLLM (``RequestSpec.priority``): it is a class to report figures
by, and only an engine in vLLM's ``priority`` scheduling mode honours it (the operator's declaration that
request priorities are trusted); it never sets the internal inference priority otherwise.
``Workload.params["priority_classes"]`` lists the classes present when some request is not at 0.

Sessions: a ``session_id``, ``conversation_id`` or ``session`` field (JSONL key or CSV column), else a
Mooncake record's first ``hash_ids`` entry, becomes ``RequestSpec.session`` (a fleet's
``prefix_affinity`` router keys on it).

Prefix hashes: a JSONL record's ``hash_ids`` (Mooncake: one integer per ``hash_block_tokens`` = 512
prompt tokens, chained, so equal ids mean an equal prefix; bench records may carry them too) become
``RequestSpec.hash_ids``, the keys of the simulator's prefix cache. They are kept as one flat array
with offsets, and ``params["prefix_hash_block_tokens"]`` is set only when some record has them.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prefillq.metrics import ColumnRows
from prefillq.workload.published import (
    PUBLISHED_FORMATS,
    csv_format,
    formats_help,
    read_published_csv,
    unknown_csv,
)
from prefillq.workload.samples import open_text, resolve_trace, trace_name
from prefillq.workload.scenarios import RequestSpec, Workload, WorkloadError
from prefillq.workload.split import split_threshold

AZURE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")

# (arrival, prompt, output) per row, with the optional class and id of bench records, the router's
# admission priority and the row's line number in the file.
_Row = tuple[float, int, int, str | None, str | None, int, int, str | None, int]  # ..., line, session, priority
SESSION_KEYS = ("session_id", "conversation_id", "session")
"""Fields that tie requests to one session (read for a fleet router's affinity); Mooncake's ``hash_ids``
(prefix block hashes) stand in for a session through their first hash."""

CLIENT_PRIORITY_KEY = "priority"  # the client's priority class (vLLM's request ``priority``)


def _as_admission_priority(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: admission_priority must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: admission_priority must be an integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise WorkloadError(f"{where}: admission_priority must be an integer, got {value!r}")
    return int(number)


def _as_priority(value: Any, where: str) -> int:
    """A record's ``priority`` class: an integer (empty or null: 0)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0
    try:
        return _as_admission_priority(value, where)
    except WorkloadError:
        raise WorkloadError(f"{where}: priority must be an integer, got {value!r}") from None


def _where(path: Path, line: int) -> str:
    return f"{path}:{line}"


def _as_number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: {key} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise WorkloadError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return number


def _as_tokens(value: Any, key: str, where: str, *, minimum: int) -> int:
    number = _as_number(value, key, where)
    if number != int(number) or number < minimum:
        raise WorkloadError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return int(number)



_EXACT_INT_LIMIT = 1 << 53


def _fast_numbers(arrival_text: str, prompt_text: str, output_text: str) -> tuple[float, int, int]:
    """The common case of a CSV row, quickly: ``(arrival, prompt, output)`` when the arrival is a finite
    number >= 0 and both token counts plain integers >= 1 (the values the full checks would give);
    ``(-1.0, 0, 0)`` otherwise."""
    try:
        arrival = float(arrival_text)
        prompt = int(prompt_text)
        output = int(output_text)
    except ValueError:
        return -1.0, 0, 0
    if 0.0 <= arrival < math.inf and 1 <= prompt < _EXACT_INT_LIMIT and 1 <= output < _EXACT_INT_LIMIT:
        return arrival, prompt, output
    return -1.0, 0, 0


def _read_azure_csv(path: Path, lines: Iterable[str], ignored: list[int],
                    skipped: list[int]) -> Iterator[_Row]:
    """vidur's processed CSV, or (handed to :mod:`prefillq.workload.published`) a published one."""
    reader = csv.reader(lines)
    header: list[str] | None = None
    admission_column: int | None = None
    session_column: int | None = None
    priority_column: int | None = None
    for fields in reader:
        line_number = reader.line_num
        if not fields or (not fields[0].strip() and all(not f.strip() for f in fields)):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            if any(c not in header for c in AZURE_COLUMNS):
                published = csv_format(header)
                if published is None:
                    raise unknown_csv(path, line_number, header)
                yield from read_published_csv(path, published, header, reader, skipped)
                return
            index = [header.index(c) for c in AZURE_COLUMNS]
            admission_column = header.index("admission_priority") if "admission_priority" in header else None
            priority_column = header.index(CLIENT_PRIORITY_KEY) if CLIENT_PRIORITY_KEY in header else None
            session_column = next((header.index(key) for key in SESSION_KEYS if key in header), None)
            continue
        if len(fields) != len(header):
            raise WorkloadError(f"{_where(path, line_number)}: expected {len(header)} fields, got {len(fields)}")
        arrival, prompt, output = _fast_numbers(fields[index[0]], fields[index[1]], fields[index[2]])
        if arrival < 0:  # not the plain numbers of a well-formed row: the full checks say what is wrong
            where = _where(path, line_number)
            arrival = _as_number(fields[index[0]].strip(), "arrived_at", where)
            prompt = _as_tokens(fields[index[1]].strip(), "num_prefill_tokens", where, minimum=1)
            output = _as_tokens(fields[index[2]].strip(), "num_decode_tokens", where, minimum=1)
        admission = 0
        if admission_column is not None and fields[admission_column].strip():
            admission = _as_admission_priority(fields[admission_column].strip(), _where(path, line_number))
        priority = 0
        if priority_column is not None and fields[priority_column].strip():
            priority = _as_priority(fields[priority_column].strip(), _where(path, line_number))
            ignored[0] += priority != 0
        session = (fields[session_column].strip() or None) if session_column is not None else None
        yield (arrival, prompt, output, None, None, admission, line_number, session, priority)


def _hash_ids(item: dict[str, Any], where: str) -> list[int] | None:
    hashes = item.get("hash_ids")
    if hashes is None:
        return None
    if not isinstance(hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and -_INT64 <= h < _INT64 for h in hashes):
        raise WorkloadError(f"{where}: hash_ids must be a list of 64-bit integers, got {str(hashes)[:60]}")
    return hashes or None


_INT64 = 1 << 63


def _read_jsonl(path: Path, lines: Iterable[str], ignored: list[int],
                hash_slot: list[list[int] | None]) -> Iterator[_Row]:
    """The JSONL records; before each row is handed out, ``hash_slot[0]`` is set to its ``hash_ids``."""
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = _where(path, line_number)
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {type(item).__name__}")
        priority = _as_priority(item.get(CLIENT_PRIORITY_KEY), where)
        ignored[0] += priority != 0
        admission = 0
        if item.get("admission_priority") is not None:
            admission = _as_admission_priority(item["admission_priority"], where)
        hash_slot[0] = _hash_ids(item, where)
        if "timestamp" in item or "input_length" in item:  # Mooncake
            for key in ("timestamp", "input_length", "output_length"):
                if key not in item:
                    raise WorkloadError(f"{where}: missing key {key!r} (Mooncake format)")
            arrival = _as_number(item["timestamp"], "timestamp", where) / 1000.0
            prompt = _as_tokens(item["input_length"], "input_length", where, minimum=1)
            output = _as_tokens(item["output_length"], "output_length", where, minimum=1)
            yield (arrival, prompt, output, None, None, admission, line_number, _session(item), priority)
        elif "prompt_tokens" in item:  # prefillq bench records
            for key in ("scheduled_at", "prompt_tokens", "output_tokens"):
                if key not in item:
                    raise WorkloadError(f"{where}: missing key {key!r} (prefillq bench format)")
            arrival = _as_number(item["scheduled_at"], "scheduled_at", where)
            prompt = _as_tokens(item["prompt_tokens"], "prompt_tokens", where, minimum=1)
            output = _as_tokens(item["output_tokens"], "output_tokens", where, minimum=1)
            klass = item.get("klass")
            if klass is not None and klass not in ("short", "long"):
                raise WorkloadError(f"{where}: klass must be 'short' or 'long', got {klass!r}")
            request_id = item.get("request_id")
            yield (arrival, prompt, output, klass, None if request_id is None else str(request_id),
                   admission, line_number, _session(item), priority)
        else:
            raise WorkloadError(f"{where}: unknown trace format (JSON keys {', '.join(list(item)[:8])}). "
                                f"Formats read: {formats_help()}")


def _session(item: dict[str, Any]) -> str | None:
    """A JSONL record's session: its session field, else its first prefix hash (Mooncake's ``hash_ids``)."""
    for key in SESSION_KEYS:
        if item.get(key) is not None:
            return str(item[key])
    hashes = item.get("hash_ids")
    if isinstance(hashes, list) and hashes:
        return f"prefix:{hashes[0]}"
    return None


def trace_rows(path: str | Path, lines: Iterable[str], ignored: list[int] | None = None,
               hash_slot: list[list[int] | None] | None = None,
               dropped: list[int] | None = None) -> tuple[str, Iterator[_Row]]:
    """The format of the trace whose text ``lines`` gives (``"jsonl"`` or ``"azure-csv"``, from its first
    meaningful line and ``path``'s suffix) and an iterator over its records in file order:
    ``(arrival_s, prompt, output, klass, request_id, admission_priority, line, session, priority)``.

    Streaming: a record is parsed when it is asked for, reading ``lines`` only that far. ``path`` names
    the file in errors. Each record with a non-zero ``priority`` adds one to ``ignored[0]``; a JSONL
    record's ``hash_ids`` are put in ``hash_slot[0]`` just before its row is handed out (None: none).
    Each row of a published CSV that is no request (0 prompt or output tokens) adds one to ``dropped[0]``.
    """
    path = Path(path)
    source = iter(lines)
    skipped: list[str] = []
    first = ""
    for line in source:
        skipped.append(line)
        if line.strip():
            first = line.strip()
            break
    if not first:
        raise WorkloadError(f"{path}: empty trace")
    is_jsonl = first[0] in "{[" or path.suffix.lower() in (".jsonl", ".json")
    every_line = itertools.chain(skipped, source)
    counter = [0] if ignored is None else ignored
    if is_jsonl:
        return "jsonl", _read_jsonl(path, every_line, counter, [None] if hash_slot is None else hash_slot)
    published = csv_format([f.strip() for f in next(csv.reader([first]), [])])
    return published or "azure-csv", _read_azure_csv(path, every_line, counter, [0] if dropped is None else dropped)


class _Columns:
    """Records as read, in file order, as flat arrays (about 41 bytes a record)."""

    def __init__(self) -> None:
        self.arrival = array("d")
        self.prompt = array("q")
        self.output = array("q")
        self.admission = array("q")
        self.priority = array("q")
        self.line = array("q")
        self.klass = array("b")                # 0: none given, 1: short, 2: long
        self.ids: dict[int, str] = {}          # record index -> the id a bench record carries
        self.sessions: dict[int, str] = {}     # record index -> its session, where it has one
        self.hash_ids = array("q")             # every record's prefix hashes, one after the other ...
        self.hash_end: array | None = None     # ... record i's end there (None: no record has any)

    def add_hashes(self, hashes: list[int] | None) -> None:
        """The hashes of the record about to be added (call before :meth:`add`)."""
        if hashes is not None and self.hash_end is None:
            self.hash_end = array("q", [0]) * len(self.arrival)
        if self.hash_end is not None:
            if hashes is not None:
                self.hash_ids.extend(hashes)
            self.hash_end.append(len(self.hash_ids))

    def window_hashes(self, window: Any) -> tuple[array, array] | None:
        """(hashes, ends) of the records ``window`` selects, in its order (None: no record has hashes)."""
        import numpy as np

        if self.hash_end is None:
            return None
        ends = np.frombuffer(self.hash_end, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]])[window]
        lengths = ends[window] - starts
        new_ends = np.cumsum(lengths)
        positions = np.arange(int(new_ends[-1]) if len(new_ends) else 0) + np.repeat(starts - (new_ends - lengths),
                                                                                        lengths)
        ids = np.frombuffer(self.hash_ids, dtype=np.int64)[positions]
        return array("q", ids.tobytes()), array("q", new_ends.astype(np.int64).tobytes())

    def add(self, row: _Row) -> None:
        arrival, prompt, output, klass, request_id, admission, line, session, priority = row
        if request_id is not None:
            self.ids[len(self.arrival)] = request_id
        if session is not None:
            self.sessions[len(self.arrival)] = session
        self.arrival.append(arrival)
        self.prompt.append(prompt)
        self.output.append(output)
        self.admission.append(admission)
        self.priority.append(priority)
        self.line.append(line)
        self.klass.append(_CLASS_CODES.get(klass, 0) if klass is not None else 0)


_CLASS_CODES = {"short": 1, "long": 2}
_CLASS_NAMES = ("short", "short", "long")  # a record without a class (and no threshold) counts as short


def _read_columns(path: Path, ignored: list[int], skipped: list[int]) -> tuple[str, _Columns]:
    """Stream the file (gzip-compressed where its name ends in ``.gz``) into :class:`_Columns` (errors:
    the file and line)."""
    columns = _Columns()
    try:
        with open_text(path) as handle:
            slot: list[list[int] | None] = [None]
            trace_format, rows = trace_rows(path, handle, ignored, slot, skipped)
            for row in rows:
                columns.add_hashes(slot[0])
                columns.add(row)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such trace file") from None
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise WorkloadError(f"{path}: cannot read trace ({exc})") from None
    return trace_format, columns


def _check_unique_ids(path: Path, columns: _Columns) -> set[str]:
    """The ids the records carry (bench records); an id that two records share is a
    :class:`WorkloadError` naming both lines."""
    first_line: dict[str, int] = {}
    for index, request_id in columns.ids.items():  # file order
        line = columns.line[index]
        if request_id in first_line:
            raise WorkloadError(f"{_where(path, line)}: request_id {request_id!r} is also the id of the record "
                                f"on line {first_line[request_id]}; request ids must be unique")
        first_line[request_id] = line
    return set(first_line)


def _request_ids(own: Sequence[str | None], taken: set[str]) -> list[str]:
    """The id of each request of the window: its own, else ``trace-<index>`` where no record of the file
    has that id, else the first free ``trace-<index>-<n>``."""
    taken = set(taken)
    ids: list[str] = []
    for index, request_id in enumerate(own):
        if request_id is None:
            request_id = base = f"trace-{index:07d}"
            suffix = 0
            while request_id in taken:
                suffix += 1
                request_id = f"{base}-{suffix}"
            taken.add(request_id)
        ids.append(request_id)
    return ids


class TraceRequests(ColumnRows[RequestSpec]):
    """The requests of a trace window, kept as arrays; each :class:`RequestSpec` is built when read.

    ``columns()`` gives the arrays (arrival, prompt, output, class code 1 short / 2 long) to readers
    that need no RequestSpec objects (the simulator's records).
    """

    def __init__(self, arrival_s: array, prompt: array, output: array, klass: array, admission: array | None,
                 ids: list[str] | None, sessions: list[str | None] | None = None,
                 hashes: tuple[array, array] | None = None, priority: array | None = None) -> None:
        self._arrival = arrival_s
        self._prompt = prompt
        self._output = output
        self._klass = klass
        self._admission = admission  # None: all 0
        self._ids = ids              # None: trace-<index>
        self._sessions = sessions    # None: no record has a session
        self._hashes = hashes        # (flat hash ids, each request's end there); None: no hashes
        self._priority = priority    # None: all 0

    def __len__(self) -> int:
        return len(self._arrival)

    def request_id(self, index: int) -> str:
        return f"trace-{index:07d}" if self._ids is None else self._ids[index]

    def _row(self, i: int) -> RequestSpec:
        return RequestSpec(self.request_id(i), self._arrival[i], self._prompt[i], self._output[i],
                           _CLASS_NAMES[self._klass[i]], 0 if self._admission is None else self._admission[i],
                           None if self._sessions is None else self._sessions[i], self.hash_ids(i),
                           0 if self._priority is None else self._priority[i])

    def hash_ids(self, i: int) -> tuple[int, ...] | None:
        """Request ``i``'s prefix hashes (None: it has none)."""
        if self._hashes is None:
            return None
        ids, ends = self._hashes
        start = ends[i - 1] if i else 0
        return tuple(ids[start:ends[i]]) if ends[i] > start else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TraceRequests({len(self)} requests)"

    def columns(self) -> tuple[array, array, array, array]:
        return self._arrival, self._prompt, self._output, self._klass

    def fields(self, i: int) -> tuple[str, float, int, int, str, tuple[int, ...] | None, int]:
        """Request ``i``'s (id, arrival, prompt tokens, output tokens, class, prefix hashes, priority): what a
        simulated request reads of its :class:`RequestSpec`, without building one (the simulator's hot path)."""
        return (f"trace-{i:07d}" if self._ids is None else self._ids[i], self._arrival[i], self._prompt[i],
                self._output[i], _CLASS_NAMES[self._klass[i]], None if self._hashes is None else self.hash_ids(i),
                0 if self._priority is None else self._priority[i])


def _split(prompts: Any, classes: Any, long_threshold: int | None) -> dict[str, Any]:
    """The short/long split of the selected rows: the given threshold ("user"), the classes bench records
    carry ("recorded"), else the threshold ``prefillq tune`` would choose (:func:`split_threshold`)."""
    if long_threshold is not None:
        return {"threshold": int(long_threshold), "method": "user"}
    if not len(prompts):
        return {"threshold": None, "method": "empty"}
    if bool((classes != 0).all()):
        return {"threshold": None, "method": "recorded"}
    choice = split_threshold(prompts)
    return {"threshold": choice.threshold, "method": choice.method}


def _shifted(arrivals: Any, start_s: float, rate_scale: float, chunk: int = 1 << 16) -> array:
    """``round((arrival - start_s) / rate_scale, 9)`` of each arrival, in Python floats (numpy rounds to
    decimals differently), a chunk at a time."""
    shifted = array("d")
    for begin in range(0, len(arrivals), chunk):
        shifted.extend(round((arrival - start_s) / rate_scale, 9) for arrival in arrivals[begin:begin + chunk].tolist())
    return shifted


def load_trace(
    path: str | Path,
    *,
    rate_scale: float = 1.0,
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    long_threshold: int | None = None,
    hash_block_tokens: int = 512,
) -> Workload:
    """Read a trace file; keep arrivals in ``[start_s, start_s + duration_s)`` (at most ``limit``).

    Arrival times are shifted so the window starts at 0 and divided by ``rate_scale`` (2.0 replays
    twice as fast). Requests with ``prompt_tokens <= long_threshold`` are short, the rest long (the rule of
    ``short_request_first``). Without a threshold, bench records keep their own class and other traces
    split where ``prefillq tune`` would put the threshold (:func:`prefillq.workload.split.split_threshold`:
    the KDE valley, else its percentile fallback). ``params["split"]`` says which threshold and method.
    The file is streamed; ``Workload.requests`` is a :class:`TraceRequests`. ``hash_block_tokens`` is
    how many prompt tokens one of the records' ``hash_ids`` stands for (Mooncake's 512).
    """
    import numpy as np

    path = Path(path)
    if not (isinstance(rate_scale, int | float) and math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"rate_scale must be > 0, got {rate_scale!r}")
    if limit is not None and limit < 0:
        raise WorkloadError(f"limit must be >= 0, got {limit!r}")
    if start_s < 0 or (duration_s is not None and duration_s < 0):
        raise WorkloadError("start_s and duration_s must be >= 0")
    if long_threshold is not None and long_threshold < 0:
        raise WorkloadError(f"long_threshold must be >= 0, got {long_threshold!r}")
    if isinstance(hash_block_tokens, bool) or not isinstance(hash_block_tokens, int) or hash_block_tokens < 1:
        raise WorkloadError(f"hash_block_tokens must be an integer >= 1, got {hash_block_tokens!r}")
    ignored, skipped = [0], [0]
    shown, path = path, resolve_trace(path)
    trace_format, columns = _read_columns(path, ignored, skipped)
    explicit_ids = _check_unique_ids(path, columns)

    arrivals = np.frombuffer(columns.arrival, dtype=float)
    if trace_format in PUBLISHED_FORMATS and len(arrivals) and arrivals.min() < 0:  # rows out of time order
        arrivals = np.round(arrivals - arrivals.min(), 7)
    order = np.argsort(arrivals, kind="stable")
    end_s = math.inf if duration_s is None else start_s + duration_s
    sorted_arrivals = arrivals[order]
    window = order[(sorted_arrivals >= start_s) & (sorted_arrivals < end_s)]
    if limit is not None:
        window = window[:limit]
    prompts = np.frombuffer(columns.prompt, dtype=np.int64)[window]
    classes = np.frombuffer(columns.klass, dtype=np.int8)[window]
    split = _split(prompts, classes, long_threshold)
    threshold = split["threshold"]
    if threshold is not None:  # prompt_class's rule: short when prompt_tokens <= threshold
        classes = np.where(prompts <= threshold, 1, 2).astype(np.int8)
    admission = np.frombuffer(columns.admission, dtype=np.int64)[window]
    priority = np.frombuffer(columns.priority, dtype=np.int64)[window]
    ids = None
    if explicit_ids:
        ids = _request_ids([columns.ids.get(int(i)) for i in window], explicit_ids)
    requests = TraceRequests(
        _shifted(arrivals[window], start_s, rate_scale),
        array("q", prompts.tobytes()), array("q", np.frombuffer(columns.output, dtype=np.int64)[window].tobytes()),
        array("b", classes.tobytes()), array("q", admission.tobytes()) if admission.any() else None, ids,
        [columns.sessions.get(int(i)) for i in window] if columns.sessions else None,
        columns.window_hashes(window), array("q", priority.tobytes()) if priority.any() else None)
    params = {
        "trace": str(shown),
        "format": trace_format,
        "rate_scale": rate_scale,
        "limit": limit,
        "start_s": start_s,
        "duration_s": duration_s,
        "long_threshold": threshold,
        "split": split,
    }
    if priority.any():
        params["priority_classes"] = sorted({int(p) for p in np.unique(priority)})
    if skipped[0]:
        params["skipped_rows"] = skipped[0]  # published rows with 0 prompt or output tokens
    if requests._hashes is not None and len(requests._hashes[0]):
        params["prefix_hash_block_tokens"] = hash_block_tokens
    return Workload(name=trace_name(shown), requests=requests, params=params)  # type: ignore[arg-type]
