"""A simulated run's per-request results, kept as columns (a few dozen bytes per request).

:class:`SimRecords` is what ``SimResult.records`` holds: a read-only sequence of
:class:`~prefillq.metrics.RequestRecord` built on demand from flat arrays (arrival, first token,
finish, the step range of the request's output tokens) and the node's step end times. A request's
inter-token gaps are the gaps between the end times of the steps that produced its tokens, so they
are computed when asked for (``record.itl_s``) instead of stored, and
:func:`prefillq.metrics.summarize` reads the columns (:meth:`SimRecords.columns`) directly.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from prefillq.metrics import ColumnRows, RecordColumns, RequestRecord

_NAN = math.nan
_CLASS_CODES = {"short": 1, "long": 2}
_CLASS_NAMES = {1: "short", 2: "long"}


def _floats(count: int) -> array:
    return array("d", [_NAN]) * count


def _shared(column: Any, typecode: str) -> array:
    """``column`` itself where it is an array of ``typecode`` (read only here), else a copy as one."""
    return column if isinstance(column, array) and column.typecode == typecode else array(typecode, column)


class SimRecords(ColumnRows[RequestRecord]):
    """Per-request results of one simulated node run, in workload order.

    Filled by :meth:`finish` (the node's finish hook) as requests complete; ``step_end_s`` is the
    node's list of step end times, which the token step ranges index. The profile's time outside
    the steps, ``frontend_s + frontend_per_seq_s * n`` for a token produced in a step of ``n``
    sequences, is added to every first-token and finish time; the gaps between tokens do not change.
    """

    def __init__(self, requests: Sequence[Any], step_end_s: Sequence[float], frontend_s: float = 0.0,
                 frontend_per_seq_s: float = 0.0, *, lean: bool = False) -> None:
        count = len(requests)
        self.frontend_s = frontend_s
        self.frontend_per_seq_s = frontend_per_seq_s
        self._requests = requests
        self.step_end_s = step_end_s
        columns = getattr(requests, "columns", None)
        if callable(columns):  # a trace: its arrays (read only, shared: no copy), no RequestSpec built
            arrival, prompt, output, klass = columns()
            self.arrival_s = _shared(arrival, "d")
            self.prompt_tokens = _shared(prompt, "q")
            self.output_tokens = _shared(output, "q")
            self.klass_code = _shared(klass, "b")
        else:
            self.arrival_s = array("d", (r.arrival_s for r in requests))
            self.prompt_tokens = array("q", (r.prompt_tokens for r in requests))
            self.output_tokens = array("q", (r.output_tokens for r in requests))
            self.klass_code = array("b", (_CLASS_CODES.get(r.klass, 0) for r in requests))
        self._other_classes = {i: r.klass for i, r in enumerate(requests)
                               if self.klass_code[i] == 0} if 0 in self.klass_code else {}
        self.first_token_s = _floats(count)
        self.finish_s = _floats(count)
        self.multi_runs: dict[int, list[tuple[int, int]]] = {}  # the step ranges of interrupted outputs
        self.has_gaps = not lean  # False: no inter-token gaps (a lean run keeps no step end times)
        self.lean = lean
        if lean:  # read for first-token and finish times only: no scheduling times, no token steps
            self.finish = self._finish_lean  # type: ignore[method-assign]
            return
        self.first_scheduled_s = _floats(count)
        self.run_first = array("q", [-1]) * count  # the one step range of the output tokens ...
        self.run_last = array("q", [-1]) * count    # ... or, when interrupted, multi_runs has them all

    # --- filling -----------------------------------------------------------------------------------

    def finish(self, r: Any) -> None:
        """Record a finished :class:`~prefillq.sim.node.SimRequest` (its ``index`` in the workload)."""
        i = r.index
        self.first_token_s[i] = r.first_token_s + self.frontend_s + self.frontend_per_seq_s * r.first_batch
        self.finish_s[i] = r.finish_s + self.frontend_s + self.frontend_per_seq_s * r.finish_batch
        if r.first_scheduled_s is not None:
            self.first_scheduled_s[i] = r.first_scheduled_s
        runs = r.token_runs
        if len(runs) == 1:
            self.run_first[i], self.run_last[i] = runs[0]
        else:
            self.multi_runs[i] = list(runs)

    def _finish_lean(self, r: Any) -> None:
        """:meth:`finish` of a lean run: the first-token and finish times only."""
        i = r.index
        self.first_token_s[i] = r.first_token_s + self.frontend_s + self.frontend_per_seq_s * r.first_batch
        self.finish_s[i] = r.finish_s + self.frontend_s + self.frontend_per_seq_s * r.finish_batch

    # --- the sequence ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.arrival_s)

    def _row(self, index: int) -> RequestRecord:
        return SimRecord(self, index)

    # --- per request ------------------------------------------------------------------------------------

    def request_id(self, i: int) -> str:
        ids = getattr(self._requests, "request_id", None)
        return ids(i) if callable(ids) else self._requests[i].request_id

    def klass(self, i: int) -> str:
        code = self.klass_code[i]
        return _CLASS_NAMES[code] if code else self._other_classes[i]

    def done(self, i: int) -> bool:
        return not (math.isnan(self.finish_s[i]) or math.isnan(self.first_token_s[i]))

    def token_times(self, i: int) -> Sequence[float]:
        """The times of request ``i``'s output tokens (the ends of the steps that produced them)."""
        step_end_s = self.step_end_s
        runs = self.multi_runs.get(i)
        if runs is None:
            return step_end_s[self.run_first[i]:self.run_last[i] + 1]
        times: list[float] = []
        for start, stop in runs:
            times.extend(step_end_s[start:stop + 1])
        return times

    def itl_s(self, i: int) -> list[float]:
        if not self.done(i) or not self.has_gaps:
            return []
        return [later - earlier for earlier, later in itertools.pairwise(self.token_times(i))]

    # --- whole-run views ----------------------------------------------------------------------------------

    def waits_s(self, klass: str) -> list[float]:
        """Arrival to first scheduling of every ``klass`` request that was scheduled ([] in a lean run)."""
        import numpy as np

        if self.lean:
            return []
        code = _CLASS_CODES[klass]
        first = np.frombuffer(self.first_scheduled_s, dtype=float)
        chosen = (np.frombuffer(self.klass_code, dtype=np.int8) == code) & ~np.isnan(first)
        return (first[chosen] - np.frombuffer(self.arrival_s, dtype=float)[chosen]).tolist()

    def last_finish_s(self) -> float | None:
        finished = [t for t in self.finish_s if t == t]
        return max(finished) if finished else None

    def columns(self) -> RecordColumns:
        """What :func:`prefillq.metrics.summarize` reads, as arrays; the gaps as (value, count) pairs."""
        import numpy as np

        arrival = np.frombuffer(self.arrival_s, dtype=float)
        first = np.frombuffer(self.first_token_s, dtype=float)
        finish = np.frombuffer(self.finish_s, dtype=float)
        ok = ~(np.isnan(first) | np.isnan(finish))
        code = np.frombuffer(self.klass_code, dtype=np.int8)
        values, counts = self._gaps(ok)
        return RecordColumns(short=code == 1, long=code == 2, ok=ok, sent_at=arrival, ttft_s=first - arrival,
                             e2e_s=finish - arrival, output_tokens=np.frombuffer(self.output_tokens, dtype=np.int64),
                             itl_values=values, itl_counts=counts)

    def _gaps(self, ok: Any) -> tuple[Any, Any]:
        """Every completed request's inter-token gaps: step gaps weighted by how many single-range
        requests span them, plus the gaps of interrupted requests listed one by one."""
        import numpy as np

        if not self.has_gaps:
            return np.zeros(0, dtype=float), np.zeros(0, dtype=np.int64)
        ends = np.asarray(self.step_end_s, dtype=float)
        first = np.frombuffer(self.run_first, dtype=np.int64)
        last = np.frombuffer(self.run_last, dtype=np.int64)
        single = ok & (first >= 0)
        size = len(ends) + 1
        # a request whose tokens came in steps a..b has the gaps ends[s] - ends[s - 1] for s in a+1..b: the
        # weight of gap s is the running sum of starts minus ends up to s (one array, in place: millions of steps)
        spans = np.bincount(first[single] + 1, minlength=size)
        spans -= np.bincount(last[single] + 1, minlength=size)
        np.cumsum(spans, out=spans)
        extra = [gap for i in self.multi_runs if ok[i] for gap in self.itl_s(i)]
        steps = max(0, len(ends) - 1)
        counts = np.ones(steps + len(extra), dtype=np.int64)
        counts[:steps] = spans[1:len(ends)]
        del spans
        values = np.empty(steps + len(extra), dtype=float)
        np.subtract(ends[1:], ends[:-1], out=values[:steps])
        values[steps:] = extra
        # sorted by value, equal ones merged, the gaps of no request dropped: the percentiles of summarize() sort
        # them again, which costs a pass over sorted values instead of a sort of millions
        kept = counts > 0
        if not kept.all():
            values, counts = values[kept], counts[kept]
        del kept
        order = np.argsort(values)
        values = values[order]
        counts = counts[order]
        del order
        if len(values) > 1:  # equal gaps as one value with their counts added: the same multiset, fewer entries
            starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
            if len(starts) < len(values):
                counts = np.add.reduceat(counts, starts)
                values = values[starts]
        return values, counts


class SimRecord(RequestRecord):
    """One request of :class:`SimRecords`, read from its columns (a view: nothing is copied)."""

    __slots__ = ("_index", "_table")

    def __init__(self, table: SimRecords, index: int) -> None:  # the dataclass fields are read-only views here
        self._table = table
        self._index = index

    @property  # type: ignore[override]
    def request_id(self) -> str:
        return self._table.request_id(self._index)

    @property  # type: ignore[override]
    def klass(self) -> str:
        return self._table.klass(self._index)

    @property  # type: ignore[override]
    def prompt_tokens(self) -> int:
        return self._table.prompt_tokens[self._index]

    @property  # type: ignore[override]
    def output_tokens(self) -> int:
        return self._table.output_tokens[self._index]

    @property  # type: ignore[override]
    def scheduled_at(self) -> float:
        return self._table.arrival_s[self._index]

    @property  # type: ignore[override]
    def sent_at(self) -> float:
        return self._table.arrival_s[self._index]

    @property  # type: ignore[override]
    def ttft_s(self) -> float | None:
        t, i = self._table, self._index
        return t.first_token_s[i] - t.arrival_s[i] if t.done(i) else None

    @property  # type: ignore[override]
    def e2e_s(self) -> float | None:
        t, i = self._table, self._index
        return t.finish_s[i] - t.arrival_s[i] if t.done(i) else None

    @property  # type: ignore[override]
    def itl_s(self) -> list[float]:
        return self._table.itl_s(self._index)

    @property  # type: ignore[override]
    def error(self) -> str | None:
        return None if self._table.done(self._index) else "not finished"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestRecord):
            return self.to_dict() == other.to_dict()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class RepeatRecords(Sequence[tuple[int, RequestRecord]]):
    """A comparison row's ``(repeat, record)`` pairs over its repeats, read from each repeat's records when asked
    (a big trace's row builds no object per request unless someone reads them)."""

    def __init__(self) -> None:
        self._parts: list[tuple[int, Sequence[RequestRecord]]] = []

    def add(self, repeat: int, records: Sequence[RequestRecord]) -> None:
        self._parts.append((repeat, records))

    def __len__(self) -> int:
        return sum(len(records) for _, records in self._parts)

    def __iter__(self) -> Iterator[tuple[int, RequestRecord]]:
        for repeat, records in self._parts:
            for record in records:
                yield repeat, record

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if position >= 0:
            for repeat, records in self._parts:
                if position < len(records):
                    return repeat, records[position]
                position -= len(records)
        raise IndexError("record index out of range")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RepeatRecords({len(self)} records over {len(self._parts)} repeats)"


# --- priority classes (the client's vLLM request priority, RequestSpec.priority) ------------------------

CLASS_FIGURES = ("short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "ttft_p95_ms", "completed")


def priority_classes(workload: Any) -> list[int]:
    """The priority classes of a workload's requests; [] when every request is at 0 (no classes)."""
    classes = workload.params.get("priority_classes")
    if classes is None and not callable(getattr(workload.requests, "columns", None)):  # traces set the key
        classes = sorted({r.priority for r in workload.requests})
    return list(classes) if classes and any(classes) else []


def class_key(priority: int, figure: str) -> str:
    """A per-class figure's key in a run summary, e.g. ``priority_0_short_ttft_p95_ms``."""
    return f"priority_{priority}_{figure}"


def class_figures(records: Sequence[RequestRecord], workload: Any) -> dict[str, Any]:
    """Short/long TTFT figures of each priority class (records in workload order); {} without classes."""
    from prefillq.metrics import summarize

    classes = priority_classes(workload)
    if not classes:
        return {}
    members: dict[int, list[RequestRecord]] = {c: [] for c in classes}
    for spec, record in zip(workload.requests, records, strict=True):
        members[spec.priority].append(record)
    figures: dict[str, Any] = {}
    for priority, group in members.items():
        summary = summarize(group)
        figures.update({class_key(priority, name): summary.get(name) for name in CLASS_FIGURES})
    return figures
