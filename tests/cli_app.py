"""A typer app holding only the given commands (each module's ``register``), as the real CLI registers them."""

from __future__ import annotations

from collections.abc import Callable

import typer


def cli_app(*registers: Callable[[typer.Typer], None]) -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps the commands sub-commands, as in the real CLI
        pass

    for register in registers:
        register(app)
    return app
