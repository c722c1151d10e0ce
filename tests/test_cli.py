"""The top-level command: every area's commands are registered and a bare `prefillq` runs the main job."""

from __future__ import annotations

import subprocess
import sys

from prefillq import cli


def _app():
    if not cli.app.registered_commands:
        cli._register_all()
    return cli.app


def test_every_command_is_registered():
    names = {command.name for command in _app().registered_commands}
    assert {"compare", "bench", "report", "tune", "serve", "make-tiny-model", "calibrate", "demo"} <= names


def test_bare_prefillq_runs_compare_on_the_default_scenario():
    result = subprocess.run([sys.executable, "-m", "prefillq.cli"], capture_output=True, text=True,
                            env={"COLUMNS": "160", "PATH": ""})
    assert result.returncode == 0, result.stderr
    assert "scenario long-first" in result.stdout
    assert "bound (lower)" in result.stdout
    assert "short_request_first" in result.stdout


def test_console_entry_point_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "prefillq.cli", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "160", "PATH": ""}, check=True).stdout
    for name in ("compare", "bench", "tune", "serve"):
        assert name in out
