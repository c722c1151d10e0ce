"""Trace replay: read request schedules recorded elsewhere into a :class:`Workload`.

Formats (detected from the file's first meaningful line):

* Azure LLM inference trace CSV (as distributed with microsoft/vidur): header
  ``arrived_at,num_prefill_tokens,num_decode_tokens`` (seconds, prompt tokens, output tokens);
* Mooncake-style JSONL: ``{"timestamp": ms, "input_length": n, "output_length": m, ...}``;
* prefillq bench per-request JSONL (``RequestRecord.to_dict()`` lines): ``scheduled_at`` (s),
  ``prompt_tokens``, ``output_tokens`` and optionally ``klass`` and ``request_id``.

Every malformed line raises :class:`WorkloadError` naming the file and the line number.

Priorities (SPEC §5): a JSONL record (or CSV column) named ``admission_priority`` is read as the
router's admission flag (an integer). A field named ``priority`` is *ignored*: a trace is what clients
sent, and nothing a client sends may set the engine's internal inference priority. The number of
ignored ``priority`` fields is reported in ``Workload.params["ignored_priority_fields"]``.

Sessions: a ``session_id``, ``conversation_id`` or ``session`` field (JSONL key or CSV column), else a
Mooncake record's first ``hash_ids`` entry, becomes ``RequestSpec.session`` (a fleet's
``prefix_affinity`` router keys on it).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from prefillq.workload.scenarios import RequestSpec, Workload, WorkloadError
from prefillq.workload.split import prompt_class, split_threshold

AZURE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")

# (arrival, prompt, output) per row, with the optional class and id of bench records, the router's
# admission priority, the row's line number in the file and its session (or first prefix hash), if any.
_Row = tuple[float, int, int, str | None, str | None, int, int, str | None]
SESSION_KEYS = ("session_id", "conversation_id", "session")
"""Fields that tie requests to one session (read for a fleet router's affinity); Mooncake's ``hash_ids``
(prefix block hashes) stand in for a session through their first hash."""

CLIENT_PRIORITY_KEY = "priority"  # ignored wherever it appears (SPEC §5)


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


def _read_azure_csv(path: Path, lines: list[str], ignored: list[int]) -> list[_Row]:
    reader = csv.reader(lines)
    rows: list[_Row] = []
    header: list[str] | None = None
    admission_column: int | None = None
    session_column: int | None = None
    priority_column = False
    for line_number, fields in enumerate(reader, start=1):
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            missing = [c for c in AZURE_COLUMNS if c not in header]
            if missing:
                raise WorkloadError(
                    f"{_where(path, line_number)}: CSV header lacks column(s) {', '.join(missing)}; "
                    f"expected {','.join(AZURE_COLUMNS)}"
                )
            index = [header.index(c) for c in AZURE_COLUMNS]
            admission_column = header.index("admission_priority") if "admission_priority" in header else None
            priority_column = CLIENT_PRIORITY_KEY in header
            session_column = next((header.index(key) for key in SESSION_KEYS if key in header), None)
            continue
        where = _where(path, line_number)
        if len(fields) != len(header):
            raise WorkloadError(f"{where}: expected {len(header)} fields, got {len(fields)}")
        arrival = _as_number(fields[index[0]].strip(), "arrived_at", where)
        prompt = _as_tokens(fields[index[1]].strip(), "num_prefill_tokens", where, minimum=1)
        output = _as_tokens(fields[index[2]].strip(), "num_decode_tokens", where, minimum=1)
        admission = 0
        if admission_column is not None and fields[admission_column].strip():
            admission = _as_admission_priority(fields[admission_column].strip(), where)
        if priority_column:
            ignored[0] += 1
        session = (fields[session_column].strip() or None) if session_column is not None else None
        rows.append((arrival, prompt, output, None, None, admission, line_number, session))
    return rows


def _read_jsonl(path: Path, lines: list[str], ignored: list[int]) -> list[_Row]:
    rows: list[_Row] = []
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
        if CLIENT_PRIORITY_KEY in item:
            ignored[0] += 1  # never mapped onto anything (SPEC §5)
        admission = 0
        if item.get("admission_priority") is not None:
            admission = _as_admission_priority(item["admission_priority"], where)
        if "timestamp" in item or "input_length" in item:  # Mooncake
            for key in ("timestamp", "input_length", "output_length"):
                if key not in item:
                    raise WorkloadError(f"{where}: missing key {key!r} (Mooncake format)")
            arrival = _as_number(item["timestamp"], "timestamp", where) / 1000.0
            prompt = _as_tokens(item["input_length"], "input_length", where, minimum=1)
            output = _as_tokens(item["output_length"], "output_length", where, minimum=1)
            rows.append((arrival, prompt, output, None, None, admission, line_number, _session(item)))
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
            rows.append((arrival, prompt, output, klass, None if request_id is None else str(request_id),
                         admission, line_number, _session(item)))
        else:
            raise WorkloadError(
                f"{where}: unrecognised record; expected Mooncake keys (timestamp, input_length, "
                "output_length) or prefillq bench keys (scheduled_at, prompt_tokens, output_tokens)"
            )
    return rows


def _session(item: dict[str, Any]) -> str | None:
    """A JSONL record's session: its session field, else its first prefix hash (Mooncake's ``hash_ids``)."""
    for key in SESSION_KEYS:
        if item.get(key) is not None:
            return str(item[key])
    hashes = item.get("hash_ids")
    if isinstance(hashes, list) and hashes:
        return f"prefix:{hashes[0]}"
    return None


def _explicit_ids(path: Path, rows: list[_Row]) -> set[str]:
    """The ids the records carry (bench records), in file order; an id that two records share is a
    :class:`WorkloadError` naming both lines."""
    first_line: dict[str, int] = {}
    for row in rows:
        request_id, line = row[4], row[6]
        if request_id is None:
            continue
        if request_id in first_line:
            raise WorkloadError(f"{_where(path, line)}: request_id {request_id!r} is also the id of the record "
                                f"on line {first_line[request_id]}; request ids must be unique")
        first_line[request_id] = line
    return set(first_line)


def _request_ids(window: list[_Row], taken: set[str]) -> list[str]:
    """The id of each request in ``window``: its own, else ``trace-<index>`` where no record of the file
    has that id, else the first free ``trace-<index>-<n>``."""
    taken = set(taken)
    ids: list[str] = []
    for index, row in enumerate(window):
        request_id = row[4]
        if request_id is None:
            request_id = base = f"trace-{index:07d}"
            suffix = 0
            while request_id in taken:
                suffix += 1
                request_id = f"{base}-{suffix}"
            taken.add(request_id)
        ids.append(request_id)
    return ids


def _split(window: list[_Row], long_threshold: int | None) -> dict[str, Any]:
    """The short/long split of the selected rows: the given threshold ("user"), the classes bench records
    carry ("recorded"), else the threshold ``prefillq tune`` would choose (:func:`split_threshold`)."""
    if long_threshold is not None:
        return {"threshold": int(long_threshold), "method": "user"}
    if not window:
        return {"threshold": None, "method": "empty"}
    if all(row[3] is not None for row in window):
        return {"threshold": None, "method": "recorded"}
    choice = split_threshold([row[1] for row in window])
    return {"threshold": choice.threshold, "method": choice.method}


def load_trace(
    path: str | Path,
    *,
    rate_scale: float = 1.0,
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    long_threshold: int | None = None,
) -> Workload:
    """Read a trace file; keep arrivals in ``[start_s, start_s + duration_s)`` (at most ``limit``).

    Arrival times are shifted so the window starts at 0 and divided by ``rate_scale`` (2.0 replays
    twice as fast). Requests with ``prompt_tokens <= long_threshold`` are short, the rest long (the rule of
    ``short_request_first``). Without a threshold, bench records keep their own class and other traces
    split where ``prefillq tune`` would put the threshold (:func:`prefillq.workload.split.split_threshold`:
    the KDE valley, else its percentile fallback). ``params["split"]`` says which threshold and method.
    """
    path = Path(path)
    if not (isinstance(rate_scale, int | float) and math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"rate_scale must be > 0, got {rate_scale!r}")
    if limit is not None and limit < 0:
        raise WorkloadError(f"limit must be >= 0, got {limit!r}")
    if start_s < 0 or (duration_s is not None and duration_s < 0):
        raise WorkloadError("start_s and duration_s must be >= 0")
    if long_threshold is not None and long_threshold < 0:
        raise WorkloadError(f"long_threshold must be >= 0, got {long_threshold!r}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such trace file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read trace ({exc})") from None
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first:
        raise WorkloadError(f"{path}: empty trace")
    is_jsonl = first[0] in "{[" or path.suffix.lower() in (".jsonl", ".json")
    ignored = [0]
    rows = _read_jsonl(path, lines, ignored) if is_jsonl else _read_azure_csv(path, lines, ignored)
    trace_format = "jsonl" if is_jsonl else "azure-csv"
    explicit_ids = _explicit_ids(path, rows)

    rows.sort(key=lambda row: row[0])  # stable
    end_s = math.inf if duration_s is None else start_s + duration_s
    window = [row for row in rows if start_s <= row[0] < end_s]
    if limit is not None:
        window = window[:limit]
    split = _split(window, long_threshold)
    threshold = split["threshold"]

    ids = _request_ids(window, explicit_ids)
    requests: list[RequestSpec] = []
    for rid, (arrival, prompt, output, klass, _, admission, _, session) in zip(ids, window, strict=True):
        if threshold is not None:
            klass = prompt_class(prompt, threshold)
        requests.append(
            RequestSpec(
                request_id=rid,
                arrival_s=round((arrival - start_s) / rate_scale, 9),
                prompt_tokens=prompt,
                output_tokens=output,
                klass=klass or "short",
                admission_priority=admission,
                session=session,
            )
        )
    params = {
        "trace": str(path),
        "format": trace_format,
        "rate_scale": rate_scale,
        "limit": limit,
        "start_s": start_s,
        "duration_s": duration_s,
        "long_threshold": threshold,
        "split": split,
        "ignored_priority_fields": ignored[0],
    }
    return Workload(name=path.stem, requests=requests, params=params)
