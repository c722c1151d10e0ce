"""Tables and PNG plots of a ``prefillq bench`` results folder (from its summary and request files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (summary key, row title, lower is better)
TABLE_ROWS = (
    ("short_ttft_p50_ms", "short TTFT p50 (ms)", True),
    ("short_ttft_p95_ms", "short TTFT p95 (ms)", True),
    ("long_ttft_p50_ms", "long TTFT p50 (ms)", True),
    ("long_ttft_p95_ms", "long TTFT p95 (ms)", True),
    ("long_e2e_p95_ms", "long E2E p95 (ms)", True),
    ("short_tpot_p50_ms", "short TPOT p50 (ms)", True),
    ("output_tokens_per_s", "output tok/s", False),
)
# With --ttft-slo: the share of requests that met the SLO (higher is better), SPEC §6.
GOODPUT_ROWS = (
    ("goodput", "TTFT-SLO goodput (share)", False),
    ("short_goodput", "short goodput (share)", False),
    ("long_goodput", "long goodput (share)", False),
)


# Per priority class (a trace's ``priority`` field, a scenario's interactive_share): (figure, heading, lower is
# better); the summary keys are ``priority_<class>_<figure>`` (prefillq.bench.analysis.class_key).
CLASS_ROWS = (
    ("short_ttft_p50_ms", "short TTFT p50 (ms)", True),
    ("short_ttft_p95_ms", "short TTFT p95 (ms)", True),
    ("long_ttft_p50_ms", "long TTFT p50 (ms)", True),
    ("long_ttft_p95_ms", "long TTFT p95 (ms)", True),
    ("ttft_p95_ms", "TTFT p95, all (ms)", True),
    ("short_tpot_p50_ms", "short TPOT p50 (ms)", True),
)


def class_rows(summary: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(summary key, row title, lower is better) of each priority class's figures ([] without classes)."""
    from prefillq.bench.analysis import class_key

    classes = (summary.get("priority_classes") or {}).get("classes") or []
    return [(class_key(c, figure), f"class {c}: {heading}", lower)
            for c in classes for figure, heading, lower in CLASS_ROWS]


def class_counts(summary: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Per priority class: the row title and each policy's ``completed / failed`` (summed over kept rounds)."""
    from prefillq.bench.analysis import class_key

    policies = summary.get("policies", {})
    classes = (summary.get("priority_classes") or {}).get("classes") or []
    return [(f"class {c}: completed / failed",
             [f"{b.get(class_key(c, 'completed')) or 0} / {b.get(class_key(c, 'failed')) or 0}"
              for b in policies.values()]) for c in classes]


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _percent(value: float) -> str:
    return f"{100 * value:+.1f}%".replace("-", "−")


def _p_text(p_value: float) -> str:
    return "p<0.001" if p_value < 0.001 else f"p={p_value:.3f}" if p_value < 0.1 else f"p={p_value:.2f}"


def interval_text(comparison: dict[str, Any] | None, separator: str = " ") -> str:
    """``−79.5% [−82.0, −75.1] p=0.004`` (mean paired change, its 95% interval and, when the comparison
    has one, its p-value), the parts joined by ``separator``. One round has no interval: only the change
    and ``(1 round)``."""
    if comparison is None:
        return "n/a"
    if comparison["n"] < 2:
        return f"{_percent(comparison['change'])}{separator}(1 round)"
    low, high = 100 * comparison["ci_low"], 100 * comparison["ci_high"]
    text = f"{_percent(comparison['change'])}{separator}[{low:+.1f}, {high:+.1f}]".replace("-", "−")
    if comparison.get("p_value") is not None:
        text += f"{separator}{_p_text(comparison['p_value'])}"
    return text


def _round_name(row: dict[str, Any]) -> str:
    return f"round {row['round']}" + (f" on {row['machine']}" if row.get("machine") is not None else "")


def summary_grid(summary: dict[str, Any], separator: str = "\n") -> tuple[str, list[str], list[list[str]]] | None:
    """The protocol table as title, header and text cells (None without policies): a row per metric, a
    column per policy, each cell the median with its paired change, interval and p-value on further lines
    (joined by ``separator``)."""
    baseline = summary.get("baseline", "default")
    policies = summary.get("policies", {})
    if not policies:
        return None
    intervals = summary.get("intervals", {})
    kept = [row["round"] for row in summary.get("rounds", []) if row.get("used")]
    entries = [entry for item in intervals.values() for entry in item["metrics"].values() if entry is not None]
    methods = sorted({entry["method"] for entry in entries if entry.get("method")})
    tested = " p-value" if any(entry.get("p_value") is not None for entry in entries) else ""
    title = (f"{summary.get('scenario') or 'bench'}: median over {len(kept)} measured round(s); change vs "
             f"{baseline} = mean paired log-ratio [95% interval]{tested}"
             + (f" ({', '.join(methods)})" if methods else ""))
    header = ["metric", *policies]
    rows = []
    slo = any(block.get("goodput") is not None for block in policies.values())
    for key, heading, lower_is_better in [*TABLE_ROWS, *(GOODPUT_ROWS if slo else ()), *class_rows(summary)]:
        cells = []
        for policy, block in policies.items():
            text = _number(block.get(key))
            comparison = intervals.get(f"{policy}_vs_{baseline}", {}).get("metrics", {})
            if policy != baseline and comparison:
                entry = comparison.get(key)
                change = interval_text(entry, separator=separator)
                if separator == "\n" and entry is not None and entry.get("excludes_zero") and entry["n"] >= 2:
                    style = "green" if (entry["change"] < 0) == lower_is_better else "red"
                    change = f"[{style}]{change}[/{style}]"
                text += f"{separator}{change}"
            cells.append(text)
        rows.append([heading, *cells])
    rows.append(["completed / failed", *[f"{b.get('completed', 0)} / {b.get('failed', 0)}"
                                         for b in policies.values()]])
    rows += [[heading, *cells] for heading, cells in class_counts(summary)]
    rows.append(["send lateness p99 (ms)", *[_number(b.get("send_lateness_p99_ms")) for b in policies.values()]])
    return title, header, rows


def print_summary(summary: dict[str, Any], console: Any) -> None:
    """The protocol table: per-policy medians over kept rounds, each with its paired change vs the
    baseline, the 95% interval and the p-value (green/red when the interval excludes no change)."""

    for warning in summary.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")
    grid = summary_grid(summary)
    if grid is None:
        return
    title, header, rows = grid
    kept = [row["round"] for row in summary.get("rounds", []) if row.get("used")]
    intervals = summary.get("intervals", {})
    baseline = summary.get("baseline", "default")
    _print_fitted(console, header, rows, title)
    if len(kept) < 2:
        console.print("[dim]One measured round: no interval (a 95% interval needs at least 2 rounds; "
                      "3-10 are calibrated).[/dim]")

    extra = {name: item for name, item in intervals.items() if item.get("baseline") != baseline}
    if extra:
        pair_header = ["metric", *(f"{item['treatment']} vs {item['baseline']}" for item in extra.values())]
        pair_rows = [[heading, *[interval_text(item["metrics"].get(key), separator="\n") for item in extra.values()]]
                     for key, heading, _ in [*TABLE_ROWS, *class_rows(summary)]]
        _print_fitted(console, pair_header, pair_rows, "other pairs: mean paired change [95% interval]")

    for row in summary.get("rounds", []):
        if row.get("disturbed"):
            used = " (used anyway: no clean round)" if row.get("used") else ""
            console.print(f"{_round_name(row)} excluded for all policies{used}: {'; '.join(row['reasons'])}")


def _print_fitted(console: Any, header: list[str], rows: list[list[str]], title: str) -> None:
    """The table with as many policy columns as fit the console; the rest in further tables below it
    (a number is never cut)."""
    from prefillq.report.tables import fit_columns, grid_table

    left = list(range(1, len(header)))
    first = True
    while left:
        shown = fit_columns(header, rows, width=console.width, priority=left)
        shown = shown if len(shown) > 1 else [0, left[0]]
        console.print(grid_table(header, rows, title=title if first else None, columns=shown,
                                 width=console.width))
        left = [i for i in left if i not in shown]
        first = False


def print_sim_comparison(comparison: dict[str, Any], console: Any) -> None:
    """Predicted (simulator) vs measured per policy and metric, with the relative error."""
    from rich.table import Table

    table = Table(title=f"simulator ({comparison['profile']}) vs measured: predicted / measured (error)",
                  title_justify="left")
    table.add_column("metric", style="bold")
    policies = comparison.get("policies", {})
    for policy in policies:
        table.add_column(policy, justify="right")
    for key, heading, _ in TABLE_ROWS:
        cells = []
        for rows in policies.values():
            row = rows.get(key, {})
            error = row.get("error")
            cells.append(f"{_number(row.get('predicted'))} / {_number(row.get('measured'))} "
                         f"({'-' if error is None else _percent(error)})")
        table.add_row(heading, *cells)
    console.print(table)
    if comparison.get("skipped"):
        console.print(f"not simulated (not policy names): {', '.join(comparison['skipped'])}")


def _key(run: Any) -> tuple[Any, int]:
    return run.info.get("machine"), run.info["round"]


def write_plots(root: Path, runs: Sequence[Any], summary: dict[str, Any],
                classes: dict[str, int] | None = None) -> list[Path]:
    """TTFT CDFs (short, long), per-round values, the intervals and the send lateness, as PNGs in ``root``;
    with priority ``classes`` (request id -> class, :func:`prefillq.bench.analysis.request_classes`) also
    each class's TTFT CDFs (``ttft_cdf_priority_<class>.png``).

    ``runs`` are the folder's runs, each with ``info`` (its runs.jsonl line), ``records`` and
    ``metrics`` (as :func:`prefillq.bench.results.load_runs` gives them); only measured ones are drawn.
    """
    from prefillq.report.plots import pyplot, save_figure, ttft_cdf_plot

    plt = pyplot()

    runs = [run for run in runs if run.info["phase"] == "measured"]
    if not runs:
        return []
    used = {(row.get("machine"), row["round"]) for row in summary.get("rounds", []) if row.get("used")}
    policies = list(summary.get("policies", {})) or sorted({run.info["policy"] for run in runs})
    root = Path(root)
    written: list[Path] = []

    # 1. TTFT CDF per policy, short and long requests, pooled over the kept rounds (the compare plot).
    pooled = {policy: [r for run in runs if run.info["policy"] == policy and _key(run) in used
                       for r in run.records if r.ok] for policy in policies}
    written.append(ttft_cdf_plot(root / "ttft_cdf.png", pooled,
                                 title=f"{summary.get('scenario') or 'bench'}: measured TTFT, kept rounds pooled"))
    for klass in sorted(set((classes or {}).values())):  # 1b. the same per priority class
        members = {policy: [r for r in records if classes.get(r.request_id, 0) == klass]  # type: ignore[union-attr]
                   for policy, records in pooled.items()}
        written.append(ttft_cdf_plot(root / f"ttft_cdf_priority_{klass}.png", members,
                                     title=f"{summary.get('scenario') or 'bench'}: measured TTFT of priority class "
                                           f"{klass}, kept rounds pooled"))

    # 2. Each round's value per policy: the pairs the intervals are built from.
    keys = ("short_ttft_p50_ms", "long_ttft_p95_ms", "output_tokens_per_s")
    figure, axes = plt.subplots(1, len(keys), figsize=(13, 3.8))
    rounds = sorted({_key(run) for run in runs}, key=lambda k: (k[0] is not None, k[0] or "", k[1]))
    for axis, key in zip(axes, keys, strict=True):
        for machine, round_index in rounds:
            points = [(i, run.metrics.get(key)) for i, p in enumerate(policies) for run in runs
                      if run.info["policy"] == p and _key(run) == (machine, round_index)]
            points = [(x, y) for x, y in points if y is not None]
            if not points:
                continue
            kept = (machine, round_index) in used
            name = _round_name({"round": round_index, "machine": machine})
            axis.plot([x for x, _ in points], [y for _, y in points], "-o" if kept else ":x", alpha=0.8,
                      label=name + ("" if kept else " (excluded)"))
        axis.set_xticks(range(len(policies)), policies, rotation=20)
        axis.set_title({k: heading for k, heading, _ in TABLE_ROWS}.get(key, key))  # words and units
        axis.grid(alpha=0.3)
    if axes[0].has_data():
        axes[0].legend(fontsize="small")
    figure.tight_layout()
    written.append(save_figure(figure, root / "rounds.png"))

    # 3. Paired changes with their intervals.
    items = [(name, metric, entry) for name, item in summary.get("intervals", {}).items()
             for metric, entry in item["metrics"].items() if entry is not None]
    if items:
        figure, axis = plt.subplots(figsize=(8, 0.35 * len(items) + 1.2))
        for row, (_name, _metric, entry) in enumerate(items):
            axis.errorbar([100 * entry["change"]], [row],
                          xerr=[[100 * (entry["change"] - entry["ci_low"])],
                                [100 * (entry["ci_high"] - entry["change"])]],
                          fmt="o", capsize=3)
        axis.axvline(0, color="grey", lw=1)
        axis.set_yticks(range(len(items)), [f"{name}: {metric}" for name, metric, _ in items], fontsize="small")
        axis.invert_yaxis()
        axis.set_xlabel("change (%), mean paired log-ratio with its 95% interval")
        axis.grid(alpha=0.3, axis="x")
        figure.tight_layout()
        written.append(save_figure(figure, root / "intervals.png"))

    # 4. Send lateness of every measured run.
    figure, axis = plt.subplots(figsize=(7, 4))
    for run in runs:
        lateness = sorted(1000 * (r.sent_at - r.scheduled_at) for r in run.records)
        if lateness:
            axis.step(lateness, [(i + 1) / len(lateness) for i in range(len(lateness))], where="post",
                      alpha=0.7, label=run.info["run"])
    axis.set_xlabel("send lateness: actual minus scheduled send time (ms)")
    axis.set_ylabel("fraction of requests")
    axis.grid(alpha=0.3)
    if len(runs) <= 12 and axis.has_data():
        axis.legend(fontsize="x-small")
    figure.tight_layout()
    written.append(save_figure(figure, root / "send_lateness.png"))
    return written

