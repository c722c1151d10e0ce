"""The ``prefillq`` command line: the app, its error exit and ``--set`` parsing; one module per command.

This package is the only place that parses arguments, prints or exits; each command module parses,
calls library code that returns data, and renders it.

Heavy imports (numpy, matplotlib, vllm) happen inside the commands, so ``prefillq --help`` is fast.
Bad input exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import importlib
import json
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="prefillq",
    help="Prefill-queue scheduling for LLM serving engines: simulate, benchmark, tune and run policies.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

__all__ = ["FORMATS", "app", "check_format", "did_you_mean", "fail", "main", "parse_set", "progress_bar"]

FORMATS = ("table", "markdown", "csv", "json")

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
    "prefillq.cli.install",
)


def fail(message: str, code: int = 2) -> None:
    """Print a clear error and exit (status 2 for bad input, as SPEC §4 asks)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def progress_bar(unit: str, *, label: str = "[progress.description]{task.description}", console: Any = None,
                 get_time: Any = None) -> Any:
    """The progress bar of every long command, on stderr and gone when done: what it is doing, the bar,
    ``done/total unit`` (``unit="%"``: the share done), time so far and an estimate of the time left (from
    the work finished so far)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    count = "{task.percentage:>3.0f}%" if unit == "%" else "{task.completed:g}/{task.total:g} " + unit
    return Progress(TextColumn(label), BarColumn(), TextColumn(count),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                    console=console or Console(stderr=True), transient=True, get_time=get_time)


def check_format(fmt: str) -> str:
    """A valid ``--format`` value, or a clear exit 2 naming the choices."""
    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}; choose one of {', '.join(FORMATS)}")
    return fmt


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for a near-miss of one of ``choices``, else an empty string."""
    import difflib

    close = difflib.get_close_matches(str(word).lower(), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
    from prefillq.cli.compare_report import report_also_for_compare
    from prefillq.cli.examples import epilog

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    for info in app.registered_commands:
        if info.epilog is None:
            info.epilog = epilog(info.name or "")
        if info.name == "report" and info.callback is not None:  # bench's command, which also reads compare folders
            info.callback = report_also_for_compare(info.callback)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"prefillq {version('prefillq')}")
        except PackageNotFoundError:
            typer.echo("prefillq (not installed as a package)")
        raise typer.Exit()


@app.callback(invoke_without_command=True, epilog=(
    "Start with `prefillq compare` (the main job: the policies side by side on a simulated engine); "
    "`prefillq COMMAND --help` shows each command's options and examples."))
def _root(ctx: typer.Context, version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version, help="Print the version and exit.")] = False) -> None:
    """Prefill-queue scheduling for LLM serving engines: simulate, benchmark, tune and run policies."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()


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

