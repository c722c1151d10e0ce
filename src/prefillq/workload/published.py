"""Readers for request traces in the form their publishers distribute them.

* Azure LLM inference trace 2023 (Splitwise) and 2024 (DynamoLLM), Azure/AzurePublicDataset: CSV
  ``TIMESTAMP,ContextTokens,GeneratedTokens``. ``TIMESTAMP`` is a wall-clock date and time
  (``2023-11-16 18:15:46.6805900``; the 2024 files add a UTC offset, ``+00:00``).
* BurstGPT (HPMLL/BurstGPT): CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
  (newer releases add ``Session ID`` and ``Elapsed time``). ``Timestamp`` is in seconds.

Both give absolute arrival times: each reader yields seconds since the file's first row, and
:func:`prefillq.workload.traces.load_trace` then starts the trace at its earliest request.
A row whose prompt or output is 0 tokens (BurstGPT logs a failed request with 0 response tokens) is
not a request a server completes: it is skipped and counted in ``skipped[0]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefillq.workload.scenarios import WorkloadError

AZURE_LLM_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
BURSTGPT_SESSION = "Session ID"
PUBLISHED_FORMATS = ("azure-llm-csv", "burstgpt-csv")

# name -> (the columns or keys it needs, what it is); the error for a file of unknown format lists these.
TRACE_FORMATS: dict[str, tuple[str, str]] = {
    "azure-csv": ("arrived_at, num_prefill_tokens, num_decode_tokens",
                  "Azure LLM inference 2023 as processed by microsoft/vidur"),
    "azure-llm-csv": (", ".join(AZURE_LLM_COLUMNS), "Azure LLM inference trace 2023 / 2024 as published"),
    "burstgpt-csv": (", ".join(BURSTGPT_COLUMNS), "BurstGPT as published"),
    "jsonl": ("timestamp (ms), input_length, output_length", "Mooncake JSONL"),
    "bench-jsonl": ("scheduled_at, prompt_tokens, output_tokens", "prefillq bench request records"),
}


def formats_help() -> str:
    """One line per format read: its name, what it is and the columns or keys it needs."""
    return "; ".join(f"{name} ({what}): {columns}" for name, (columns, what) in TRACE_FORMATS.items())


def csv_format(header: list[str]) -> str | None:
    """The published format whose columns ``header`` has (None: neither)."""
    if all(c in header for c in AZURE_LLM_COLUMNS):
        return "azure-llm-csv"
    if all(c in header for c in BURSTGPT_COLUMNS):
        return "burstgpt-csv"
    return None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Timestamps:
    """Azure ``TIMESTAMP`` text (date and time, up to 9 fraction digits, an optional UTC offset; read as
    UTC without one; or a plain number of seconds) to whole nanoseconds since 1970, so that differences
    are exact. Rows come in time order, many within one second: the last whole second is remembered."""

    def __init__(self) -> None:
        self._second = ""
        self._base = 0

    def __call__(self, text: str, path: Path, line: int) -> int:
        text = text.strip()
        if text[4:5] != "-":  # not a date: a number of seconds
            try:
                return round(float(text) * 1e9)
            except ValueError:
                raise WorkloadError(f"{path}:{line}: TIMESTAMP must be a date and time like 2023-11-16 18:15:46.680, "
                                    f"got {text!r}") from None
        head, dot, rest = text.partition(".")
        fraction, zone = rest, ""
        for sign in ("+", "-", "Z"):
            if sign in rest:
                cut = rest.index(sign)
                fraction, zone = rest[:cut], rest[cut:]
                break
        second = head + zone
        if second != self._second:
            try:
                moment = datetime.fromisoformat(head + zone.replace("Z", "+00:00"))
            except ValueError:
                raise WorkloadError(f"{path}:{line}: TIMESTAMP must be a date and time like 2023-11-16 18:15:46.680, "
                                    f"got {text!r}") from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            self._second, self._base = second, (moment - _EPOCH) // timedelta(seconds=1) * 1_000_000_000
        if not (dot and fraction):
            return self._base
        if not fraction.isdigit():
            raise WorkloadError(f"{path}:{line}: TIMESTAMP has a bad fraction of a second: {text!r}")
        return self._base + int(fraction[:9].ljust(9, "0"))


def _count(value: str, column: str, path: Path, line: int) -> int:
    try:
        number = int(value)  # int() and float() ignore surrounding blanks
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            raise WorkloadError(f"{path}:{line}: {column} must be a whole number of tokens, got {value!r}") from None
    if not number >= 0 or number != int(number):
        raise WorkloadError(f"{path}:{line}: {column} must be a whole number of tokens >= 0, got {value!r}")
    return int(number)


def read_published_csv(path: Path, trace_format: str, header: list[str], reader: Any,
                       skipped: list[int]) -> Iterator[tuple]:
    """The rows after ``header`` of a CSV in ``trace_format`` (``csv_format``'s answer) as the trace
    reader's row tuples, arrival in seconds since the first row. ``reader`` is the ``csv.reader``
    positioned after the header."""
    azure = trace_format == "azure-llm-csv"
    names = AZURE_LLM_COLUMNS if azure else BURSTGPT_COLUMNS
    time_col, prompt_col, output_col = (header.index(c) for c in names)
    session_col = header.index(BURSTGPT_SESSION) if BURSTGPT_SESSION in header else None
    origin: int | None = None
    timestamp = _Timestamps()
    width = len(header)
    for fields in reader:
        line = reader.line_num
        if len(fields) != width:
            if not fields or all(not f.strip() for f in fields):
                continue
            raise WorkloadError(f"{path}:{line}: expected {width} fields, got {len(fields)}")
        if azure:
            moment = timestamp(fields[time_col], path, line)
        else:
            try:
                moment = round(float(fields[time_col]) * 1e9)
            except (ValueError, OverflowError):
                raise WorkloadError(f"{path}:{line}: Timestamp must be a number of seconds, "
                                    f"got {fields[time_col]!r}") from None
        prompt = _count(fields[prompt_col], names[1], path, line)
        output = _count(fields[output_col], names[2], path, line)
        if prompt == 0 or output == 0:
            skipped[0] += 1
            continue
        if origin is None:
            origin = moment
        session = (fields[session_col].strip() or None) if session_col is not None else None
        yield ((moment - origin) / 1e9, prompt, output, None, None, 0, line, session, 0)


def unknown_csv(path: Path, line: int, header: list[str]) -> WorkloadError:
    """The error for a CSV header of no format read: the formats and the columns each needs."""
    shown = ",".join(header)[:120]
    near = ""
    for name in ("azure-csv", "azure-llm-csv", "burstgpt-csv"):  # the CSV format it comes closest to
        needed = TRACE_FORMATS[name][0].split(", ")
        missing = [c for c in needed if c not in header]
        if len(missing) < len(needed):
            near = f"CSV header lacks column(s) {', '.join(missing)} ({TRACE_FORMATS[name][1]}); "
            break
    return WorkloadError(f"{path}:{line}: {near}unknown trace format (CSV header {shown!r}). Formats read: "
                         f"{formats_help()}")

