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


def test_nothing_is_refused_with_default_and_order_dependent_tests_are_named() -> None:
    """With `default` every vLLM test stock passes must pass (vLLM's priority tests too, since prefillq runs
    that mode with tiers); only the every-policy runs may skip tests, each named with its reason."""
    assert runner.refused_names() == set()
    names = runner.refused_names("order_dependent.txt")
    assert names and all("::" in name for name in names)
    assert {"test_scheduler::test_schedule_order", "test_scheduler::test_priority_scheduling_fcfs_fallback"} <= names


def test_only_a_release_gated_test_may_skip_and_only_before_its_release() -> None:
    window = ("tests.integration.test_differential::"
              "test_default_with_the_admission_window_schedules_every_step_as_stock_vllm")
    assert runner.gated_out(f"{window}[sync-first]", "0.33.0")  # 0.33 has no admission window
    assert not runner.gated_out(f"{window}[sync-first]", "0.34.0")  # 0.34 has it: a skip there is a failure
    assert not runner.gated_out("tests.integration.test_differential::test_other[sync]", "0.32.0")
