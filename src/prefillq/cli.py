"""The ``prefillq`` command line. Each feature area registers its own commands.

Heavy imports (numpy, matplotlib, vllm) happen inside the commands, so ``prefillq --help`` is fast.
Bad input exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import importlib

import typer

from prefillq.cli_util import fail

app = typer.Typer(
    name="prefillq",
    help="Prefill-queue scheduling for LLM serving engines: simulate, benchmark, tune and run policies.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)

__all__ = ["app", "fail", "main"]

# Modules that define ``register(app)``; each adds its own commands.
_COMMAND_MODULES = (
    "prefillq.sim.cli",
    "prefillq.bench.cli",
    "prefillq.tune_cli",
    "prefillq.integrations.vllm_cli",
    "prefillq.demo",
)


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
    app()


if __name__ == "__main__":
    main()
