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


def wrap_label(label: str, width: int = 24) -> str:
    """A row label broken into lines of at most ``width`` at its commas and after its first colon (a policy
    SPEC stays readable and is never cut); a piece without either that is still longer stays whole on its
    own line."""
    if len(label) <= width:
        return label
    lines: list[str] = []
    for piece in label.replace(",", ",\n").replace(":", ":\n", 1).split("\n"):
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        else:
            lines.append(piece)
    return "\n".join(lines)


def plain(cell: str) -> str:
    """A cell's text without rich markup."""
    from rich.text import Text

    return Text.from_markup(cell).plain


def column_width(header: str, cells: Sequence[str]) -> int:
    """The narrowest a column can be without cutting a number or a word: its longest cell line (cells are
    never wrapped) or the longest word of its header (headers wrap at words)."""
    cell = max((len(line) for text in cells for line in plain(text).split("\n")), default=0)
    return max(cell, max((len(word) for word in header.split()), default=0))


def fit_columns(header: Sequence[str], rows: Sequence[Sequence[str]], *, width: int | None,
                keep: Sequence[int] = (0,), priority: Sequence[int] | None = None) -> list[int]:
    """Which columns fit a terminal ``width`` (None: all): the ``keep`` columns, then the others in
    ``priority`` order while the table (rich's heavy-head box: 3 characters a column, 1 more) still fits."""
    indices = list(range(len(header)))
    if width is None:
        return indices
    widths = [column_width(header[i], [row[i] for row in rows]) for i in indices]
    chosen = list(keep)
    used = sum(widths[i] + 3 for i in chosen) + 1
    for i in priority if priority is not None else indices:
        if i in chosen:
            continue
        if used + widths[i] + 3 <= width:
            chosen.append(i)
            used += widths[i] + 3
    return sorted(chosen)


def grid_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
               columns: Sequence[int] | None = None, left: int = 1, width: int | None = None) -> Any:
    """A rich Table of the given ``columns`` (default: all) whose cells are never cut or wrapped: the
    caller chose the columns with :func:`fit_columns`. Each column gets a fixed width: at least its
    narrowest (:func:`column_width`), plus what is left of ``width`` shared out so headers need fewer
    lines (None: every header on one line). The first ``left`` columns are left-aligned."""
    from rich.table import Table

    shown = list(range(len(header))) if columns is None else list(columns)
    widths = {i: column_width(header[i], [row[i] for row in rows]) for i in shown}
    natural = {i: max(widths[i], len(header[i])) for i in shown}
    if width is None:
        widths = natural
    else:
        spare = width - (sum(widths.values()) + 3 * len(shown) + 1)
        while spare > 0 and any(widths[i] < natural[i] for i in shown):
            for i in shown:
                if spare > 0 and widths[i] < natural[i]:
                    widths[i] += 1
                    spare -= 1
    table = Table(title=title, title_justify="left", header_style="bold")
    for position, i in enumerate(shown):
        table.add_column(header[i], justify="left" if position < left else "right",
                         style="bold" if position == 0 else None, width=widths[i])
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same cells as a GitHub-flavoured Markdown table (lines of a cell joined by a space)."""
    def cell(text: str) -> str:
        return plain(text).replace("\n", " ").replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def csv_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same cells as CSV text (lines of a cell joined by a space)."""
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([plain(h) for h in header])
    writer.writerows([[plain(c).replace("\n", " ") for c in row] for row in rows])
    return buffer.getvalue().rstrip("\n")


# Which compare columns stay when the terminal is narrow, most wanted first (indices into COMPARE_COLUMNS):
# short TTFT p95 (what the policies are for), then what it costs (long TTFT p95, short TPOT p50, output
# tok/s), then short TTFT p50; the mean and long E2E p95 go first.
COMPARE_PRIORITY = (2, 3, 5, 6, 1, 0, 4)
# The two rows that bracket the optimum short TTFT: no schedule beats the first; the second is reached.
BOUND_LABEL = "bound (lower)"
ACHIEVABLE_LABEL = "best reached by a clairvoyant schedule"
RECOMMENDED_MARK = "✓ recommended"


def compare_grid(summaries: Mapping[str, Mapping[str, Any]], *, baseline: str | None = "default",
                 bound: Mapping[str, Any] | None = None, label_width: int | None = 24,
                 markup: bool = True, achievable: Mapping[str, Any] | None = None,
                 recommended: str | None = None) -> tuple[list[str], list[list[str]]]:
    """The comparison as header + rows of text cells: each metric's value with its change vs the ``baseline``
    row on a second line (none when ``baseline`` is None or not a row), the ``recommended`` row marked
    under its label; then the bound row and the best figures reached by the clairvoyant schedules
    (sim/clairvoyant.py): the optimum lies between the two."""
    from rich.markup import escape

    header = ["policy"] + [f"{label}{' (' + unit + ')' if unit else ''}" for _, label, unit, _ in COMPARE_COLUMNS]
    base = None if baseline is None else summaries.get(baseline)
    rows: list[list[str]] = []
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
                    text += f"\n[{colour}]{change * 100:+.1f}%[/{colour}]" if markup else f" ({change * 100:+.1f}%)"
            cells.append(text)
        label = policy if label_width is None else wrap_label(policy, label_width)
        label = escape(label) if markup else label
        if policy == recommended:
            label += f"\n[bold green]{RECOMMENDED_MARK}[/bold green]" if markup else f" ({RECOMMENDED_MARK[2:]})"
        rows.append([label, *cells])
    if bound is not None:
        cells = [format_value(bound.get(key), unit) if key in bound else "" for key, _, unit, _ in COMPARE_COLUMNS]
        rows.append([f"[italic]{BOUND_LABEL}[/italic]" if markup else BOUND_LABEL, *cells])
    if achievable is not None:
        cells = [format_value(achievable.get(key), unit) if key in achievable else ""
                 for key, _, unit, _ in COMPARE_COLUMNS]
        label = ACHIEVABLE_LABEL if label_width is None else wrap_words(ACHIEVABLE_LABEL, label_width)
        rows.append([f"[italic]{label}[/italic]" if markup else label, *cells])
    return header, rows


def wrap_words(text: str, width: int) -> str:
    """``text`` broken at spaces into lines of at most ``width`` (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def compare_table(summaries: Mapping[str, Mapping[str, Any]], *, baseline: str | None = "default",
                  bound: Mapping[str, Any] | None = None, title: str | None = None,
                  width: int | None = None, achievable: Mapping[str, Any] | None = None,
                  recommended: str | None = None) -> tuple[Any, list[str]]:
    """A rich Table that fits ``width`` columns (None: every column), one row per label (a policy or a
    configured SPEC), each metric with its % change vs the ``baseline`` row under it, the ``recommended``
    row marked; and the labels of the columns left out to fit."""
    header, rows = compare_grid(summaries, baseline=baseline, bound=bound, achievable=achievable,
                                label_width=None if width is None else max(24, width // 3), recommended=recommended)
    shown = fit_columns(header, rows, width=width, priority=[0, *(i + 1 for i in COMPARE_PRIORITY)])
    hidden = [label for i, (_, label, _, _) in enumerate(COMPARE_COLUMNS) if i + 1 not in shown]
    return grid_table(header, rows, title=title, columns=shown, width=width), hidden


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


def priority_class_lines(by_row: Mapping[str, Mapping[str, Mapping[str, Any]]], width: int = 80) -> list[str]:
    """The per-class table of a comparison whose requests have priority classes, as plain text lines that fit
    ``width`` columns: one line per row and class (``by_row``: label -> class -> figure -> value, the
    ``priority_classes.by_row`` of compare's JSON)."""
    columns = (("short_ttft_p50_ms", "short p50"), ("short_ttft_p95_ms", "short p95"),
               ("long_ttft_p95_ms", "long p95"), ("ttft_p95_ms", "all p95"))
    numbers = 6 + 7 + 11 * len(columns)
    label_width = max(8, min(max((len(label) for label in by_row), default=8), width - numbers))
    head = f"{'row':<{label_width}} {'class':>5} {'done':>6}" + "".join(f" {name:>10}" for _, name in columns)
    lines = ["TTFT (ms) per priority class (the requests' priority; lower first when honoured)"[:width], head]
    for label, classes in by_row.items():
        shown = label if len(label) <= label_width else label[:label_width - 1] + "…"
        for klass, figures in classes.items():
            done = figures.get("completed")
            cells = "".join(f" {format_value(figures.get(key), 'ms'):>10}" for key, _ in columns)
            lines.append(f"{shown:<{label_width}} {klass:>5} {'-' if done is None else done:>6}{cells}")
            shown = ""
    return lines


_CLASS_FIGURE_NAMES = {"short_ttft_p95_ms": "short TTFT p95", "long_ttft_p95_ms": "long TTFT p95",
                       "ttft_p95_ms": "TTFT p95"}


def class_recommendation_lines(rec: Mapping[str, Any]) -> list[str]:
    """What compare's recommended row buys and costs each priority class (``recommendation.per_class`` of
    :func:`prefillq.sim.recommend_classes.recommend_by_class`), a heading and a line per class; [] without
    ``per_class``. The class served first: its short TTFT p95 before → after (and its TTFT p95 over all its
    requests when some are long); the class served last: its TTFT p95 (what the choice costs it), long and
    short TTFT p95; a class between: its TTFT p95."""
    per_class, chosen = rec.get("per_class"), rec.get("chosen_by")
    if not per_class or not chosen:
        return []
    lines = [f"Per class ({rec.get('baseline') or 'no default row'} → {rec['row']}; chosen on {chosen['high']} "
             f"with {chosen['low']} within the same limits):"]
    for klass, figures in per_class.items():
        if int(klass) == chosen["high_class"]:
            mixed = figures["long_ttft_p95_ms"]["after"] is not None
            role, keys = "served first", ("short_ttft_p95_ms", *(("ttft_p95_ms",) if mixed else ()))
        elif int(klass) == chosen["low_class"]:
            role, keys = "served last", ("ttft_p95_ms", "long_ttft_p95_ms", "short_ttft_p95_ms")
        else:
            role, keys = "between", ("ttft_p95_ms",)
        parts = []
        for key in keys:
            pair, change = figures[key], figures.get(key.removesuffix("_ms") + "_change")  # ttft_p95_change, ...
            if pair["after"] is not None:
                shift = "" if change is None else f" ({change:+.1%})"
                parts.append(f"{_CLASS_FIGURE_NAMES[key]} {format_value(pair['before'], 'ms')} → "
                             f"{format_value(pair['after'], 'ms')} ms{shift}")
        lines.append(f"  class {klass} ({role}): {'; '.join(parts)}.")
    return lines
