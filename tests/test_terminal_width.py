"""Output that fits the terminal it is printed in (80 columns and up): no cut cell, no '…', no line over
the width; --help keeps every option name whole; --format gives every column as markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from prefillq.report.tables import COMPARE_COLUMNS, compare_table, fit_columns, wrap_label

PROFILE = ["--profile", "h100-qwen3.5-0.8b"]  # the figures below are this profile's
THREE_ROWS = ["--policies", "default", "--policy", "srf:threshold=1024",
              "--policy", "srf:threshold=4096,long_max_wait_ms=2000"]


def _run(args: list[str], columns: int) -> str:
    result = subprocess.run([sys.executable, "-m", "prefillq.cli", *args], capture_output=True, text=True,
                            env={"COLUMNS": str(columns), "PATH": "", "TERM": "dumb"}, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _assert_fits(text: str, width: int) -> None:
    """No cut cell and no line over the width, except the command to paste, which is never broken."""
    assert "…" not in text
    too_long = [line for line in text.splitlines() if len(line) > width and not line.startswith("vllm serve MODEL ")]
    assert not too_long, too_long


def _under_the_table(text: str) -> tuple[list[str], list[str]]:
    """The footer's lines and the recommendation's lines (the command last) of a compare table output."""
    lines = text.splitlines()
    below = lines[max(i for i, line in enumerate(lines) if line.startswith("└")) + 1:]
    start = next(i for i, line in enumerate(below) if line.startswith(("Run ", "Use ", "Keep ")))
    return below[:start], below[start:]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [[], THREE_ROWS], ids=["default", "three-rows"])
def test_compare_fits_the_terminal_with_every_number_whole(args, columns):
    out = _run(["compare", *PROFILE, *args], columns)
    _assert_fits(out, columns)
    assert "20,408" in out and "-98.1%" in out  # default's short TTFT p95 and srf's change, whole
    assert "short TPOT" in out and "+62.2%" in out  # what the faster TTFT costs is always shown
    footer, recommendation = _under_the_table(out)
    assert len(footer) <= 4 and len(recommendation) <= 4
    assert recommendation[-1].startswith("vllm serve MODEL --scheduler-cls prefillq.integrations.vllm.Scheduler ")
    if args:
        assert "srf:threshold=4096," in out and "long_max_wait_ms=2000" in out  # the label wraps at its comma


def test_compare_wide_shows_every_column_and_narrow_names_the_hidden_ones_never_short_tpot():
    narrow = _run(["compare"], 80)
    assert "--wide adds short TTFT mean, long E2E p95." in " ".join(narrow.split())
    header = narrow[:narrow.index("┡")]
    assert "TPOT" in header and "mean" not in header and "E2E" not in header
    wide = _run(["compare", "--wide"], 80)
    assert "--wide adds" not in wide
    assert "short TPOT p50 (ms)" in wide and "long E2E p95 (ms)" in wide  # every header on one line


@pytest.mark.parametrize("command", ["compare", "tune", "sweep", "bench", "report", "serve", "calibrate"])
def test_help_at_80_columns_keeps_every_option_name_whole(command):
    out = _run([command, "--help"], 80)
    _assert_fits(out, 80)
    from prefillq import cli

    if not cli.app.registered_commands:
        cli._register_all()
    import typer.main

    group = typer.main.get_group(cli.app)
    for param in group.commands[command].params:
        for name in param.opts:
            if name.startswith("--"):
                assert name in out, name
    assert "Examples:" in out


def test_compare_markdown_csv_and_json_carry_every_column():
    markdown = _run(["compare", *PROFILE, "--format", "markdown"], 80)
    header = next(line for line in markdown.splitlines() if line.startswith("| policy"))
    assert header.count("|") == len(COMPARE_COLUMNS) + 2
    assert "| hrrn | 362 (-98.2%)" in markdown
    assert "| auto:partial_prefills=ordered (recommended) |" in markdown
    assert "Proven lower bound (mean: max(isolated service time" in markdown  # the method, in full
    rows = list(csv.DictReader(io.StringIO(_run(["compare", *PROFILE, "--format", "csv"], 80))))
    assert [row["policy"] for row in rows] == ["default", "promote_shortest", "hrrn", "short_request_first",
                                               "auto:partial_prefills=ordered", "bound (lower)",
                                               "best reached by a clairvoyant schedule"]
    assert float(rows[2]["short_ttft_p95_ms"]) == pytest.approx(395, abs=1)
    data = json.loads(_run(["compare", "--format", "json"], 80))
    assert set(data["policies"]) == {"default", "promote_shortest", "hrrn", "short_request_first",
                                     "auto:partial_prefills=ordered"}
    assert data["recommendation"]["row"] == "auto:partial_prefills=ordered"


def test_an_unknown_format_is_refused_with_the_choices():
    result = subprocess.run([sys.executable, "-m", "prefillq.cli", "compare", "--format", "markdwn"],
                            capture_output=True, text=True, env={"PATH": ""})
    assert result.returncode == 2
    assert "did you mean 'markdown'" in result.stderr and "table, markdown, csv, json" in result.stderr


def test_fit_columns_keeps_the_label_and_the_most_wanted_columns_first():
    header = ["policy", "a", "b", "c"]
    rows = [["x" * 10, "1" * 6, "2" * 6, "3" * 6]]
    # 10+3 for the label, 1 for the border: each 6-wide column costs 9
    assert fit_columns(header, rows, width=14 + 9, priority=[0, 3, 1, 2]) == [0, 3]
    assert fit_columns(header, rows, width=14 + 18, priority=[0, 3, 1, 2]) == [0, 1, 3]
    assert fit_columns(header, rows, width=None) == [0, 1, 2, 3]


def test_a_long_label_wraps_at_commas_and_never_loses_a_character():
    label = "srf:threshold=4096,long_max_wait_ms=2000,partial_prefills=ordered"
    wrapped = wrap_label(label, 24)
    assert wrapped.replace("\n", "") == label
    assert all(len(line) <= 24 for line in wrapped.splitlines())
    assert wrap_label("hrrn", 24) == "hrrn"


def test_compare_table_never_cuts_a_cell_at_any_width():
    from rich.console import Console

    summaries = {"default": {key: 123456.7 for key, *_ in COMPARE_COLUMNS},
                 "srf:threshold=4096,long_max_wait_ms=2000": {key: 1.5 for key, *_ in COMPARE_COLUMNS}}
    for width in (60, 80, 100, 140, 200):
        console = Console(width=width, record=True, file=io.StringIO())
        table, hidden = compare_table(summaries, width=width)
        console.print(table)
        text = console.export_text()
        _assert_fits(text, width)
        assert "123,457" in text
        assert len(hidden) < len(COMPARE_COLUMNS)


def test_compare_help_groups_its_options_in_the_users_terms():
    out = _run(["compare", "--help"], 80)
    panels = [line.rstrip(":") for line in out.splitlines() if line in ("Workload:", "Engine:", "Policies:",
                                                                         "Output:", "Other:")]
    assert panels == ["Workload", "Engine", "Policies", "Output", "Other"]
    workload = out[out.index("Workload:"):out.index("Engine:")]
    assert "--trace" in workload and "--duration" in workload and "--budget" not in workload
    assert "on the trace's own clock" in " ".join(workload.split())
    assert "--policy SPEC" in out[out.index("Policies:"):out.index("Output:")]
