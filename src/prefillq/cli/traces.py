"""``prefillq traces``: the sample traces shipped in the package, and the trace formats read."""

from __future__ import annotations

import typer

from prefillq.workload.samples import CREDIT


def sample_rows() -> list[dict[str, object]]:
    """One row per shipped sample: name, requests, duration (s), mean rate, source, licence."""
    from prefillq.workload import load_trace
    from prefillq.workload.samples import LICENCE, SAMPLE_PREFIX, SAMPLES, SOURCE

    rows = []
    for sample in SAMPLES.values():
        workload = load_trace(SAMPLE_PREFIX + sample.name, long_threshold=0)
        arrivals = workload.requests.columns()[0]
        duration = arrivals[-1] if len(arrivals) else 0.0
        rows.append({"name": SAMPLE_PREFIX + sample.name, "what": sample.what, "requests": len(arrivals),
                     "duration_s": round(duration, 1),
                     "rate_per_s": round(len(arrivals) / duration, 2) if duration else None,
                     "source": SOURCE, "licence": LICENCE})
    return rows


def traces() -> None:
    """List the sample traces shipped with prefillq (use them as --trace sample:NAME) and the trace
    formats --trace reads.

    Sample traces: Microsoft Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset),
    CC-BY 4.0, processed by microsoft/vidur (MIT). Credit the source in anything you publish from them.
    """
    from rich.console import Console
    from rich.table import Table

    from prefillq.workload.published import TRACE_FORMATS

    console = Console()
    table = Table(title="Sample traces (--trace NAME)")
    for column in ("name", "requests", "duration", "what", "licence"):
        table.add_column(column, justify="right" if column in ("requests", "duration") else "left")
    for row in sample_rows():
        table.add_row(str(row["name"]), f"{row['requests']:,}", f"{row['duration_s']:,.0f} s", str(row["what"]),
                      "CC-BY 4.0")
    console.print(table)
    console.print(CREDIT, highlight=False)
    formats = Table(title="Trace formats read (detected from the header or keys)")
    formats.add_column("format")
    formats.add_column("needs")
    for _name, (columns, what) in TRACE_FORMATS.items():
        formats.add_row(what, columns)
    console.print(formats)


def register(app: typer.Typer) -> None:
    app.command("traces")(traces)
