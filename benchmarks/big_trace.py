"""Million-request traces: wall time, simulated requests per second and peak memory of one policy.

For each size, writes a seeded synthetic trace in the Azure CSV format to a temporary folder (prompt
and output lengths drawn from the Azure 2023 conversation trace when ../shared/data/traces has it,
else from a two-lognormal mix shaped like it; Poisson arrivals at ``--rate``), then runs one policy
through the path ``prefillq compare --trace`` takes (``prepare_comparison`` + ``run``: load the trace,
the overload check, the lower bound on short TTFT, the simulation, the summary) in a fresh
subprocess, so every size's peak RSS (``ru_maxrss``) is its own.

    python benchmarks/big_trace.py [--sizes 200000,1000000] [--rate 20] [--policy default] [--json PATH]

Other processes sharing the CPU slow the runs down: the requests per second are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONV_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure-2023-conv.csv"
DEFAULT_RATE = 20.0  # requests/s: about half the prefill capacity of the default profile for these lengths
CHUNK = 100_000


def _lengths(rng: Any, count: int) -> tuple[Any, Any, str]:
    """(prompt tokens, output tokens, where they come from) for ``count`` requests."""
    import numpy as np

    if CONV_TRACE.exists():
        table = np.loadtxt(CONV_TRACE, delimiter=",", skiprows=1, usecols=(1, 2), dtype=np.int64)
        rows = rng.integers(0, len(table), count)
        return table[rows, 0], table[rows, 1], f"resampled from {CONV_TRACE.name}"
    short = rng.random(count) < 0.15
    prompt = np.where(short, rng.lognormal(np.log(180), 0.6, count), rng.lognormal(np.log(1150), 0.6, count))
    output = rng.lognormal(np.log(130), 0.9, count)
    return (np.clip(prompt, 1, 14050).astype(np.int64), np.clip(output, 1, 2000).astype(np.int64),
            "two-lognormal mix shaped like the Azure conversation trace")


def write_trace(path: Path, count: int, *, rate: float, seed: int = 0) -> str:
    """Write ``count`` requests in the Azure CSV format; return where the lengths come from."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompt, output, source = _lengths(rng, count)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    arrivals -= arrivals[0]
    with path.open("w", encoding="utf-8") as handle:
        handle.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for start in range(0, count, CHUNK):
            stop = min(start + CHUNK, count)
            handle.writelines(f"{a:.6f},{p},{o}\n" for a, p, o in zip(
                arrivals[start:stop].tolist(), prompt[start:stop].tolist(), output[start:stop].tolist(), strict=True))
    return source


def child(trace: str, policy: str) -> dict[str, Any]:
    """One run in this (fresh) process: the compare path, timed by phase."""
    import resource

    started = time.perf_counter()
    import prefillq.sim.compare as compare_module
    from prefillq.sim.compare import CompareSettings, prepare_comparison

    phases = {"bound_s": 0.0}
    lower_bounds = compare_module.lower_bounds

    def timed_bounds(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return lower_bounds(*args, **kwargs)
        finally:
            phases["bound_s"] += time.perf_counter() - begin

    compare_module.lower_bounds = timed_bounds  # only to report the phase; the path is unchanged
    imported = time.perf_counter()
    setup = prepare_comparison(CompareSettings(trace=Path(trace), policies=[policy]))
    prepared = time.perf_counter()
    comparison = setup.run()
    finished = time.perf_counter()
    summary = comparison.summaries[setup.policies[0]]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "import_s": imported - started,
        "load_s": prepared - imported,
        "bound_s": phases["bound_s"],
        "simulate_s": finished - prepared - phases["bound_s"],
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "completed": summary["completed"],
        "steps": comparison.last_runs[setup.policies[0]].steps,
        "short_ttft_p50_ms": summary["short_ttft_p50_ms"],
        "long_ttft_p95_ms": summary["long_ttft_p95_ms"],
        "warnings": setup.warnings,
    }


def measure(size: int, rate: float, policy: str, folder: Path, seed: int) -> dict[str, Any]:
    trace = folder / f"big-{size}.csv"
    source = write_trace(trace, size, rate=rate, seed=seed)
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", str(trace), "--policy", policy],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - begin
    if done.returncode != 0:
        raise SystemExit(f"size {size}: the run failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    trace.unlink()
    result.update({
        "requests": size, "rate": rate, "policy": policy, "lengths": source, "wall_s": wall,
        "requests_per_s": size / wall, "simulated_requests_per_s": size / result["simulate_s"],
        "mb_per_1k_requests": result["peak_rss_mb"] / (size / 1000),
    })
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000", help="comma-separated request counts")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="arrivals per second")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.policy)))
        return
    from rich.console import Console
    from rich.table import Table

    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="prefillq-big-trace-") as folder:
        results = [measure(size, args.rate, args.policy, Path(folder), args.seed) for size in sizes]
    table = Table(title=f"one policy ({args.policy}, vLLM mode, default profile) on a {args.rate:g} req/s trace")
    for column in ("requests", "wall s", "CPU s", "requests/s", "load s", "bound s", "simulate s",
                   "simulated req/s", "peak RSS MB", "MB / 1K requests"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(f"{r['requests']:,}", f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}", f"{r['requests_per_s']:,.0f}",
                      f"{r['load_s']:.1f}",
                      f"{r['bound_s']:.1f}", f"{r['simulate_s']:.1f}", f"{r['simulated_requests_per_s']:,.0f}",
                      f"{r['peak_rss_mb']:,.0f}", f"{r['mb_per_1k_requests']:.3f}")
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
