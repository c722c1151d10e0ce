"""Small helpers shared by the command modules (kept apart from cli.py to avoid import cycles)."""

from __future__ import annotations

import json
from typing import Any

import typer


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
