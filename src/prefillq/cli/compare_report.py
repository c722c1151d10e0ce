"""``prefillq report DIR`` for a ``compare --out`` folder: the table and the recommendation again from its
summary.json, and its report.html rewritten. Bench folders go to bench's own report command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.cli import check_format, fail


def is_compare_folder(directory: Path) -> bool:
    """Whether ``directory`` holds what ``compare --out`` writes (and is not a bench results folder)."""
    import json

    if (directory / "bench.json").exists() or (directory / "runs.jsonl").exists():
        return False
    try:
        data = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("policies"), dict) and "bound" in data


def compare_report(directory: Path, fmt: str = "table", plots: bool = True) -> None:
    """Print a compare folder's table, footer and recommendation again from its summary.json and rewrite
    its report.html (the PNG plots are those compare drew; ``plots`` only keeps or leaves them out)."""
    import json
    from types import SimpleNamespace

    from rich.console import Console

    from prefillq.cli.compare import _print_formatted, print_table
    from prefillq.report.html import write_html_report

    data = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    summaries = {label: {k: v for k, v in entry.items() if k != "change_vs_default"}
                 for label, entry in data["policies"].items()}
    title = data.get("title") or (f"{data.get('scenario')} — profile {data.get('profile')}, mode "
                                  f"{data.get('mode')}, budget {data.get('budget')} tokens/step")
    comparison = SimpleNamespace(summaries=summaries, baseline=data.get("baseline"), bound=data.get("bound") or {},
                                 achievable=data.get("achievable"), records={})
    settings = SimpleNamespace(topology=data.get("topology", "mixed"))
    split = data.get("split") or {"threshold": None, "method": "scenario"}
    if fmt != "table":
        _print_formatted(fmt, comparison, data, title)
    else:
        print_table(Console(), comparison, settings, split, data, title)
    if not plots:
        for png in directory.glob("*.png"):
            png.unlink()
    report = write_html_report(directory, title, kind="compare")
    Console(stderr=fmt != "table").print(f"report: {report}", highlight=False)


BENCH_ONLY_REPORT_OPTIONS = {"pair": "--pair", "lateness_limit_ms": "--lateness-limit-ms",
                             "throughput_drop": "--throughput-drop", "allow_errors": "--allow-errors",
                             "exclude_round": "--exclude-round", "compare_sim": "--compare-sim",
                             "budget": "--budget", "ttft_slo": "--ttft-slo"}


def report_also_for_compare(bench_report: Any) -> Any:
    """``prefillq report``: bench folders as before, and compare --out folders (their table and
    recommendation again, report.html rewritten). Options that only mean something for a bench folder
    are refused for a compare folder."""
    import functools
    import inspect

    signature = inspect.signature(bench_report, eval_str=True)

    @functools.wraps(bench_report)
    def report_command(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        directory = Path(given["directory"])
        if not is_compare_folder(directory):
            return bench_report(*args, **kwargs)
        used = [flag for key, flag in BENCH_ONLY_REPORT_OPTIONS.items() if given.get(key) not in (None, [])]
        if given.get("baseline") not in (None, "default"):  # bench's default is None (stock when that row ran)
            used.append("--baseline")
        if used:
            fail(f"{', '.join(used)}: only for a bench results folder; {directory} was written by prefillq compare "
                 "(its report takes --format and --no-plots)")
        compare_report(directory, fmt=check_format(given.get("fmt", "table")), plots=given.get("plots", True))
        return None

    report_command.__doc__ = ("Re-render a results folder: a bench folder's tables, intervals and PNG plots "
                              "(rewrites summary.json), or a compare --out folder's table, recommendation and "
                              "report.html.")
    directory = Annotated[Path, typer.Argument(
        help="A results folder written by prefillq bench, or by prefillq compare --out.")]
    report_command.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
        param.replace(annotation=directory) if param.name == "directory" else param
        for param in signature.parameters.values()])
    return report_command
