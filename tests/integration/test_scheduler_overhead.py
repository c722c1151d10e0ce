"""benchmarks/scheduler_overhead.py --quick: it builds vLLM's and prefillq's schedulers on CPU, steps them,
and writes its JSON in the documented shape (timings are not asserted)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import fields
from pathlib import Path

import pytest

from prefillq.config import PolicyConfig

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "scheduler_overhead.py"
LABELS = ["vllm", *(f"prefillq {policy} {option}" for policy in ("fcfs", "hrrn", "srf")
                    for option in ("first", "ordered"))]


def test_quick_run_writes_one_row_with_every_scheduler(tiny_model: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The script quietens vLLM's log through the environment; keep that from leaking into the servers
    # later tests start (their INFO lines, ours among them, would be gone).
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    spec = importlib.util.spec_from_file_location("scheduler_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "overhead.json"
    assert script.main(["--quick", "--model", tiny_model, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "scheduler_overhead"
    assert result["variants"] == LABELS
    has_ordered = "partial_prefills" in {f.name for f in fields(PolicyConfig)}
    [row] = result["rows"]
    assert (row["waiting"], row["running"]) == (50, 8)
    for label in LABELS:
        cell = row[label]
        if label.endswith("ordered") and not has_ordered:
            assert cell is None
            continue
        assert set(cell) == {"cpu_mean_us", "cpu_median_us", "wall_mean_us", "wall_median_us", "steps",
                             "admitted_per_step", "tokens_per_step", "deferred_per_step",
                             "yielded_tokens_per_step", "running_end", "waiting_end"}
        assert cell["steps"] == result["steps"] == 10
        assert min(cell["cpu_median_us"], cell["wall_median_us"], cell["tokens_per_step"]) > 0
        assert (cell["deferred_per_step"] is None) == (label == "vllm")
        assert cell["running_end"] == 8 and cell["waiting_end"] == 50  # every seat taken, the queue topped up
    table = capsys.readouterr().out
    assert "prefillq srf first" in table and "vs vllm" in table
