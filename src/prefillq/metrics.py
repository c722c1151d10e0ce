"""Per-request records and the one definition of every metric, for simulated and real runs alike.

Definitions (SPEC §6, matching ``vllm bench serve`` where they agree):

* TTFT: first output token received minus send time;
* E2E: last output token received minus send time;
* ITL: the gaps between consecutive output tokens;
* TPOT: ``(e2e - ttft) / (output_tokens - 1)`` (undefined for one-token outputs);
* output tokens/s: output tokens of completed requests divided by the run's duration (first send to
  last completion unless the caller gives a duration).

Percentiles use linear interpolation between order statistics (numpy's default ``linear`` method).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar, overload

SUMMARY_KEYS = (
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "long_ttft_p95_ms",
    "long_e2e_p95_ms",
    "short_tpot_p50_ms",
    "output_tokens_per_s",
    "completed",
    "failed",
)


@dataclass
class RequestRecord:
    """What happened to one request. Times in seconds; ``sent_at``/``scheduled_at`` from run start,
    ``ttft_s``/``e2e_s`` measured from ``sent_at``; ``itl_s`` holds the inter-token gaps."""

    request_id: str
    klass: str
    prompt_tokens: int
    output_tokens: int
    scheduled_at: float
    sent_at: float
    ttft_s: float | None
    e2e_s: float | None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Completed without error."""
        return self.error is None and self.ttft_s is not None and self.e2e_s is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one JSONL line)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        return cls(
            request_id=str(data["request_id"]),
            klass=str(data["klass"]),
            prompt_tokens=int(data["prompt_tokens"]),
            output_tokens=int(data["output_tokens"]),
            scheduled_at=float(data["scheduled_at"]),
            sent_at=float(data["sent_at"]),
            ttft_s=None if data.get("ttft_s") is None else float(data["ttft_s"]),
            e2e_s=None if data.get("e2e_s") is None else float(data["e2e_s"]),
            itl_s=[float(x) for x in data.get("itl_s") or []],
            error=data.get("error"),
        )


Row = TypeVar("Row")


class ColumnRows(Sequence[Row]):
    """A read-only sequence whose items are built from columns when read (a subclass gives ``__len__``
    and ``_row(index)`` for ``0 <= index < len``): millions of requests without an object each."""

    __slots__ = ()

    def _row(self, index: int) -> Row:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self)))]
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._row(index)

    def __iter__(self) -> Iterator[Row]:
        return map(self._row, range(len(self)))


def percentile(values: Sequence[float | None], q: float) -> float | None:
    """The q-th percentile (0..100) of the values that are not None, with linear interpolation
    (numpy's default method); None when there are none. The one percentile of the package.
    (A float numpy array is taken as it is: it holds no None.)"""
    import numpy as np

    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return float(np.percentile(values, q)) if values.size else None
    present = [v for v in values if v is not None]
    if not present:
        return None
    return float(np.percentile(np.asarray(present, dtype=float), q))


def weighted_percentile(values: Any, counts: Any, q: float) -> float | None:
    """:func:`percentile` of the multiset holding ``counts[i]`` copies of ``values[i]``, without building it.

    Bit for bit what ``np.percentile`` gives on the expanded array: the same virtual index
    ``(n - 1) * (q / 100)``, the same two neighbouring order statistics and numpy's own interpolation
    formula (``a + (b - a) * t``, or ``b - (b - a) * (1 - t)`` when ``t >= 0.5``).
    """
    import numpy as np

    values = np.asarray(values, dtype=float)
    counts = np.asarray(counts, dtype=np.int64)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    n = int(counts.sum())
    if n == 0:
        return None
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(counts[order])  # ends[i]: rank just past the copies of values[i]

    def order_statistic(rank: int) -> np.float64:  # 0-based
        return values[int(np.searchsorted(ends, rank, side="right"))]

    virtual = np.float64(n - 1) * np.true_divide(q, 100)
    if virtual >= n - 1:
        return float(order_statistic(n - 1))
    if virtual < 0:
        return float(order_statistic(0))
    below = np.floor(virtual)
    gamma = virtual - below
    a, b = order_statistic(int(below)), order_statistic(int(below) + 1)
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none): ``percentile(values, 50)``."""
    return percentile(values, 50)


def tpot_s(rec: RequestRecord) -> float | None:
    """Time per output token after the first: ``(e2e - ttft) / (output_tokens - 1)``."""
    if rec.ttft_s is None or rec.e2e_s is None or rec.output_tokens <= 1 or rec.error is not None:
        return None
    return (rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1)


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def run_duration_s(records: Iterable[RequestRecord]) -> float:
    """First send to last completion over completed requests (0 when none completed)."""
    done = [r for r in records if r.ok]
    if not done:
        return 0.0
    start = min(r.sent_at for r in done)
    end = max(r.sent_at + (r.e2e_s or 0.0) for r in done)
    return max(0.0, end - start)


@dataclass
class RecordColumns:
    """The per-request figures :func:`summarize` reads, as numpy arrays (one entry per request, in order).

    ``ok`` marks completed requests (the others' ``ttft_s``/``e2e_s``/``sent_at`` are not read); the
    inter-token gaps of the completed requests are the multiset holding ``itl_counts[i]`` copies of
    ``itl_values[i]`` (simulated runs share step end times, so their gaps repeat).
    """

    short: Any          # bool: klass == "short"
    long: Any           # bool: klass == "long"
    ok: Any             # bool: RequestRecord.ok
    sent_at: Any        # float
    ttft_s: Any         # float
    e2e_s: Any          # float
    output_tokens: Any  # int
    itl_values: Any     # float
    itl_counts: Any     # int


class ColumnarRecords(Protocol):
    """Records kept as columns (e.g. a simulated run's): a sequence of records that also gives its columns."""

    def __len__(self) -> int: ...

    def columns(self) -> RecordColumns: ...


def summarize(records: Sequence[RequestRecord] | ColumnarRecords, *,
              duration_s: float | None = None) -> dict[str, Any]:
    """Summary metrics of one run (times in ms; None where a class has no completed request).

    Records that give their columns (:class:`ColumnarRecords`) are summarized from those, with the same
    definitions and the same numbers, bit for bit, as from the records one by one.
    """
    columns = getattr(records, "columns", None)
    if callable(columns):
        return _summarize_columns(columns(), duration_s)
    done = [r for r in records if r.ok]
    short = [r for r in done if r.klass == "short"]
    long = [r for r in done if r.klass == "long"]

    def ttfts(group: list[RequestRecord]) -> list[float]:
        return [r.ttft_s for r in group if r.ttft_s is not None]

    def e2es(group: list[RequestRecord]) -> list[float]:
        return [r.e2e_s for r in group if r.e2e_s is not None]

    def tpots(group: list[RequestRecord]) -> list[float]:
        return [t for t in (tpot_s(r) for r in group) if t is not None]

    if duration_s is None:
        duration_s = run_duration_s(done)
    output_tokens = sum(r.output_tokens for r in done)
    itls = [gap for r in done for gap in r.itl_s]
    return {
        "short_ttft_p50_ms": _ms(percentile(ttfts(short), 50)),
        "short_ttft_p95_ms": _ms(percentile(ttfts(short), 95)),
        "long_ttft_p95_ms": _ms(percentile(ttfts(long), 95)),
        "long_e2e_p95_ms": _ms(percentile(e2es(long), 95)),
        "short_tpot_p50_ms": _ms(percentile(tpots(short), 50)),
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else None,
        "completed": len(done),
        "failed": len(records) - len(done),
        "short_ttft_mean_ms": _ms(sum(ttfts(short)) / len(short)) if short else None,
        "short_ttft_p99_ms": _ms(percentile(ttfts(short), 99)),
        "short_e2e_p50_ms": _ms(percentile(e2es(short), 50)),
        "short_e2e_p95_ms": _ms(percentile(e2es(short), 95)),
        "short_tpot_p95_ms": _ms(percentile(tpots(short), 95)),
        "long_ttft_p50_ms": _ms(percentile(ttfts(long), 50)),
        "long_ttft_max_ms": _ms(max(ttfts(long))) if long else None,
        "long_e2e_p50_ms": _ms(percentile(e2es(long), 50)),
        "long_tpot_p50_ms": _ms(percentile(tpots(long), 50)),
        "ttft_p50_ms": _ms(percentile(ttfts(done), 50)),
        "ttft_p95_ms": _ms(percentile(ttfts(done), 95)),
        "itl_p50_ms": _ms(percentile(itls, 50)),
        "itl_p95_ms": _ms(percentile(itls, 95)),
        "short_count": len(short),
        "long_count": len(long),
        "output_tokens": output_tokens,
        "duration_s": duration_s,
    }


def _summarize_columns(c: RecordColumns, duration_s: float | None) -> dict[str, Any]:
    """:func:`summarize` on columns: every figure computed as the record-by-record path computes it."""
    import numpy as np

    ok = np.asarray(c.ok, dtype=bool)
    short, long = ok & np.asarray(c.short, dtype=bool), ok & np.asarray(c.long, dtype=bool)
    ttft, e2e = np.asarray(c.ttft_s, dtype=float), np.asarray(c.e2e_s, dtype=float)
    out = np.asarray(c.output_tokens, dtype=np.int64)
    completed = int(ok.sum())
    if duration_s is None:
        duration_s = 0.0
        if completed:
            sent = np.asarray(c.sent_at, dtype=float)[ok]
            duration_s = max(0.0, float((sent + e2e[ok]).max()) - float(sent.min()))

    def tpots(group: Any) -> Any:
        chosen = group & (out > 1)
        return (e2e[chosen] - ttft[chosen]) / (out[chosen] - 1)

    short_ttft, long_ttft = ttft[short], ttft[long]
    output_tokens = int(out[ok].sum())
    n_short, n_long = int(short.sum()), int(long.sum())
    return {
        "short_ttft_p50_ms": _ms(percentile(short_ttft, 50)),
        "short_ttft_p95_ms": _ms(percentile(short_ttft, 95)),
        "long_ttft_p95_ms": _ms(percentile(long_ttft, 95)),
        "long_e2e_p95_ms": _ms(percentile(e2e[long], 95)),
        "short_tpot_p50_ms": _ms(percentile(tpots(short), 50)),
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else None,
        "completed": completed,
        "failed": len(ok) - completed,
        # sum() of the Python floats, in record order: the record-by-record path's rounding
        "short_ttft_mean_ms": _ms(sum(short_ttft.tolist()) / n_short) if n_short else None,
        "short_ttft_p99_ms": _ms(percentile(short_ttft, 99)),
        "short_e2e_p50_ms": _ms(percentile(e2e[short], 50)),
        "short_e2e_p95_ms": _ms(percentile(e2e[short], 95)),
        "short_tpot_p95_ms": _ms(percentile(tpots(short), 95)),
        "long_ttft_p50_ms": _ms(percentile(long_ttft, 50)),
        "long_ttft_max_ms": _ms(float(long_ttft.max())) if n_long else None,
        "long_e2e_p50_ms": _ms(percentile(e2e[long], 50)),
        "long_tpot_p50_ms": _ms(percentile(tpots(long), 50)),
        "ttft_p50_ms": _ms(percentile(ttft[ok], 50)),
        "ttft_p95_ms": _ms(percentile(ttft[ok], 95)),
        "itl_p50_ms": _ms(weighted_percentile(c.itl_values, c.itl_counts, 50)),
        "itl_p95_ms": _ms(weighted_percentile(c.itl_values, c.itl_counts, 95)),
        "short_count": n_short,
        "long_count": n_long,
        "output_tokens": output_tokens,
        "duration_s": duration_s,
    }


def median_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-key median over repetitions (the published protocol: median of per-run figures); a key that is
    missing or not a number in any repetition is None."""
    if len(summaries) == 1:
        return dict(summaries[0])
    merged: dict[str, Any] = {}
    for key in summaries[0]:
        values = [s.get(key) for s in summaries]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        merged[key] = median(numbers) if len(numbers) == len(values) and numbers else None
    return merged


def relative_change(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline - 1`` (e.g. -0.795 for a 79.5% cut); None when undefined."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline - 1.0


# --- TTFT-SLO goodput (SPEC §6) -------------------------------------------------------------------

def ttft_goodput(records: Iterable[RequestRecord], slo: Any) -> dict[str, float | None]:
    """The share of requests whose TTFT met the SLO (``prefillq.slo.TtftSlo``): all, short and long.

    A request meets it when it got a first token and ``ttft <= base + per_token x prompt_tokens``; a
    failed request (no first token) misses. Requests of a class the SLO does not cover are left out.
    Keys ``goodput``, ``short_goodput``, ``long_goodput`` (None where no request counts).
    """
    met = {"short": 0, "long": 0}
    total = {"short": 0, "long": 0}
    for record in records:
        term = slo.term(record.klass)
        if term is None or record.klass not in total:
            continue
        total[record.klass] += 1
        ttft_ms = None if record.error is not None or record.ttft_s is None else record.ttft_s * 1000.0
        met[record.klass] += ttft_ms is not None and ttft_ms <= term.limit_ms(record.prompt_tokens)

    def share(m: int, n: int) -> float | None:
        return m / n if n else None

    return {"goodput": share(sum(met.values()), sum(total.values())),
            "short_goodput": share(met["short"], total["short"]),
            "long_goodput": share(met["long"], total["long"])}


GOODPUT_KEYS = ("goodput", "short_goodput", "long_goodput")


def goodput_by_row(records: Mapping[str, Sequence[tuple[int, RequestRecord]]], slo: Any) -> dict[str, dict[str, Any]]:
    """:func:`ttft_goodput` per row label from ``(repeat, record)`` pairs: the median over repeats."""
    out: dict[str, dict[str, Any]] = {}
    for label, rows in records.items():
        by_repeat: dict[int, list[RequestRecord]] = {}
        for repeat, record in rows:
            by_repeat.setdefault(repeat, []).append(record)
        shares = [ttft_goodput(group, slo) for _, group in sorted(by_repeat.items())]
        out[label] = {key: median([s[key] for s in shares]) for key in GOODPUT_KEYS}
    return out
