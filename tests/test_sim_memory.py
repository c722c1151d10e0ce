"""What a long simulated run keeps: the queue forgets each finished request (as the vLLM plug-in tells it to), so
its memory of popped requests stays the size of what runs, not of the last 65,536 admissions; a lean run keeps
first-token and finish times only."""

from __future__ import annotations

import math
from array import array

from prefillq.sim.simulator import simulate
from prefillq.workload import RequestSpec, Workload


def _workload(count: int = 400) -> Workload:
    requests = [RequestSpec(f"r{i}", i * 0.01, 64 + (i * 37) % 900, 8 + i % 20, "short" if i % 3 else "long")
                for i in range(count)]
    return Workload("mixed", requests)


def test_the_queue_forgets_every_finished_request():
    result = simulate(_workload(), "hrrn", record_steps=True, kv_blocks=300, max_num_seqs=16)  # preemptions
    assert result.summary["completed"] == 400 and result.preemptions > 0
    assert len(result.node.waiting._memory) == 0  # (the queue's memory of popped requests)


def test_a_lean_run_keeps_first_token_and_finish_times_only():
    full = simulate(_workload(), "default")
    lean = simulate(_workload(), "default", lean=True)
    for key, value in full.summary.items():
        if not key.startswith("itl_"):
            assert lean.summary[key] == value, key
    assert lean.summary["itl_p50_ms"] is None and lean.long_waits_s == [] and lean.short_waits_s == []
    assert not hasattr(lean.records, "run_first") and len(lean.timeline) == 0
    assert array("d", full.records.first_token_s) == array("d", lean.records.first_token_s)
    assert not any(math.isnan(t) for t in lean.records.finish_s)


def test_a_comparisons_records_are_read_from_the_runs_when_asked():
    from prefillq.sim.compare import compare_policies

    comparison = compare_policies(lambda seed: _workload(60), ["default", "hrrn"], repeats=2, achievable=False)
    rows = comparison.records["hrrn"]
    assert len(rows) == 120 and [repeat for repeat, _ in rows] == [0] * 60 + [1] * 60
    assert rows[61] == (1, comparison.last_runs["hrrn"].records[1]) and rows[-1][1].request_id == "r59"
    assert list(rows) == list(rows[:]) and rows == list(rows)
