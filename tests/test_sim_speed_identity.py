"""The simulator's speed work changes no result: seeded comparisons give, bit for bit, the figures the code
gave before it (issue 31: "results identical to today's, bit for bit where the algorithm did not change").

``tests/data/sim_speed_golden.json`` was written by this file (``python tests/test_sim_speed_identity.py``)
on the code before the speed changes: every row's summary, the lower bound, the achievable bracket (the
two clairvoyant reference schedules) and digests of the per-request columns, step end times and timeline
of each row's run. The test recomputes them and compares every value exactly (floats by ``repr``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefillq.sim.compare import compare_policies
from prefillq.workload import load_trace

GOLDEN = Path(__file__).resolve().parent / "data" / "sim_speed_golden.json"

# (case, trace, rows, comparison options): a user-shaped synthetic trace busy enough to queue (hrrn, the
# row issue 31 times, and the default pair), the bundled code trace with compare's default rows, LightLLM
# mode, and a KV cache small enough to preempt
CASES: dict[str, dict[str, Any]] = {
    "user-20k": {"trace": "user", "rows": ["hrrn", "default", "short_request_first"], "options": {}},
    "azure-code-default": {"trace": "sample:azure-code",
                           "rows": ["default", "promote_shortest", "hrrn", "short_request_first",
                                    "auto:partial_prefills=ordered"], "options": {}},
    "user-5k-lightllm": {"trace": "user-5k", "rows": ["hrrn", "default"], "options": {"mode": "lightllm"}},
    "user-5k-tight-kv": {"trace": "user-5k", "rows": ["hrrn", "default", "auto:partial_prefills=ordered"],
                         "options": {"kv_blocks": 2200, "max_num_seqs": 48}},  # preemptions, skipped decodes
}


def write_user_trace(path: Path, count: int, *, rate: float = 20.0, seed: int = 7) -> None:
    """Poisson arrivals at ``rate``, log-normal prompts (median 1024, sigma 1, at most 16K), outputs uniform in
    20-300: benchmarks/big_trace.py's shape, drawn with the standard library so the file never changes."""
    rng = random.Random(seed)
    now = 0.0
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens\n"]
    for _ in range(count):
        prompt = max(1, min(16384, int(rng.lognormvariate(math.log(1024), 1.0))))
        lines.append(f"{now:.6f},{prompt},{rng.randint(20, 300)}\n")
        now += rng.expovariate(rate)
    path.write_text("".join(lines), encoding="utf-8")


def _digest(*columns: Any) -> str:
    h = hashlib.sha256()
    for column in columns:
        h.update(array("d", column).tobytes() if not isinstance(column, (bytes, str)) else
                 (column.encode() if isinstance(column, str) else column))
    return h.hexdigest()[:24]


def _exact(value: Any) -> Any:
    """``value`` with every float as its repr (NaN and infinities included), for an exact comparison."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _exact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_exact(v) for v in value]
    return value


def compute(case: str, folder: Path) -> dict[str, Any]:
    spec = CASES[case]
    trace = spec["trace"]
    if trace in ("user", "user-5k"):
        path = folder / f"{trace}.csv"
        write_user_trace(path, 20_000 if trace == "user" else 5_000)
        trace = str(path)
    workload = load_trace(trace)
    from prefillq.config import parse_policy_spec

    rows = dict(parse_policy_spec(row) for row in spec["rows"])
    comparison = compare_policies(lambda _seed: workload, rows, jobs=1, **spec["options"])
    runs = {}
    for label, run in comparison.last_runs.items():
        records = run.records
        columns = [getattr(records, name) for name in ("first_token_s", "finish_s", "first_scheduled_s")] \
            if hasattr(records, "first_token_s") else [
                [r.ttft_s if r.ttft_s is not None else math.nan for r in records],
                [r.e2e_s if r.e2e_s is not None else math.nan for r in records]]
        itl = [gap for record in records for gap in record.itl_s]
        timeline = list(run.timeline)
        runs[label] = {
            "steps": run.steps, "preemptions": run.preemptions, "sim_time_s": run.sim_time_s,
            "records": _digest(*columns), "itl": _digest(itl),
            "timeline": _digest([x for point in timeline for x in point]), "timeline_points": len(timeline),
            "long_waits": _digest(run.long_waits_s), "short_waits": _digest(run.short_waits_s),
            "lanes": _digest(json.dumps(run.lanes, sort_keys=True)),
        }
    bound = {k: v for k, v in comparison.bound.items() if k != "ttft_s"}
    bound["ttft_s"] = _digest(comparison.bound["ttft_s"])
    return _exact({"summaries": comparison.summaries, "bound": bound, "achievable": comparison.achievable,
                   "runs": runs})


@pytest.mark.parametrize("case", list(CASES))
def test_seeded_comparison_is_bit_for_bit_what_it_was(case: str, tmp_path: Path) -> None:
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))[case]
    got = json.loads(json.dumps(compute(case, tmp_path)))
    for part in ("bound", "achievable", "summaries", "runs"):
        assert got[part] == expected[part], part


if __name__ == "__main__":  # regenerate (only on code whose results are the reference)
    import tempfile

    golden = json.loads(GOLDEN.read_text(encoding="utf-8")) if GOLDEN.exists() else {}
    with tempfile.TemporaryDirectory() as folder:
        golden.update({case: compute(case, Path(folder)) for case in (sys.argv[1:] or CASES)})
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def test_progress_reports_the_rows_share_done_without_changing_a_number(tmp_path: Path) -> None:
    """compare's progress hook (for a bar with an estimate on big traces) rises to 1 over the rows' runs, and a
    run that reports progress gives the figures of one that does not."""
    path = tmp_path / "user.csv"
    write_user_trace(path, 3_000)
    workload = load_trace(str(path))
    heard: list[float] = []
    rows = ["hrrn", "default"]
    quiet = compare_policies(lambda _seed: workload, rows, jobs=1, repeats=2)
    loud = compare_policies(lambda _seed: workload, rows, jobs=1, repeats=2, on_progress=heard.append)
    assert loud.summaries == quiet.summaries and loud.achievable == quiet.achievable
    assert heard == sorted(heard) and heard[-1] == 1.0
    assert len(heard) > 4 * 3  # several reports per run (every 256 finished requests), not one per run
    assert heard.count(0.5) == 1  # half of the four row runs (2 rows x 2 repeats) done
