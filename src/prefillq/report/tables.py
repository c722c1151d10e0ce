"""Comparison tables (rich) and CSV/JSON writers shared by ``compare`` and ``bench``."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefillq.metrics import RequestRecord, relative_change

# (summary key, column label, unit, which direction is better)
COMPARE_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("short_ttft_mean_ms", "short TTFT mean", "ms", "lower"),
    ("short_ttft_p50_ms", "short TTFT p50", "ms", "lower"),
    ("short_ttft_p95_ms", "short TTFT p95", "ms", "lower"),
    ("long_ttft_p95_ms", "long TTFT p95", "ms", "lower"),
    ("long_e2e_p95_ms", "long E2E p95", "ms", "lower"),
    ("short_tpot_p50_ms", "short TPOT p50", "ms", "lower"),
    ("output_tokens_per_s", "output tok/s", "", "higher"),
)
JSON_KEYS = (
    "short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "long_e2e_p95_ms",
    "short_tpot_p50_ms", "output_tokens_per_s", "completed",
)


def format_value(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "ms":
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
    return f"{value:,.1f}"


def format_change(value: float | None, baseline: float | None) -> str:
    change = relative_change(value, baseline)
    return "" if change is None else f"{change * 100:+.1f}%"


def compare_table(summaries: Mapping[str, Mapping[str, Any]], *, baseline: str | None = "default",
                  bound: Mapping[str, Any] | None = None, title: str | None = None,
                  achievable: Mapping[str, Any] | None = None) -> Any:
    """A rich Table: one row per label (a policy or a configured SPEC), each metric with its % change vs
    the ``baseline`` row (none when ``baseline`` is None or not a row)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("policy", style="bold", no_wrap=True)
    for _, label, unit, _ in COMPARE_COLUMNS:
        table.add_column(f"{label}{' (' + unit + ')' if unit else ''}", justify="right")
    base = None if baseline is None else summaries.get(baseline)
    for policy, summary in summaries.items():
        cells = []
        for key, _, unit, better in COMPARE_COLUMNS:
            value = summary.get(key)
            text = format_value(value, unit)
            if base is not None and policy != baseline:
                change = relative_change(value, base.get(key))
                if change is not None:
                    good = change < 0 if better == "lower" else change > 0
                    colour = "green" if good and abs(change) >= 0.005 else ("red" if abs(change) >= 0.005 else "dim")
                    text += f" [{colour}]{change * 100:+.1f}%[/{colour}]"
            cells.append(text)
        table.add_row(escape(policy), *cells)
    if bound is not None:
        cells = [format_value(bound.get(key), unit) if key in bound else "" for key, _, unit, _ in COMPARE_COLUMNS]
        table.add_row("[italic]bound (lower)[/italic]", *cells)
    if achievable is not None:  # the clairvoyant reference (sim/clairvoyant.py): the optimum is at most this
        cells = [format_value(achievable.get(key), unit) if key in achievable else ""
                 for key, _, unit, _ in COMPARE_COLUMNS]
        table.add_row("[italic]achievable (upper)[/italic]", *cells)
    return table


def compare_json(*, scenario: str, profile: str, summaries: Mapping[str, Mapping[str, Any]],
                 bound: Mapping[str, Any] | None, extra: Mapping[str, Any] | None = None,
                 baseline: str | None = "default") -> dict[str, Any]:
    """The machine-readable comparison, ``policies`` keyed by row label (keys in docs/compare.md);
    ``change_vs_default`` is relative to the ``baseline`` row and left out without one."""
    policies: dict[str, Any] = {}
    base = None if baseline is None else summaries.get(baseline)
    for policy, summary in summaries.items():
        entry = {key: summary.get(key) for key in JSON_KEYS}
        entry.update({k: v for k, v in summary.items() if k not in entry})
        if base is not None:
            entry["change_vs_default"] = {key: relative_change(summary.get(key), base.get(key))
                                          for key, *_ in COMPARE_COLUMNS}
        policies[policy] = entry
    result: dict[str, Any] = {"scenario": scenario, "profile": profile, "policies": policies,
                              "bound": None if bound is None else {k: v for k, v in bound.items()
                                                                    if not isinstance(v, list)}}
    if extra:
        result.update(extra)
    return result


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def write_records_csv(path: str | Path, records: Mapping[str, Sequence[tuple[int, RequestRecord]]]) -> Path:
    """Per-request records: one row per (row label, repeat, request); the ``policy`` column holds the label."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "repeat", "request_id", "klass", "prompt_tokens", "output_tokens",
                         "scheduled_at_s", "sent_at_s", "ttft_s", "e2e_s", "tpot_s", "itl_max_s", "error"])
        for policy, rows in records.items():
            for repeat, rec in rows:
                tpot = None
                if rec.ttft_s is not None and rec.e2e_s is not None and rec.output_tokens > 1:
                    tpot = (rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1)
                writer.writerow([policy, repeat, rec.request_id, rec.klass, rec.prompt_tokens, rec.output_tokens,
                                 f"{rec.scheduled_at:.6f}", f"{rec.sent_at:.6f}", _num(rec.ttft_s), _num(rec.e2e_s),
                                 _num(tpot), _num(max(rec.itl_s) if rec.itl_s else None), rec.error or ""])
    return path


def write_summary_csv(path: str | Path, summaries: Mapping[str, Mapping[str, Any]]) -> Path:
    """One row per row label (column ``policy``), one column per summary key."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for summary in summaries.values():
        keys.extend(k for k in summary if k not in keys and not isinstance(summary[k], dict | list))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", *keys])
        for policy, summary in summaries.items():
            writer.writerow([policy, *(_num(summary.get(k)) for k in keys)])
    return path


def _num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
