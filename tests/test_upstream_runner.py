"""The verdict of scripts/vllm_upstream_tests.py: what counts as an extra failure against stock vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "vllm_upstream_tests.py"
spec = importlib.util.spec_from_file_location("vllm_upstream_tests", SCRIPT)
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)


def test_only_tests_stock_passes_count_and_refusals_match_by_name_or_case() -> None:
    stock = {"a::t1": "passed", "a::t2[x]": "passed", "a::t2[y]": "passed", "a::t3": "failed",
             "a::prio[p]": "passed", "a::prio[q]": "passed", "a::case[priority-2]": "passed",
             "a::case[fcfs-1]": "passed", "a::t4": "skipped"}
    ours = {"a::t1": "passed", "a::t2[x]": "passed", "a::t2[y]": "failed", "a::t3": "passed",
            "a::prio[p]": "failed", "a::prio[q]": "failed", "a::case[priority-2]": "failed",
            "a::case[fcfs-1]": "failed", "a::t4": "skipped"}
    result = runner.compare(stock, ours, {"a::prio", "a::case[priority-2]"})
    assert result["extra_failures"] == ["a::case[fcfs-1]", "a::t2[y]"]
    assert result["refused"] == ["a::case[priority-2]", "a::prio[p]", "a::prio[q]"]
    assert result["gained"] == ["a::t3"]
    assert (result["stock_passed"], result["stock_failed"], result["stock_skipped"]) == (7, 1, 1)


def test_refused_list_names_only_priority_policy_tests() -> None:
    names = runner.refused_names()
    assert names and all("priority" in name or name.endswith("[kwargs0]") for name in names)
    assert all("::" in name for name in names)
