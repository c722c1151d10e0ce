"""``--ttft-slo`` for compare, bench, sweep and tune: read the option, add goodput, print its table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import typer

from prefillq.cli import fail

TTFT_SLO_HELP = ("Report TTFT-SLO goodput, the share of requests whose TTFT met an SLO stated as a base plus a "
                 "per-token allowance, e.g. 200ms+0.1ms/token, or per class: short=200ms+0.1ms/token,long=5s.")


def parse_slo(text: str | None) -> Any:
    """The SLO of ``--ttft-slo`` (None without it); a bad one exits 2 naming the problem."""
    if text is None:
        return None
    from prefillq.slo import SloError, parse_ttft_slo

    try:
        return parse_ttft_slo(text)
    except SloError as exc:
        fail(f"--ttft-slo: {exc}")


def add_goodput(summaries: Mapping[str, dict[str, Any]], records: Mapping[str, Sequence[tuple[int, Any]]],
                slo: Any) -> None:
    """Put each row's goodput (median over repeats) into its summary, so tables and JSON carry it."""
    if slo is None:
        return
    from prefillq.metrics import goodput_by_row

    for label, values in goodput_by_row(records, slo).items():
        if label in summaries:
            summaries[label].update(values, ttft_slo=str(slo))


def print_goodput(fmt: str, summaries: Mapping[str, Mapping[str, Any]], slo: Any, console: Any = None) -> None:
    """The goodput table after the main one: rich in a terminal, Markdown or CSV on stdout (JSON carries it)."""
    if slo is None or fmt == "json":
        return
    from prefillq.metrics import GOODPUT_KEYS
    from prefillq.report.goodput import goodput_rows, goodput_table
    from prefillq.report.tables import csv_text, markdown_table

    goodput = {label: {key: summary.get(key) for key in GOODPUT_KEYS} for label, summary in summaries.items()
               if any(summary.get(key) is not None for key in GOODPUT_KEYS)}  # runs without records have none
    if fmt == "table":
        console.print(goodput_table(goodput, slo))
    elif fmt == "markdown":
        typer.echo(f"\n**TTFT-SLO goodput ({slo})**\n")
        typer.echo(markdown_table(["policy", "all", "short", "long"], goodput_rows(goodput)))
    else:
        typer.echo(csv_text(["policy", *GOODPUT_KEYS],
                            [[label, *("" if v.get(k) is None else f"{v[k]:.6g}" for k in GOODPUT_KEYS)]
                             for label, v in goodput.items()]))
