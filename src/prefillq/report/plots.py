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


def ttft_cdf_plot(path: str | Path, records: Mapping[str, Sequence[RequestRecord]], *,
                  bound_ttft_s: Sequence[float] | None = None, title: str = "") -> Path:
    """Empirical CDF of TTFT per row label (a policy or a configured SPEC), short and long requests side by
    side (log time axis)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for ax, klass in zip(axes, ("short", "long"), strict=True):
        drawn = False
        for policy, recs in records.items():
            values = sorted(r.ttft_s for r in recs if r.klass == klass and r.ttft_s is not None)
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step([v * 1000 for v in values], ys, where="post", label=policy)
            drawn = True
        if klass == "short" and bound_ttft_s:
            values = sorted(bound_ttft_s)
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step([v * 1000 for v in values], ys, where="post", label="lower bound", linestyle="--",
                    color="black")
        ax.set_title(f"{klass} requests")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.set_xscale("log")
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def queue_plot(path: str | Path, timelines: Mapping[str, Sequence[tuple[float, int, int, int, int]]],
               lanes: Mapping[str, Sequence[tuple[float, Mapping[str, int]]]] | None = None, *,
               title: str = "") -> Path:
    """Waiting-queue length and running requests over time per row label; lane sizes where a row has lanes."""
    plt = pyplot()
    with_lanes = {p: v for p, v in (lanes or {}).items()
                  if v and len({k for _, d in v for k in d}) > 1}
    rows = 2 + (1 if with_lanes else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.8 * rows), sharex=True, constrained_layout=True)
    for policy, points in timelines.items():
        if not points:
            continue
        times = [p[0] for p in points]
        axes[0].step(times, [p[1] for p in points], where="post", label=policy)
        axes[1].step(times, [p[2] for p in points], where="post", label=policy)
    axes[0].set_ylabel("awaiting prefill")
    axes[1].set_ylabel("running requests")
    for policy, samples in with_lanes.items():
        names = sorted({k for _, d in samples for k in d})
        times = [t for t, _ in samples]
        for name in names:
            axes[2].step(times, [d.get(name, 0) for _, d in samples], where="post", label=f"{policy}: {name}")
        axes[2].set_ylabel("lane size")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
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
