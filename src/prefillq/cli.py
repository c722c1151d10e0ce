"""The ``prefillq`` command line. Each feature area registers its own commands.

Heavy imports (numpy, matplotlib, vllm) happen inside the commands, so ``prefillq --help`` is fast.
Bad input exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="prefillq",
    help="Prefill-queue scheduling for LLM serving engines: simulate, benchmark, tune and run policies.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that define ``register(app)``; each adds its own commands.
_COMMAND_MODULES = (
    "prefillq.sim.cli",
    "prefillq.bench.cli",
    "prefillq.tune_cli",
    "prefillq.integrations.vllm_cli",
    "prefillq.demo",
)


def fail(message: str, code: int = 2) -> None:
    """Print a clear error and exit (status 2 for bad input, as SPEC §4 asks)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # feature not written yet
                continue
            raise
        module.register(app)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """Without a command, run the main job: ``prefillq compare`` on its default scenario."""
    if ctx.invoked_subcommand is None:
        group = ctx.command
        name = "compare" if "compare" in group.list_commands(ctx) else "demo"
        ctx.invoke(group.get_command(ctx, name))


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":
    main()
