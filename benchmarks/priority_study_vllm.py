"""Two priority classes on real vLLM CPU (issue 29): what strict tiers buy the interactive class and what
they cost the batch class, measured with ``prefillq bench`` (the real-engine half of
``benchmarks/priority_study.py``).

Workload: the ``sustained`` scenario (Poisson arrivals, 25% long prompts, 128-token short prompts, 128
output tokens) with ``interactive_share=0.2``: 20% of all requests are interactive (short, priority 0), the
other 80% batch (the remaining short and every long request, priority 1). Scaled to the tiny model of
``prefillq make-tiny-model`` on a 2-core CPU (long prompts 4,096 tokens, budget 1,024 tokens a step): normal
load 10 req/s, heavy load 16 req/s (past the engine's capacity of about 15/s: the queue grows). Rows, three
vLLM servers started once and kept up (an idle CPU server takes no CPU), all sent the same schedule:

* ``stock_fcfs``: stock vLLM, ``--scheduling-policy fcfs`` (the requests' priorities are sent and ignored);
* ``stock_priority``: stock vLLM, ``--scheduling-policy priority`` (its own priority heap and preemption);
* ``priority_auto``: prefillq's plug-in with ``auto`` (ordered partial prefills) inside each tier, under
  ``--scheduling-policy priority``.

Each load is one ``prefillq bench --url ...`` call (1 warm-up and ``--reps`` measured rounds, the rows'
order rotated between rounds), so the paired changes and their 95% intervals are bench's own; the launch
uses bench's own launcher (``prefillq.bench.launch.vllm_server``), since ``bench --launch`` gives every server
the same vLLM arguments and the FCFS and priority rows need different ones.

    prefillq make-tiny-model .tmp/h3/tiny
    flock /tmp/prefillq-engine.lock python benchmarks/priority_study_vllm.py --model .tmp/h3/tiny \\
        --out .tmp/h3/study [--reps 3] [--duration 12]
    python benchmarks/priority_study_vllm.py --analyze .tmp/h3/study [--lateness-limit-ms 30]   # the table again

Prints one markdown table (medians over the measured rounds, paired change [95% interval]) and writes
``OUT/priority_study_vllm.json`` (every figure and interval, load averages before and after each load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOADS = (("normal", 10.0), ("heavy", 16.0))
ROWS = (  # (label, prefillq policy SPEC or None for stock vLLM, vLLM --scheduling-policy)
    ("stock_fcfs", None, "fcfs"),
    ("stock_priority", None, "priority"),
    ("priority_auto", "auto:partial_prefills=ordered", "priority"),
)
BASELINE = "stock_fcfs"
PAIR = ("stock_priority", "priority_auto")
FIGURES = (  # (summary key, column heading)
    ("priority_0_short_ttft_p95_ms", "interactive short TTFT P95 (ms)"),
    ("priority_1_short_ttft_p95_ms", "batch short TTFT P95 (ms)"),
    ("priority_1_long_ttft_p95_ms", "batch long TTFT P95 (ms)"),
    ("priority_1_ttft_p95_ms", "batch TTFT P95 (ms)"),
    ("output_tokens_per_s", "output tok/s"),
)
SCENARIO_SET = ("long_tokens=4096", "interactive_share=0.2")
BUDGET = 1024


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as /proc/loadavg gives them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "-"


def start_servers(model: str, out: Path) -> dict[str, Any]:
    """The three servers, started one after the other (each waits until /health answers)."""
    from prefillq.bench.launch import free_port, vllm_server
    from prefillq.config import parse_policy_spec

    servers: dict[str, Any] = {}
    for label, spec, scheduling in ROWS:
        config = None if spec is None else parse_policy_spec(spec)[1]
        server = vllm_server(model, config, port=free_port(), log_path=out / "logs" / f"server-{label}.log",
                             extra_args=["--enforce-eager", "--max-num-batched-tokens", str(BUDGET),
                                         "--scheduling-policy", scheduling])
        started = time.monotonic()
        server.start()
        servers[label] = server
        server.wait_ready(900.0)
        print(f"{label}: ready in {time.monotonic() - started:.0f} s at {server.url}", file=sys.stderr, flush=True)
    return servers


def bench_load(servers: dict[str, Any], load: str, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """One ``prefillq bench`` call against the three servers; the load averages around it."""
    folder = args.out / load
    command = [sys.executable, "-m", "prefillq", "bench", "--scenario", "sustained", "--set", f"rate={rate:g}",
               "--set", f"duration_s={args.duration:g}", *(x for item in SCENARIO_SET for x in ("--set", item)),
               "--seed", str(args.seed), "--reps", str(args.reps), "--warmup", "1", "--baseline", BASELINE,
               "--pair", f"{PAIR[0]}:{PAIR[1]}", "--policies", ",".join(label for label, *_ in ROWS),
               "--out", str(folder), "--format", "json"]
    for label, *_ in ROWS:
        command += ["--url", servers[label].url]
    before = load_average()
    started = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"prefillq bench failed for {load} (exit {result.returncode}); see {folder}")
    return {"load": load, "rate": rate, "folder": str(folder), "command": command[1:],
            "load_average_before": before, "load_average_after": load_average(),
            "wall_s": round(time.monotonic() - started, 1)}


def cell(summary: dict[str, Any], row: str, key: str, vs: str) -> str:
    from prefillq.report.bench import interval_text

    value = (summary["policies"].get(row) or {}).get(key)
    text = "-" if value is None else f"{value:,.0f}"
    comparison = (summary["intervals"].get(f"{row}_vs_{vs}") or {}).get("metrics", {}).get(key)
    return text if row == vs or comparison is None else f"{text} ({interval_text(comparison)})"


def table(loads: list[dict[str, Any]]) -> str:
    """Medians over the kept rounds; in brackets the paired change vs stock FCFS (priority_auto: also vs
    stock priority on a second line of the same row)."""
    head = "| load | row | " + " | ".join(heading for _, heading in FIGURES) + " | rounds used |"
    lines = [head, "|" + "---|" * (len(FIGURES) + 3)]
    for item in loads:
        summary = json.loads((Path(item["folder"]) / "summary.json").read_text())
        used = sum(1 for r in summary.get("rounds", []) if r.get("used"))
        for label, *_ in ROWS:
            cells = [cell(summary, label, key, BASELINE) for key, _ in FIGURES]
            lines.append(f"| {item['load']} ({item['rate']:g}/s) | {label} vs {BASELINE} | " + " | ".join(cells)
                         + f" | {used} |")
        cells = [cell(summary, PAIR[1], key, PAIR[0]) for key, _ in FIGURES]
        lines.append(f"| {item['load']} ({item['rate']:g}/s) | {PAIR[1]} vs {PAIR[0]} | " + " | ".join(cells)
                     + f" | {used} |")
    return "\n".join(lines)


def rereport(loads: list[dict[str, Any]], lateness_limit_ms: float) -> None:
    """``prefillq report`` on each load's folder with another send-lateness limit (rewrites its summary)."""
    for item in loads:
        command = [sys.executable, "-m", "prefillq", "report", item["folder"], "--baseline", BASELINE, "--pair",
                   f"{PAIR[0]}:{PAIR[1]}", "--lateness-limit-ms", f"{lateness_limit_ms:g}", "--no-plots",
                   "--format", "json"]
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            raise SystemExit(f"prefillq report failed on {item['folder']}")


def figures(loads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per load and row: the medians and the paired changes with their intervals (what the table shows)."""
    rows = []
    for item in loads:
        summary = json.loads((Path(item["folder"]) / "summary.json").read_text())
        for label, *_ in ROWS:
            rows.append({"load": item["load"], "rate": item["rate"], "row": label,
                         **{key: (summary["policies"].get(label) or {}).get(key) for key, _ in FIGURES},
                         "vs": {name: {key: item_["metrics"].get(key) for key, _ in FIGURES}
                                for name, item_ in summary["intervals"].items() if item_["treatment"] == label},
                         "rounds_used": [r["round"] for r in summary.get("rounds", []) if r.get("used")],
                         "excluded": {r["round"]: r["reasons"] for r in summary.get("rounds", [])
                                      if r.get("disturbed")},
                         "settings": summary.get("settings")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the model folder (prefillq make-tiny-model)")
    parser.add_argument("--out", type=Path, default=Path(".tmp/priority_study_vllm"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--analyze", type=Path, help="print the table of a finished study folder")
    parser.add_argument("--lateness-limit-ms", type=float, default=None,
                        help="--analyze: report the folders again with this send-lateness limit (bench's is 10 ms)")
    args = parser.parse_args()
    if args.analyze:
        path = args.analyze / "priority_study_vllm.json"
        data = json.loads(path.read_text())
        if args.lateness_limit_ms is not None:
            rereport(data["loads"], args.lateness_limit_ms)
            data["lateness_limit_ms"] = args.lateness_limit_ms
        data["rows"] = figures(data["loads"])
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(table(data["loads"]))
        return
    if not args.model:
        parser.error("--model DIR is needed to measure (or --analyze DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    servers = start_servers(args.model, args.out)
    loads = []
    try:
        for load, rate in LOADS:
            loads.append(bench_load(servers, load, rate, args))
            print(f"{load}: {loads[-1]['wall_s']} s, load average {loads[-1]['load_average_before']} -> "
                  f"{loads[-1]['load_average_after']}", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    path = args.out / "priority_study_vllm.json"
    path.write_text(json.dumps({"reps": args.reps, "duration_s": args.duration, "seed": args.seed,
                                "budget": BUDGET, "scenario_set": SCENARIO_SET, "loads": loads,
                                "rows": figures(loads)}, indent=1) + "\n")
    print(table(loads))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
