"""The ``prefillq`` command line: the app, its error exit and ``--set`` parsing; one module per command.

This package is the only place that parses arguments, prints or exits; each command module parses,
calls library code that returns data, and renders it.

Heavy imports (numpy, matplotlib, vllm) happen inside the commands, so ``prefillq --help`` is fast.
Bad input exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import typer

app = typer.Typer(
    name="prefillq",
    help="Prefill-queue scheduling for LLM serving engines: simulate, benchmark, tune and run policies.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)

__all__ = ["app", "fail", "main", "parse_set"]

# Modules that define ``register(app)``; each adds its own commands.
_COMMAND_MODULES = (
    "prefillq.cli.compare",
    "prefillq.cli.bench",
    "prefillq.cli.tune",
    "prefillq.cli.serve",
    "prefillq.cli.calibrate",
    "prefillq.cli.demo",
    "prefillq.cli.sweep",
    "prefillq.cli.traces",
)


def fail(message: str, code: int = 2) -> None:
    """Print a clear error and exit (status 2 for bad input, as SPEC §4 asks)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as a dict; values are JSON when they parse, else strings."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            fail(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[key.strip().replace("-", "_")] = value
    return overrides


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """Without a command, run the main job: ``prefillq compare`` on its default scenario."""
    if ctx.invoked_subcommand is None:
        group = ctx.command
        ctx.invoke(group.get_command(ctx, "compare"))


def main() -> None:
    _register_all()
    try:
        app()
    except OSError as exc:
        # The last line of defence for "every bad input is one line, exit 2": a path the user named
        # that cannot be read or written (commands catch the ones they expect themselves).
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        typer.secho(f"error: {where}{exc.strerror or exc}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from None

