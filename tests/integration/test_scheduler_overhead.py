"""benchmarks/scheduler_overhead.py --quick: it builds vLLM's and prefillq's schedulers on CPU, steps them,
and writes its JSON in the documented shape (timings are not asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduler_overhead.py"


def test_quick_run_writes_a_row_for_every_scheduler(tiny_model: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The script quietens vLLM's log through the environment; keep that from leaking into the servers
    # later tests start (their INFO lines, ours among them, would be gone).
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    spec = importlib.util.spec_from_file_location("scheduler_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up there
    spec.loader.exec_module(script)
    out = tmp_path / "overhead.json"
    assert script.main(["--quick", "--modes", "sync", "--json", str(out)]) in (0, 1)  # 1: a target missed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "scheduler_overhead" and result["target_ratio"] == pytest.approx(1.10)
    rows = result["rows"]
    labels = {row["label"] for row in rows}
    policies = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
    assert {"vllm"} | {f"{name} {mode}" for name in policies for mode in ("first", "ordered")} <= labels
    for row in rows:
        assert row["steps"] > 0 and row["step_cpu_median_us"] > 0
        assert 0 < row["running_end"] <= row["running"] and row["waiting_end"] > 0
        assert (row["baseline"] is None) == (row["prefillq"] is None)  # stock rows are the baselines
    table = capsys.readouterr().out
    assert "auto ordered" in table and "<=+10%" in table
