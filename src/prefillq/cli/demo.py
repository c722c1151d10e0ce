"""``prefillq demo``: the dispatch order of every policy on one mixed queue, in a second."""

from __future__ import annotations

import typer

from prefillq.config import POLICIES


def demo() -> None:
    """Show how each policy orders the same mixed waiting queue (long prompts arrived first)."""
    from rich.console import Console
    from rich.table import Table

    from prefillq import QueuedRequest, make_queue

    arrivals = [("L1", 16384), ("L2", 16384), ("S1", 128), ("L3", 8192), ("S2", 128), ("S3", 200)]
    table = Table(title="Dispatch order after one 1024-token step (arrival order: L1 L2 S1 L3 S2 S3)")
    table.add_column("policy")
    table.add_column("order")
    for policy in POLICIES:
        queue = make_queue({"policy": policy, "stats_interval_s": 0})
        for request_id, tokens in arrivals:
            queue.add_request(QueuedRequest(request_id, tokens))
        queue.on_prefill_submitted(1024)
        table.add_row(policy, " ".join(r.request_id for r in queue))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
