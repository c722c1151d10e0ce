"""The goodput table: per row, the share of requests that met a TTFT SLO (all, short, long)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefillq.metrics import GOODPUT_KEYS


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def goodput_rows(goodput: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per label: label, then all / short / long goodput as percentages."""
    return [[label, *(_share(values.get(key)) for key in GOODPUT_KEYS)] for label, values in goodput.items()]


def goodput_table(goodput: Mapping[str, Mapping[str, Any]], slo: Any) -> Any:
    """A rich Table (narrow: four columns) of :func:`goodput_rows` under the SLO's own wording."""
    from rich.table import Table

    table = Table(title=f"TTFT-SLO goodput ({slo}): share of requests that met it")
    for column in ("policy", "all", "short", "long"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in goodput_rows(goodput):
        table.add_row(*row)
    return table
