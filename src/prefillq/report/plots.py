"""PNG plots (matplotlib, imported lazily with the Agg backend): TTFT CDFs and queue timelines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefillq.metrics import RequestRecord


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Policies (rows) get the first colours of matplotlib's tab10; lanes get colours none of those use, so a
# lane is never mistaken for a policy.
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#e377c2", "#7f7f7f", "#bcbd22")
LINESTYLES = ("-", "--", "-.", ":")
LANE_COLOURS = {"immediate": "#000000", "short": "#17becf", "long": "#8c564b"}


def series_style(index: int) -> dict[str, Any]:
    """Colour and line style of the ``index``-th series: distinct colours, and line styles that differ too,
    so that lines lying on top of each other still show."""
    return {"color": SERIES_COLOURS[index % len(SERIES_COLOURS)], "linestyle": LINESTYLES[index % len(LINESTYLES)]}


def merge_identical(series: Mapping[str, Any]) -> dict[str, Any]:
    """The series with identical data drawn once, labelled ``a = b`` (in their first one's place): a
    line exactly hidden under another would otherwise look missing."""
    merged: dict[str, Any] = {}
    labels: dict[str, list[str]] = {}
    for label, data in series.items():
        twin = next((first for first, kept in merged.items() if kept == data), None)
        if twin is None:
            merged[label] = data
            labels[label] = [label]
        else:
            labels[twin].append(label)
    return {" = ".join(labels[first]): data for first, data in merged.items()}


def log_axis_if_wide(ax: Any, values: Sequence[float], axis: str = "y", *, decades: float = 1.3) -> bool:
    """Use a log scale on ``axis`` where the positive ``values`` span more than ``decades`` powers of
    ten (a linear axis would flatten all but the largest); zeros then sit on a symmetric-log stretch."""
    import math

    positive = [v for v in values if v is not None and v > 0]
    if len(positive) < 2 or math.log10(max(positive) / min(positive)) <= decades:
        return False
    setter = ax.set_yscale if axis == "y" else ax.set_xscale
    if any(v is not None and v <= 0 for v in values):
        setter("symlog", linthresh=min(positive))
    else:
        setter("log")
    return True


def readable_log_ticks(ax: Any, axis: str = "x") -> None:
    """Ticks of a log axis at 1, 2, 5 times powers of ten, written as plain numbers (``200``, ``1,000``),
    with no labels on the minor ticks (they collide when the range is under a decade)."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    decades = math.log10(high / low) if low > 0 and high > low else 0.0
    target.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 2.2 else (1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    values = sorted(values)
    return [v * 1000 for v in values], [(i + 1) / len(values) for i in range(len(values))]


def ttft_cdf_plot(path: str | Path, records: Mapping[str, Sequence[RequestRecord]], *,
                  bound_ttft_s: Sequence[float] | None = None, title: str = "") -> Path:
    """Empirical CDF of TTFT per row label (a policy or a configured SPEC), short and long requests side by
    side (log time axis). Rows with identical TTFTs are one line labelled ``a = b``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    styles = {label: series_style(i) for i, label in enumerate(records)}
    for ax, klass in zip(axes, ("short", "long"), strict=True):
        series = {label: tuple(sorted(r.ttft_s for r in recs if r.klass == klass and r.ttft_s is not None))
                  for label, recs in records.items()}
        merged = merge_identical({label: values for label, values in series.items() if values})
        for label, values in merged.items():
            xs, ys = _cdf(values)
            ax.step(xs, ys, where="post", label=label, linewidth=1.6, **styles[label.split(" = ")[0]])
        if klass == "short" and bound_ttft_s:
            xs, ys = _cdf(bound_ttft_s)
            ax.step(xs, ys, where="post", label="lower bound (any schedule)", linestyle=(0, (1, 1)), color="black")
        count = max((len(v) for v in series.values()), default=0)
        ax.set_title(f"{klass} requests ({count:,} per row)")
        ax.set_xlabel("time to first token (ms, log scale)")
        ax.set_ylabel("fraction of requests with TTFT ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.25)
        if merged:
            ax.set_xscale("log")
            readable_log_ticks(ax)
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, f"no {klass} requests", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def queue_plot(path: str | Path, timelines: Mapping[str, Sequence[tuple[float, int, int, int, int]]],
               lanes: Mapping[str, Sequence[tuple[float, Mapping[str, int]]]] | None = None, *,
               title: str = "") -> Path:
    """Waiting-queue length and running requests over time per row label; lane sizes where a row has lanes
    (each lane its own colour, each row its own line style). Identical curves are one line ``a = b``."""
    plt = pyplot()
    with_lanes = {p: v for p, v in (lanes or {}).items()
                  if v and len({k for _, d in v for k in d}) > 1}
    rows = 2 + (1 if with_lanes else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.9 * rows), sharex=True, constrained_layout=True)
    styles = {label: series_style(i) for i, label in enumerate(timelines)}
    for panel, column in ((axes[0], 1), (axes[1], 2)):
        curves = merge_identical({label: (tuple(p[0] for p in points), tuple(p[column] for p in points))
                                  for label, points in timelines.items() if points})
        for label, (times, values) in curves.items():
            panel.step(times, values, where="post", label=label, linewidth=1.3, **styles[label.split(" = ")[0]])
    axes[0].set_ylabel("waiting for prefill\n(requests)")
    axes[1].set_ylabel("running\n(requests)")
    for index, (policy, samples) in enumerate(with_lanes.items()):
        names = sorted({k for _, d in samples for k in d}, key=lambda n: (n not in LANE_COLOURS, n))
        times = [t for t, _ in samples]
        for name in names:
            axes[2].step(times, [d.get(name, 0) for _, d in samples], where="post", linewidth=1.3,
                         color=LANE_COLOURS.get(name, "#999999"), linestyle=LINESTYLES[index % len(LINESTYLES)],
                         label=f"{name} lane" if len(with_lanes) == 1 else f"{policy}: {name} lane")
        axes[2].set_ylabel("lane size\n(requests)")
        if len(with_lanes) == 1:
            axes[2].set_title(f"{policy}: requests waiting in each lane", fontsize=9)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:  # beside the panel: the curves stay visible
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1].set_xlabel("simulated time (s)")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | Path, *, dpi: float | str = 110) -> Path:
    """Write a figure as PNG (creating the folder) and free it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
