"""A sweep's outputs: the rich table, the CSV (one row per cell) and one PNG plot per metric."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefillq.report.plots import pyplot, save_figure

TABLE_COLUMNS = (("short_ttft_p50_ms", "short TTFT p50 ms"), ("short_ttft_p95_ms", "short TTFT p95 ms"),
                 ("long_ttft_p95_ms", "long TTFT p95 ms"), ("output_tokens_per_s", "out tok/s"),
                 ("token_imbalance", "imbalance"), ("gateway_wait_p95_ms", "gateway wait p95 ms"),
                 ("short_goodput", "short goodput"), ("long_goodput", "long goodput"))
OPTIONAL_COLUMNS = ("gateway_wait_p95_ms", "short_goodput", "long_goodput")  # shown when a row has them
PLOT_METRICS = ("short_ttft_p50_ms", "short_ttft_p95_ms", "long_ttft_p95_ms", "output_tokens_per_s",
                "token_imbalance")
CELL_KEYS = ("policy", "budget", "replicas", "rate_scale")


def _text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def sweep_grid(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The rows as header + text cells: the cell's axes, the headline figures, then the cell's warnings."""
    columns = [(key, label) for key, label in TABLE_COLUMNS
               if key not in OPTIONAL_COLUMNS or any(row.get(key) is not None for row in rows)]
    warned = any(row.get("warnings") for row in rows)
    header = [key.replace("_", " ") for key in CELL_KEYS] + [label for _, label in columns]
    header += ["warnings"] if warned else []
    cells = []
    for row in rows:
        line = [_text(row.get(key)) for key in CELL_KEYS] + [_text(row.get(key)) for key, _ in columns]
        cells.append(line + (["; ".join(row.get("warnings") or []) or "-"] if warned else []))
    return header, cells


def sweep_table(rows: Sequence[Mapping[str, Any]], *, title: str = "", width: int | None = None
                ) -> tuple[Any, list[str]]:
    """The rows as a rich table that fits ``width`` (None: every column): the cell's axes always (a policy
    SPEC wraps at its commas), then as many headline figures as fit; and the labels left out."""
    from prefillq.report.tables import fit_columns, grid_table, wrap_label

    header, cells = sweep_grid(rows)
    cells = [[wrap_label(line[0], 24), *line[1:]] for line in cells]
    warned = header[-1] == "warnings"
    if warned:  # a warning is prose: it wraps in the table's last column, or goes below the table
        cells = [line[:-1] for line in cells]
        header = header[:-1]
    keep = list(range(len(CELL_KEYS)))
    asked = [i for i, label in enumerate(header) if label.endswith("goodput")]  # --ttft-slo asked for these first
    shown = fit_columns(header, cells, width=width, keep=keep,
                        priority=[*asked, *(i for i in range(len(header)) if i not in asked)])
    hidden = [header[i] for i in range(len(header)) if i not in shown]
    return grid_table(header, cells, title=title or None, columns=shown, left=len(CELL_KEYS), width=width), hidden


def write_sweep_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """One line per cell, one column per row key (the keys of the first row, in order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(rows[0]) if rows else []
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(keys)
        for row in rows:
            writer.writerow(["" if row.get(key) is None else (f"{row[key]:.6g}" if isinstance(row[key], float)
                                                               else row[key]) for key in keys])
    return path


METRIC_LABELS = {
    "short_ttft_p50_ms": "short requests: TTFT, median (ms)",
    "short_ttft_p95_ms": "short requests: TTFT, P95 (ms)",
    "long_ttft_p95_ms": "long requests: TTFT, P95 (ms)",
    "output_tokens_per_s": "output throughput (tokens/s)",
    "token_imbalance": "prompt tokens routed to the busiest replica\n÷ the mean replica (1 = even)",
}
AXIS_LABELS = {"rate_scale": "rate scale (× the trace's own arrival rate)", "replicas": "replicas",
               "budget": "token budget per step (tokens)"}


def _x_axis(rows: Sequence[Mapping[str, Any]]) -> str:
    """The axis to plot along: the first of rate scale, replicas, budget that takes several values."""
    for key in ("rate_scale", "replicas", "budget"):
        if len({row[key] for row in rows}) > 1:
            return key
    return "rate_scale"


def sweep_plots(folder: str | Path, rows: Sequence[Mapping[str, Any]], *, title: str = "") -> list[Path]:
    """One PNG per metric of :data:`PLOT_METRICS`: the metric along one axis, a line per other combination.
    Axes are labelled in words with units, go logarithmic where values span decades, and lines with
    identical values are drawn once, labelled ``a = b``."""
    from prefillq.report.plots import log_axis_if_wide, merge_identical, readable_log_ticks, series_style

    if not rows:
        return []
    plt = pyplot()
    x_key = _x_axis(rows)
    others = [key for key in CELL_KEYS if key != x_key and (key == "policy" or len({row[key] for row in rows}) > 1)]
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        label = ", ".join(f"{row[key]}" if key == "policy" else f"{key}={row[key]}" for key in others)
        lines.setdefault(label, []).append(row)
    styles = {label: series_style(i) for i, label in enumerate(lines)}
    markers = "osD^vP*X"
    written = []
    for metric in PLOT_METRICS:
        fig, ax = plt.subplots(figsize=(7.5, 4.4), constrained_layout=True)
        series = {label: tuple(sorted((float(row[x_key]), float(row[metric])) for row in members
                                      if row.get(metric) is not None))
                  for label, members in lines.items()}
        merged = merge_identical({label: points for label, points in series.items() if points})
        for label, points in merged.items():
            first = label.split(" = ")[0]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, linewidth=1.6,
                    marker=markers[list(lines).index(first) % len(markers)], markersize=5, **styles[first])
        xs = sorted({p[0] for points in merged.values() for p in points})
        log_axis_if_wide(ax, xs, "x", decades=0.8)
        if 0 < len(xs) <= 10:  # ticks at the grid's own values
            from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

            ax.xaxis.set_major_locator(FixedLocator(xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        wide = log_axis_if_wide(ax, [p[1] for points in merged.values() for p in points])
        if wide and ax.get_yscale() == "log":
            readable_log_ticks(ax, "y")
        elif not wide:
            from matplotlib.ticker import FuncFormatter

            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        ax.set_xlabel(AXIS_LABELS.get(x_key, x_key.replace("_", " ")))
        ax.set_ylabel(METRIC_LABELS.get(metric, metric) + (" — log scale" if wide else ""))
        ax.grid(True, which="major", alpha=0.3)
        if title:
            ax.set_title(title, fontsize=9)
        if merged:
            ax.legend(fontsize=7)
        written.append(save_figure(fig, Path(folder) / f"sweep-{metric}.png"))
    return written
