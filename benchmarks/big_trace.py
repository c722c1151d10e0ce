"""Big traces, timed as a user runs them: ``prefillq compare --trace T --policies P`` as a whole process.

For each size, writes a seeded synthetic trace in the Azure CSV format to a temporary folder, shaped
like an operator's own trace (``--shape user``, the default: Poisson arrivals at ``--rate``, log-normal
prompt lengths clipped to 16K tokens, outputs uniform in 20-300 tokens; ``--shape conversation``: lengths
resampled from the Azure 2023 conversation trace when ../shared/data/traces has it, else a two-lognormal
mix shaped like it). Then runs the ``prefillq`` command line on it ``--runs`` times, each in a fresh
process, and times it from outside: start-up, imports, parsing, the overload check, the lower bound,
the simulation, the summary and the printed table all count; by default compare runs its two reference
schedules in worker processes of their own beside the policy (``--jobs 1``: all in one process). CPU
seconds include the workers'; peak RSS is the largest of the processes (``wait4``); the summed peaks
(PSS: shared pages split among the processes that share them; RSS: counted in each) are sampled.
A further in-process run (``--phases``) splits the time: import, load, bound, simulate (the latter
includes waiting for the workers).

    python benchmarks/big_trace.py [--sizes 400000] [--rate 20] [--policy hrrn] [--runs 3] [--jobs J] [--json PATH]

Other processes sharing the CPU slow the runs down: the requests per second are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONV_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure-2023-conv.csv"
DEFAULT_RATE = 20.0  # requests/s
CHUNK = 100_000
PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_MAX = 1024, 1.0, 16384  # --shape user: log-normal prompts up to 16K
OUTPUT_RANGE = (20, 300)                                    # --shape user: outputs uniform in this range
SHAPES = ("user", "conversation")
MEMORY_SAMPLE_S = 0.2  # how often the process tree's memory is sampled (issue 31: <= 500 MB summed over it)
TARGET_REQUESTS_PER_S = 20_000
TARGET_SUMMED_MB = 500


def _lengths(rng: Any, count: int, shape: str) -> tuple[Any, Any, str]:
    """(prompt tokens, output tokens, where they come from) for ``count`` requests."""
    import numpy as np

    if shape == "user":
        prompt = np.clip(rng.lognormal(np.log(PROMPT_MEDIAN), PROMPT_SIGMA, count), 1, PROMPT_MAX)
        output = rng.integers(OUTPUT_RANGE[0], OUTPUT_RANGE[1] + 1, count)
        return (prompt.astype(np.int64), output.astype(np.int64),
                f"log-normal prompts (median {PROMPT_MEDIAN}, sigma {PROMPT_SIGMA}, at most {PROMPT_MAX}), "
                f"outputs uniform in {OUTPUT_RANGE[0]}-{OUTPUT_RANGE[1]}")
    if CONV_TRACE.exists():
        table = np.loadtxt(CONV_TRACE, delimiter=",", skiprows=1, usecols=(1, 2), dtype=np.int64)
        rows = rng.integers(0, len(table), count)
        return table[rows, 0], table[rows, 1], f"resampled from {CONV_TRACE.name}"
    short = rng.random(count) < 0.15
    prompt = np.where(short, rng.lognormal(np.log(180), 0.6, count), rng.lognormal(np.log(1150), 0.6, count))
    output = rng.lognormal(np.log(130), 0.9, count)
    return (np.clip(prompt, 1, 14050).astype(np.int64), np.clip(output, 1, 2000).astype(np.int64),
            "two-lognormal mix shaped like the Azure conversation trace")


def write_trace(path: Path, count: int, *, rate: float, seed: int = 0, shape: str = "user") -> str:
    """Write ``count`` requests in the Azure CSV format (Poisson arrivals); return how the lengths were drawn."""
    import numpy as np

    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    rng = np.random.default_rng(seed)
    prompt, output, source = _lengths(rng, count, shape)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    arrivals -= arrivals[0]
    with path.open("w", encoding="utf-8") as handle:
        handle.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for start in range(0, count, CHUNK):
            stop = min(start + CHUNK, count)
            handle.writelines(f"{a:.6f},{p},{o}\n" for a, p, o in zip(
                arrivals[start:stop].tolist(), prompt[start:stop].tolist(), output[start:stop].tolist(), strict=True))
    return source


def whole_process(trace: Path, policy: str, summary: Path, jobs: int | None = None) -> dict[str, float]:
    """One ``prefillq compare --trace`` run in a fresh process: wall and CPU seconds (its worker processes
    included), peak RSS (MB; the largest of the process and its workers) and the peaks of the tree's summed
    PSS and RSS (sampled every ``MEMORY_SAMPLE_S``)."""
    command = [sys.executable, "-m", "prefillq", "compare", "--trace", str(trace), "--policies", policy,
               "--json", str(summary), *(["--jobs", str(jobs)] if jobs is not None else [])]
    env = dict(os.environ, COLUMNS="100")
    begin = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    summed = {"rss": 0.0, "pss": 0.0}
    while True:  # sample the process tree's memory until it exits (stderr: compare's bar, a few lines at most)
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        _sample_tree(child.pid, summed)
        time.sleep(MEMORY_SAMPLE_S)
    wall = time.perf_counter() - begin
    child.returncode = os.waitstatus_to_exitcode(status)
    error = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if child.stderr:
        child.stderr.close()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {child.returncode}):\n{error}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "peak_summed_rss_mb": summed["rss"], "peak_summed_pss_mb": summed["pss"]}


def _sample_tree(pid: int, peaks: dict[str, float]) -> None:
    """Raise ``peaks`` to the memory of process ``pid`` and its descendants now, summed: RSS (shared pages
    counted in each process) and PSS (shared pages split among their sharers: the tree's real footprint)."""
    try:
        import psutil
    except ImportError:  # no sampling: the summed columns stay 0
        return
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    rss = pss = 0.0
    for process in processes:
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss / 2**20
        pss += getattr(info, "pss", info.rss) / 2**20
    peaks["rss"], peaks["pss"] = max(peaks["rss"], rss), max(peaks["pss"], pss)


def phases(trace: str, policy: str, jobs: int | None = None) -> dict[str, Any]:
    """In this (fresh) process: the compare path timed by phase (import, load, bound, simulate)."""
    import resource

    started = time.perf_counter()
    import prefillq.sim.compare as compare_module
    from prefillq.sim.compare import CompareSettings, prepare_comparison

    spent = {"bound_s": 0.0}
    lower_bounds = compare_module.lower_bounds

    def timed_bounds(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return lower_bounds(*args, **kwargs)
        finally:
            spent["bound_s"] += time.perf_counter() - begin

    compare_module.lower_bounds = timed_bounds  # only to report the phase; the path is unchanged
    imported = time.perf_counter()
    setup = prepare_comparison(CompareSettings(trace=Path(trace), policies=[policy], jobs=jobs))
    prepared = time.perf_counter()
    comparison = setup.run()
    finished = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"import_s": imported - started, "load_s": prepared - imported, "bound_s": spent["bound_s"],
            "simulate_s": finished - prepared - spent["bound_s"], "phases_cpu_s": usage.ru_utime + usage.ru_stime,
            "steps": comparison.last_runs[setup.policies[0]].steps}


def measure(size: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    trace = folder / f"big-{size}.csv"
    source = write_trace(trace, size, rate=args.rate, seed=args.seed, shape=args.shape)
    summary_path = folder / f"big-{size}.json"
    runs = [whole_process(trace, args.policy, summary_path, args.jobs) for _ in range(args.runs)]
    summary = json.loads(summary_path.read_text(encoding="utf-8"))["policies"][args.policy]
    wall = statistics.median(run["wall_s"] for run in runs)
    peak = max(run["peak_rss_mb"] for run in runs)
    summed_pss = max(run["peak_summed_pss_mb"] for run in runs)
    summed_rss = max(run["peak_summed_rss_mb"] for run in runs)
    result: dict[str, Any] = {
        "requests": size, "rate": args.rate, "policy": args.policy, "shape": args.shape, "lengths": source,
        "jobs": args.jobs,
        "runs": runs, "wall_s": wall, "wall_min_s": min(run["wall_s"] for run in runs),
        "wall_max_s": max(run["wall_s"] for run in runs), "cpu_s": statistics.median(run["cpu_s"] for run in runs),
        "requests_per_s": size / wall, "peak_rss_mb": peak, "mb_per_1k_requests": peak / (size / 1000),
        "peak_summed_pss_mb": summed_pss, "peak_summed_rss_mb": summed_rss,
        "target_requests_per_s": TARGET_REQUESTS_PER_S, "target_summed_mb": TARGET_SUMMED_MB,
        "completed": summary["completed"], "short_ttft_p50_ms": summary["short_ttft_p50_ms"],
        "long_ttft_p95_ms": summary["long_ttft_p95_ms"],
    }
    if args.phases:
        done = subprocess.run([sys.executable, __file__, "--phases-of", str(trace), "--policy", args.policy,
                               *(["--jobs", str(args.jobs)] if args.jobs is not None else [])],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"size {size}: the phase run failed:\n{done.stderr}")
        result.update(json.loads(done.stdout.strip().splitlines()[-1]))
    trace.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="400000", help="comma-separated request counts")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="arrivals per second")
    parser.add_argument("--shape", default="user", choices=SHAPES, help="how prompt and output lengths are drawn")
    parser.add_argument("--policy", default="hrrn")
    parser.add_argument("--runs", type=int, default=3, help="whole-process runs per size (the median is reported)")
    parser.add_argument("--phases", action="store_true", help="also one in-process run timed by phase")
    parser.add_argument("--jobs", type=int, default=None, help="compare's --jobs (default: as a user runs it, "
                        "each reference schedule in a worker process of its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--phases-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phases_of is not None:
        print(json.dumps(phases(args.phases_of, args.policy, args.jobs)))
        return
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    from rich.console import Console
    from rich.table import Table

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="prefillq-big-trace-") as folder:
        results = [measure(size, args, Path(folder)) for size in sizes]
    jobs = "" if args.jobs is None else f" --jobs {args.jobs}"
    table = Table(title=f"prefillq compare --trace T --policies {args.policy}{jobs}, whole process "
                        f"({args.shape} lengths, {args.rate:g} req/s; median of {args.runs} runs)")
    columns = ["requests", "wall s (min-max)", "CPU s", f"requests/s (target {TARGET_REQUESTS_PER_S:,})",
               "peak RSS MB (largest process)", f"summed PSS / RSS MB (target {TARGET_SUMMED_MB})",
               "MB / 1K requests"]
    if args.phases:
        columns += ["import s", "load s", "bound s", "simulate s"]
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        row = [f"{r['requests']:,}", f"{r['wall_s']:.1f} ({r['wall_min_s']:.1f}-{r['wall_max_s']:.1f})",
               f"{r['cpu_s']:.1f}", f"{r['requests_per_s']:,.0f}", f"{r['peak_rss_mb']:,.0f}",
               f"{r['peak_summed_pss_mb']:,.0f} / {r['peak_summed_rss_mb']:,.0f}", f"{r['mb_per_1k_requests']:.3f}"]
        if args.phases:
            row += [f"{r[key]:.1f}" for key in ("import_s", "load_s", "bound_s", "simulate_s")]
        table.add_row(*row)
    console = Console(width=150)
    console.print(table)
    console.print(f"lengths: {results[0]['lengths'] if results else '-'}; load average at the end: "
                  f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes slow this down)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"python": sys.version.split()[0], "results": results}, indent=2) + "\n",
                             encoding="utf-8")


if __name__ == "__main__":
    main()
