"""How long `import prefillq` and `prefillq --help` take, each in a fresh interpreter (median of N runs).

Also records which heavy modules (numpy, matplotlib, torch, vllm, ray) the import pulls in: none should be.
Pass ``--src`` to measure another checkout (e.g. the code before a change) with the same interpreter.

    python benchmarks/startup.py [--runs 15] [--src PATH/src] [--out benchmarks/out/startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "matplotlib", "torch", "vllm", "ray", "httpx", "rich")
PROBE = ("import sys, time; t = time.perf_counter(); import prefillq; "
         "print(time.perf_counter() - t); print(','.join(m for m in {heavy} if m in sys.modules))")
HELP_TARGET_MS = 500.0  # issue 31: `prefillq --help` well under half a second


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    return env


def time_import(runs: int, src: str | None) -> tuple[float, float, list[str]]:
    """In-process import time (s) and whole-process wall time (s), medians; heavy modules imported."""
    inner, outer, heavy = [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], capture_output=True, text=True,
                             env=_env(src), check=True).stdout.splitlines()
        outer.append(time.perf_counter() - start)
        inner.append(float(out[0]))
        heavy = [m for m in (out[1] if len(out) > 1 else "").split(",") if m]
    return statistics.median(inner), statistics.median(outer), heavy


def time_help(runs: int, src: str | None) -> float:
    """Whole-process wall time (s) of `prefillq --help`, median."""
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from prefillq.cli import main; main()", "--help"],
                       capture_output=True, env=_env(src), check=True)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--src", default=None, help="a src/ folder to put first on PYTHONPATH")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/startup.json"))
    args = parser.parse_args()
    import_s, process_s, heavy = time_import(args.runs, args.src)
    help_s = time_help(args.runs, args.src)
    bare = statistics.median(
        _wall([sys.executable, "-c", "pass"], args.src) for _ in range(args.runs))
    result = {"src": args.src or "installed", "runs": args.runs, "import_prefillq_ms": import_s * 1000,
              "import_process_ms": process_s * 1000, "help_process_ms": help_s * 1000,
              "bare_python_process_ms": bare * 1000, "heavy_modules_imported": heavy}
    print(f"{'measure':<34}{'ms (median of ' + str(args.runs) + ')':>24}")
    print(f"{'import prefillq (in process)':<34}{result['import_prefillq_ms']:>24.1f}")
    print(f"{'python -c import prefillq':<34}{result['import_process_ms']:>24.1f}")
    print(f"{'prefillq --help':<34}{result['help_process_ms']:>24.1f}")
    print(f"{'python -c pass (baseline)':<34}{result['bare_python_process_ms']:>24.1f}")
    print(f"heavy modules pulled in by import prefillq: {', '.join(heavy) or 'none'}")
    met = result["help_process_ms"] < HELP_TARGET_MS
    result.update(help_target_ms=HELP_TARGET_MS, help_target_met=met)
    print(f"target: prefillq --help well under {HELP_TARGET_MS:.0f} ms: {'met' if met else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def _wall(command: list[str], src: str | None) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, env=_env(src), check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
