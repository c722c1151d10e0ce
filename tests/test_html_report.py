"""The HTML report of compare / sweep / bench folders: one file, plots embedded, opened in a real headless
Chromium (Debian's ``chromium``; ``make test`` installs it): the page renders (screenshot not blank) and
every image decodes (naturalWidth > 0)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.cli.bench import register as register_bench
from prefillq.cli.compare import register as register_compare
from prefillq.cli.sweep import register as register_sweep
from prefillq.report.html import html_table, write_html_report
from tests.cli_app import cli_app
from tests.test_bench_cli import SMALL

# Appended to a copy of the report: after load, records each image's state where --dump-dom shows it.
_PROBE = """<script>window.addEventListener("load", function () {
  var out = document.createElement("pre"); out.id = "img-check";
  out.textContent = Array.from(document.images).map(function (i) {
    return (i.complete ? "ok" : "pending") + ":" + i.naturalWidth + "x" + i.naturalHeight; }).join(" ");
  document.body.appendChild(out); });</script>"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is needed for this test: apt-get install -y chromium (make test installs it)")
    return found


def _browser(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-dev-shm-usage", "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=180)


def _check_in_browser(report: Path, expected_images: int) -> None:
    page = report.read_text(encoding="utf-8")
    assert "<img" in page and not re.search(r'src="(?!data:image/png;base64,)', page), "every image is inline"
    probe = report.with_name("probe.html")
    probe.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = _browser("--dump-dom", probe.as_uri()).stdout
    found = re.search(r'<pre id="img-check">([^<]*)</pre>', dom)
    assert found, "the page did not load in chromium"
    states = found.group(1).split()
    assert len(states) == expected_images
    assert all(re.fullmatch(r"ok:[1-9]\d*x[1-9]\d*", state) for state in states), states

    shot = report.with_name("screenshot.png")
    _browser("--window-size=1280,1600", f"--screenshot={shot}", report.as_uri())
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    grey = pixels.mean(axis=2)
    assert grey.std() > 0.05, "blank screenshot"
    assert (grey < 0.9).mean() > 0.02, "almost nothing drawn"


def _app() -> typer.Typer:
    return cli_app(register_compare, register_sweep, register_bench)


def test_compare_sweep_and_bench_reports_open_in_chromium_with_every_image(tmp_path):
    runner = CliRunner()
    compare = tmp_path / "compare"
    result = runner.invoke(_app(), ["compare", "--scenario", "long-first", "--out", str(compare)])
    assert result.exit_code == 0, result.output
    _check_in_browser(compare / "report.html", expected_images=2)

    sweep = tmp_path / "sweep"
    result = runner.invoke(_app(), ["sweep", "--scenario", "long-first", "--policy", "default,hrrn",
                                    "--budget", "512,1024", "--out", str(sweep)])
    assert result.exit_code == 0, result.output
    _check_in_browser(sweep / "report.html", expected_images=len(list(sweep.glob("sweep-*.png"))))

    bench = tmp_path / "bench"
    with MockServer(MockBehaviour(token_interval_s=0.001)) as server:
        result = runner.invoke(_app(), ["bench", "--url", server.url, *SMALL, "--reps", "2", "--warmup", "0",
                                        "--out", str(bench)])
    assert result.exit_code == 0, result.output
    _check_in_browser(bench / "report.html", expected_images=len(list(bench.glob("*.png"))))


def test_report_tables_name_their_units_leave_out_empty_columns_and_credit_samples(tmp_path):
    table = html_table([{"policy": "default", "short_ttft_p50_ms": "1234.5", "gateway_wait_p95_ms": ""}],
                       [("policy", "policy"), ("short_ttft_p50_ms", "short TTFT P50 (ms)"),
                        ("gateway_wait_p95_ms", "gateway wait P95 (ms)")])
    assert "short TTFT P50 (ms)" in table and "1,234" in table and "gateway" not in table
    (tmp_path / "sweep.json").write_text('{"grid": {"trace": "sample:azure-code"}, "rows": []}')
    assert "CC-BY 4.0" in write_html_report(tmp_path, "t", kind="sweep").read_text()
    (tmp_path / "sweep.json").write_text('{"grid": {"trace": "mine.csv"}, "rows": []}')
    assert "CC-BY 4.0" not in write_html_report(tmp_path, "t", kind="sweep").read_text()
    with pytest.raises(ValueError, match="compare, sweep, bench"):
        write_html_report(tmp_path, "t", kind="tune")


def test_the_compare_report_carries_the_recommendation_the_bracket_and_the_cost(tmp_path):
    import json

    out = tmp_path / "compare"
    result = CliRunner().invoke(_app(), ["compare", "--scenario", "long-first", "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text(encoding="utf-8")
    rec = json.loads((out / "summary.json").read_text())["recommendation"]
    assert "<h2>What to run</h2>" in page and f"<b>{rec['row']}</b>" in page
    assert "--scheduler-cls prefillq.integrations.vllm.Scheduler --additional-config" in page
    assert "short time per output token P50 (ms)</td>" in page and "+143.2%" in page  # the cost, before/after
    assert '<tr class="recommended"><td>auto:partial_prefills=ordered</td>' in page
    assert "proven lower bound (no schedule beats it)" in page and "best reached by a clairvoyant schedule" in page
    assert "fluid SRPT" in page  # the bound's method, in full, on the page


def test_prefillq_report_reads_a_compare_folder_and_refuses_bench_only_options(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "compare"
    result = CliRunner().invoke(_app(), ["compare", "--scenario", "long-first", "--mode", "lightllm", "--out",
                                         str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    (out / "report.html").unlink()

    def report(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "prefillq.cli", "report", str(out), *args], capture_output=True,
                              text=True, env={"COLUMNS": "80", "PATH": ""}, timeout=120)

    done = report()
    assert done.returncode == 0, done.stderr
    assert "✓ recommended" in done.stdout and "Use --prefill_queue_strategy hrrn" in done.stdout
    assert "prefillq's auto (not in stock LightLLM)" in done.stdout
    assert "LightLLM: <code>--prefill_queue_strategy hrrn</code>" in (out / "report.html").read_text()
    refused = report("--pair", "default:hrrn")
    assert refused.returncode == 2 and "--pair: only for a bench results folder" in refused.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report_folder_error(empty) == 2  # neither kind: bench's own one-line error


def report_folder_error(folder) -> int:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "prefillq.cli", "report", str(folder)], capture_output=True,
                          text=True, env={"PATH": ""}, timeout=120).returncode
