"""How much faster is a sweep with more worker processes? A 64-cell sweep of the Azure conversation trace.

The grid: 4 policies x 2 budgets x 2 replica counts x 4 rate scales over a window of the trace
(../shared/data/traces/azure-2023-conv.csv), run with ``--jobs 1`` and ``--jobs 2`` (and optionally on
a local Ray); prints a table of wall times and the speed-up, checks that every run gave the same rows,
and writes JSON.

    python benchmarks/sweep_speed.py [--jobs 1,2] [--ray] [--duration 600] [--out benchmarks/results/sweep_speed.json]

The machine's load average is recorded next to each time, and the CPU seconds the sweep used (this
process and its worker processes): CPU s / wall s is how many CPUs it actually got. On a shared
machine that stays near 1 with two jobs, and the speed-up reads low.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prefillq.sweep import ProcessExecutor, RayExecutor, SweepGrid, run_sweep

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "azure-2023-conv.csv"


def grid(trace: Path, duration_s: float) -> SweepGrid:
    return SweepGrid(trace=str(trace), duration_s=duration_s,
                     policies=("default", "promote_shortest", "hrrn", "short_request_first"),
                     budgets=(1024, 2048), replicas=(2, 4), rate_scales=(2.0, 4.0, 6.0, 8.0),
                     router="least_outstanding_tokens")


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (worker processes; not Ray's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(the_grid: SweepGrid, executor: object) -> tuple[float, float, list[dict], tuple[float, float]]:
    load_before = os.getloadavg()[0]
    cpu = _cpu_s()
    start = time.perf_counter()
    rows = run_sweep(the_grid, executor).rows
    wall = time.perf_counter() - start
    return wall, _cpu_s() - cpu, rows, (load_before, os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of the trace per cell")
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--ray", action="store_true", help="also run on a local Ray with the most jobs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sweep_speed.json"))
    args = parser.parse_args()
    the_grid = grid(args.trace, args.duration)
    cells = len(the_grid.cells())
    runs = []
    reference = None
    for jobs in (int(j) for j in args.jobs.split(",")):
        wall, cpu, rows, load = timed(the_grid, ProcessExecutor(jobs))
        reference = rows if reference is None else reference
        runs.append({"executor": "process", "jobs": jobs, "wall_s": wall, "cpu_s": cpu, "load_before": load[0],
                     "load_after": load[1], "same_rows": rows == reference})
    if args.ray:
        jobs = max(run["jobs"] for run in runs)
        with RayExecutor(num_cpus=jobs) as executor:
            wall, _, rows, load = timed(the_grid, executor)
        runs.append({"executor": "ray", "jobs": jobs, "wall_s": wall, "cpu_s": None, "load_before": load[0],
                     "load_after": load[1],
                     "same_rows": rows == reference})
    base = runs[0]["wall_s"]
    table = Table(title=f"{cells}-cell sweep of {args.trace.name} ({args.duration:g} s window per cell)")
    for column in ("executor", "jobs", "wall s", "CPU s", "CPUs busy", "speed-up vs first", "load avg before/after",
                   "same rows"):
        table.add_column(column, justify="right")
    for run in runs:
        run["speedup"] = base / run["wall_s"]
        cpu = run["cpu_s"]
        table.add_row(run["executor"], str(run["jobs"]), f"{run['wall_s']:.1f}", "-" if cpu is None else f"{cpu:.1f}",
                      "-" if cpu is None else f"{cpu / run['wall_s']:.2f}", f"{run['speedup']:.2f}x",
                      f"{run['load_before']:.1f} / {run['load_after']:.1f}", str(run["same_rows"]))
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "cells": cells, "trace": args.trace.name, "duration_s": args.duration, "grid": the_grid.to_dict(),
        "runs": runs, "cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
    }, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
