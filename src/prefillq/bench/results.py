"""The results directory a benchmark leaves behind, read and written as it happens.

* ``bench.json``: workload (with its schedule), payload settings, servers, one entry per invocation;
* ``runs.jsonl``: one line per finished run (policy, phase, round, lateness, errors, metrics);
* ``requests/<run>.jsonl``: one line per request (``RequestRecord`` fields plus policy/phase/round),
  written and flushed as each request finishes;
* ``summary.json``: per-policy medians over kept rounds, paired intervals, rounds and exclusions.

Lines of ``runs.jsonl`` and request files cut short by a crash are skipped; a ``bench.json`` that is
not JSON is a :class:`BenchError` (nothing can pair up with runs whose schedule is unknown).
``prefillq report DIR`` rebuilds ``summary.json`` from the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefillq.bench.analysis import LoadedRun, ProtocolSettings, run_metrics, summarize_runs
from prefillq.metrics import RequestRecord
from prefillq.workload import Workload


class BenchError(RuntimeError):
    """A problem with the benchmark set-up or its files (reported as a clear error, exit status 2)."""


_FILE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+=-")


def file_label(label: str) -> str:
    """``label`` in a form safe in a file name: every character other than letters, digits and ``._+=-``
    becomes ``_`` (runs of them one ``_``), so ``hrrn:partial_prefills=ordered`` gives
    ``hrrn_partial_prefills=ordered``. The JSON keeps the label itself."""
    out: list[str] = []
    for char in label:
        if char in _FILE_SAFE:
            out.append(char)
        elif not out or out[-1] != "_":
            out.append("_")
    return "".join(out).strip("_") or "_"


class ResultsDir:
    """The on-disk layout described in the module docstring."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.header_path = self.root / "bench.json"
        self.runs_path = self.root / "runs.jsonl"
        self.requests_dir = self.root / "requests"
        self.summary_path = self.root / "summary.json"

    def requests_path(self, name: str) -> Path:
        return self.requests_dir / f"{name}.jsonl"

    def read_header(self) -> dict[str, Any] | None:
        """bench.json's content (None when there is none yet)."""
        if not self.header_path.exists():
            return None
        try:
            header = json.loads(self.header_path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BenchError(f"{self.header_path} is corrupt ({exc}); it cannot be extended or reported") from None
        if not isinstance(header, dict):
            raise BenchError(f"{self.header_path} is corrupt (not a JSON object)")
        return header

    def write_header(self, header: dict[str, Any]) -> None:
        with writing(self.header_path):
            self.root.mkdir(parents=True, exist_ok=True)
            temporary = self.header_path.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(header, indent=2) + "\n")
            temporary.replace(self.header_path)

    def read_runs(self) -> list[dict[str, Any]]:
        """The lines of runs.jsonl. A line cut short by a crash (valid JSON up to where it stops) is
        skipped; any other unreadable line, or one without the run's name, policy, phase and round,
        is a :class:`BenchError` (the folder is not what ``prefillq bench`` wrote)."""
        if not self.runs_path.exists():
            return []
        try:
            text = self.runs_path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BenchError(f"cannot read {self.runs_path} ({exc})") from None
        runs = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                info = json.loads(line)
            except json.JSONDecodeError as exc:
                if exc.pos >= len(line.rstrip()) or exc.msg.startswith("Unterminated string"):
                    continue  # cut short by a crash: the text is fine as far as it goes
                raise BenchError(f"{self.runs_path} line {number} is corrupt ({exc.msg} at column {exc.colno}); "
                                 "it cannot be reported") from None
            runs.append(_checked_run(info, f"{self.runs_path} line {number}"))
        return runs

    def append_run(self, info: dict[str, Any]) -> None:
        with writing(self.runs_path):
            self.root.mkdir(parents=True, exist_ok=True)
        line = json.dumps(info, separators=(",", ":")).encode() + b"\n"
        with writing(self.runs_path), self.runs_path.open("a+b") as handle:
            if handle.seek(0, 2) > 0:
                handle.seek(-1, 2)
                if handle.read(1) != b"\n":
                    line = b"\n" + line  # a crash cut the last line short: the new one starts on its own line
            handle.write(line)
            handle.flush()

    def read_records(self, name: str) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
        """The records of one run and their raw lines (lines cut short by a crash are skipped)."""
        path = self.requests_path(name)
        records: list[RequestRecord] = []
        raw: list[dict[str, Any]] = []
        if not path.exists():
            return records, raw
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
                records.append(RequestRecord.from_dict(data))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            raw.append(data)
        return records, raw

    def used_settings(self, header: dict[str, Any] | None) -> dict[str, Any]:
        """The protocol settings the last bench invocation recorded in ``header`` (bench.json's content; {}
        when none): what ``prefillq report`` keeps unless told otherwise."""
        invocations = (header or {}).get("invocations") or [{}]
        last = invocations[-1] if isinstance(invocations, list) else None
        used = last.get("settings", {}) if isinstance(last, dict) else None
        if not isinstance(used, dict):
            raise BenchError(f"{self.header_path} is corrupt (its invocations are not what prefillq bench writes)")
        return used

    def write_summary(self, summary: dict[str, Any]) -> None:
        with writing(self.summary_path):
            self.root.mkdir(parents=True, exist_ok=True)
            temporary = self.summary_path.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
            temporary.replace(self.summary_path)

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json's content (None when there is none)."""
        if not self.summary_path.exists():
            return None
        try:
            summary = json.loads(self.summary_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BenchError(f"{self.summary_path} is corrupt ({exc})") from None
        if not isinstance(summary, dict):
            raise BenchError(f"{self.summary_path} is corrupt (not a JSON object)")
        return summary


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError while writing ``path`` into a one-line BenchError."""
    try:
        yield
    except OSError as exc:
        raise BenchError(f"cannot write {path} ({exc.strerror or exc})") from None


RUN_KEYS = {"policy": str, "run": str, "phase": str, "round": int}


def _checked_run(info: Any, where: str) -> dict[str, Any]:
    """A runs.jsonl entry with the keys the analysis needs, or a BenchError naming what is wrong."""
    if not isinstance(info, dict):
        raise BenchError(f"{where} is not a JSON object; it cannot be reported")
    missing = [key for key in RUN_KEYS if key not in info]
    if missing:
        raise BenchError(f"{where} has no {', '.join(repr(key) for key in missing)}; it cannot be reported")
    bad = [key for key, kind in RUN_KEYS.items() if not isinstance(info[key], kind) or isinstance(info[key], bool)]
    if bad:
        raise BenchError(f"{where} has a bad {', '.join(repr(key) for key in bad)}; it cannot be reported")
    return info


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def load_runs(results: ResultsDir) -> list[LoadedRun]:
    """Every run in the directory, with metrics recomputed from its request file.

    A request file without a runs.jsonl line (the process was killed mid-run) is loaded as an
    interrupted run.
    """
    loaded: list[LoadedRun] = []
    seen: set[str] = set()
    for info in results.read_runs():
        if info["run"] in seen:
            continue
        seen.add(info["run"])
        records, _ = results.read_records(info["run"])
        loaded.append(LoadedRun(info=info, records=records, metrics=run_metrics(records)))
    if results.requests_dir.exists():
        for path in sorted(results.requests_dir.glob("*.jsonl")):
            name = path.stem
            if name in seen:
                continue
            records, raw = results.read_records(name)
            first = raw[0] if raw else {}
            info = {"run": name, "policy": first.get("policy", name.split("-", 1)[-1].split("@", 1)[0]),
                    "phase": first.get("phase", "measured"), "round": first.get("round", -1),
                    "interrupted": True, "server_failed": None, "requests": None, "recorded": len(records)}
            if first.get("machine") is not None or "@" in name:
                info["machine"] = first.get("machine", name.rsplit("@", 1)[-1])
            loaded.append(LoadedRun(info=info, records=records, metrics=run_metrics(records)))
    return loaded


def analyse(results: ResultsDir, settings: ProtocolSettings | None = None) -> dict[str, Any]:
    """The summary of everything in a results directory (what ``summary.json`` holds)."""
    return summarize_runs(load_runs(results), settings or ProtocolSettings(), results.read_header())


def workload_fingerprint(workload: Workload) -> str:
    """A hash of the schedule: runs from different invocations pair up only on identical schedules."""
    digest = hashlib.sha256()
    for spec in workload.requests:
        klass = f"{spec.klass},p{spec.priority}" if spec.priority else spec.klass  # a class makes another schedule
        digest.update(f"{spec.request_id},{spec.arrival_s!r},{spec.prompt_tokens},{spec.output_tokens},"
                      f"{klass};".encode())
    return digest.hexdigest()[:16]


def workload_from_header(header: dict[str, Any] | None) -> Workload | None:
    """The schedule a results folder was measured on (stored in bench.json)."""
    from prefillq.workload import RequestSpec

    if not header or not header.get("schedule"):
        return None
    requests = [RequestSpec(request_id=str(rid), arrival_s=float(at), prompt_tokens=int(prompt),
                            output_tokens=int(output), klass=str(klass), priority=int(rest[0]) if rest else 0)
                for rid, at, prompt, output, klass, *rest in header["schedule"]]
    return Workload(name=str(header.get("scenario") or "bench"), requests=requests,
                    params=dict(header.get("workload") or {}))
