"""The measurement protocol of SPEC §6, and the files it leaves behind.

A *round* runs every policy once on the identical schedule and identical payloads (token ids are
seeded per round, so rounds differ from each other but never between policies). Warm-up rounds come
first (full mixed load) and are kept on disk but out of the statistics; then ``reps`` measured rounds,
the order of policies rotated by one each round so no policy always runs first or last.

A measured round is *disturbed* when any of its runs sent late (send-lateness P99 above a limit), had
failed requests, lost its server, was interrupted, or produced an output throughput far below that
policy's median (the signature of a stall such as a JIT compile in the middle of a run). Disturbed
rounds are excluded for *all* policies, so the pairs stay pairs, and the summary says which and why.

Results directory (everything appended as it happens; ``prefillq report DIR`` rebuilds the rest):

* ``bench.json``: workload, payload settings, servers, one entry per invocation;
* ``runs.jsonl``: one line per finished run (policy, phase, round, lateness, errors, metrics);
* ``requests/<run>.jsonl``: one line per request (``RequestRecord`` fields plus policy/phase/round),
  written and flushed as each request finishes;
* ``summary.json``: per-policy medians over kept rounds, paired intervals, rounds and exclusions.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillq.bench.client import JsonlWriter, RunResult, lateness_summary, run_load, wake_server
from prefillq.bench.launch import ServerFailed, Targets
from prefillq.bench.payload import Payload
from prefillq.metrics import RequestRecord, median, percentile, summarize, tpot_s
from prefillq.stats import DEFAULT_BOOTSTRAP_SAMPLES, compare_paired
from prefillq.workload import Workload

# Metrics compared between policies (summarize() keys; lower is better except throughput).
COMPARE_METRICS = (
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "long_ttft_p50_ms",
    "long_ttft_p95_ms",
    "long_e2e_p95_ms",
    "short_e2e_p95_ms",
    "short_tpot_p50_ms",
    "output_tokens_per_s",
)
WARMUP_SEED_OFFSET = 100_000


class BenchError(RuntimeError):
    """A problem with the benchmark set-up (reported as a clear error, exit status 2)."""


@dataclass
class ProtocolSettings:
    """How many rounds, and what counts as a disturbed round."""

    warmup: int = 1
    reps: int = 3
    rotate: bool = True
    payload_seed: int = 0
    timeout_s: float = 600.0
    lateness_limit_ms: float = 10.0
    throughput_drop: float = 0.25  # a run below (1 - drop) x its policy's median throughput is disturbed
    allow_errors: int = 0  # failed requests a run may have before its round counts as disturbed
    baseline: str = "default"
    pairs: Sequence[tuple[str, str]] = ()
    exclude_rounds: Sequence[int] = ()
    bootstrap_samples: int = DEFAULT_BOOTSTRAP_SAMPLES
    bootstrap_seed: int = 0
    wake_before_run: bool = True  # one tiny unmeasured request to the server right before each run

    def payload_seed_for(self, phase: str, round_index: int) -> int:
        offset = WARMUP_SEED_OFFSET if phase == "warmup" else 0
        return self.payload_seed + offset + round_index


def round_order(policies: Sequence[str], round_index: int, rotate: bool = True) -> list[str]:
    """Policies in the order they run in a round: rotated by one per round (a balanced Latin square
    for as many rounds as policies)."""
    if not rotate or not policies:
        return list(policies)
    shift = round_index % len(policies)
    return [*policies[shift:], *policies[:shift]]


def run_id(phase: str, round_index: int, policy: str, warmup_index: int | None = None) -> str:
    suffix = "" if warmup_index is None else f"-{warmup_index}"
    return f"{phase}{round_index:02d}{suffix}-{policy}"


def workload_fingerprint(workload: Workload) -> str:
    """A hash of the schedule: runs from different invocations pair up only on identical schedules."""
    digest = hashlib.sha256()
    for spec in workload.requests:
        digest.update(f"{spec.request_id},{spec.arrival_s!r},{spec.prompt_tokens},{spec.output_tokens},"
                      f"{spec.klass};".encode())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------
# Metrics of one run


def vllm_style_metrics(records: Sequence[RequestRecord], duration_s: float | None = None) -> dict[str, Any]:
    """The run summary under the key names ``vllm bench serve`` uses (times in ms).

    Same meanings: ``completed``/``failed`` requests, token totals of completed requests, throughputs
    over the run's duration, and mean/median/std/P95/P99 of TTFT, TPOT, ITL and E2E latency (``e2el``).
    """
    done = [r for r in records if r.ok]
    if duration_s is None:
        duration_s = summarize(records)["duration_s"]
    total_input = sum(r.prompt_tokens for r in done)
    total_output = sum(r.output_tokens for r in done)
    per_second = (lambda x: x / duration_s) if duration_s else (lambda x: None)
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_second(len(done)),
        "output_throughput": per_second(total_output),
        "total_token_throughput": per_second(total_input + total_output),
        "max_concurrent_requests": _max_concurrency(done),
    }
    series = {
        "ttft": [r.ttft_s * 1000.0 for r in done if r.ttft_s is not None],
        "tpot": [t * 1000.0 for t in (tpot_s(r) for r in done) if t is not None],
        "itl": [gap * 1000.0 for r in done for gap in r.itl_s],
        "e2el": [r.e2e_s * 1000.0 for r in done if r.e2e_s is not None],
    }
    for name, values in series.items():
        result[f"mean_{name}_ms"] = statistics.fmean(values) if values else None
        result[f"median_{name}_ms"] = percentile(values, 50)
        result[f"std_{name}_ms"] = statistics.pstdev(values) if values else None
        result[f"p95_{name}_ms"] = percentile(values, 95)
        result[f"p99_{name}_ms"] = percentile(values, 99)
    return result


def _max_concurrency(records: Sequence[RequestRecord]) -> int:
    events = sorted([(r.sent_at, 1) for r in records] + [(r.sent_at + (r.e2e_s or 0.0), -1) for r in records],
                    key=lambda item: (item[0], item[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def run_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Everything reported per run: ``summarize()`` keys, ``vllm bench serve`` keys, send lateness."""
    metrics = summarize(records)
    metrics.update(vllm_style_metrics(records, metrics["duration_s"]))
    metrics.update(lateness_summary(records))
    return metrics


# ---------------------------------------------------------------------------------------------------
# The results directory


class ResultsDir:
    """The on-disk layout described in the module docstring."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.header_path = self.root / "bench.json"
        self.runs_path = self.root / "runs.jsonl"
        self.requests_dir = self.root / "requests"
        self.summary_path = self.root / "summary.json"

    def requests_path(self, name: str) -> Path:
        return self.requests_dir / f"{name}.jsonl"

    def read_header(self) -> dict[str, Any] | None:
        if not self.header_path.exists():
            return None
        return json.loads(self.header_path.read_text())

    def write_header(self, header: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.header_path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(header, indent=2) + "\n")
        temporary.replace(self.header_path)

    def read_runs(self) -> list[dict[str, Any]]:
        if not self.runs_path.exists():
            return []
        runs = []
        for line in self.runs_path.read_text().splitlines():
            if line.strip():
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash
        return runs

    def append_run(self, info: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with self.runs_path.open("a") as handle:
            handle.write(json.dumps(info, separators=(",", ":")) + "\n")
            handle.flush()

    def read_records(self, name: str) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
        """The records of one run and their raw lines (lines cut short by a crash are skipped)."""
        path = self.requests_path(name)
        records: list[RequestRecord] = []
        raw: list[dict[str, Any]] = []
        if not path.exists():
            return records, raw
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
                records.append(RequestRecord.from_dict(data))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            raw.append(data)
        return records, raw

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.summary_path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
        temporary.replace(self.summary_path)


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ---------------------------------------------------------------------------------------------------
# Running


class Reporter:
    """Hooks for showing progress; the default shows nothing."""

    def status(self, message: str) -> None:
        """A line of news (server started, round disturbed, ...)."""

    def run_started(self, name: str, total: int) -> None:
        """A run of ``total`` requests begins."""

    def run_progress(self, finished: int, total: int) -> None:
        """``finished`` of ``total`` requests of the current run are done."""

    def run_finished(self, name: str, info: dict[str, Any]) -> None:
        """The run ended; ``info`` is its runs.jsonl line."""


@dataclass
class Invocation:
    """One ``prefillq bench`` call: what it runs and where."""

    workload: Workload
    policies: list[str]
    targets: Targets
    make_payloads: Callable[[int, str], list[Payload]]  # (payload seed, server URL) -> payloads
    results: ResultsDir
    settings: ProtocolSettings = field(default_factory=ProtocolSettings)
    payload_description: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    api_key: str | None = None


def planned_runs(policies: Sequence[str], settings: ProtocolSettings, fresh_per_run: bool
                 ) -> list[tuple[str, int, str, int | None]]:
    """(phase, round, policy, warm-up index) in execution order."""
    plan: list[tuple[str, int, str, int | None]] = []
    if not fresh_per_run:
        for round_index in range(settings.warmup):
            plan += [("warmup", round_index, p, None) for p in round_order(policies, round_index, settings.rotate)]
    for round_index in range(settings.reps):
        for policy in round_order(policies, round_index, settings.rotate):
            if fresh_per_run:
                plan += [("warmup", round_index, policy, k) for k in range(settings.warmup)]
            plan.append(("measured", round_index, policy, None))
    return plan


def prepare_results(inv: Invocation) -> None:
    """Write or extend ``bench.json``; refuse to mix schedules or to overwrite runs already saved."""
    fingerprint = workload_fingerprint(inv.workload)
    header = inv.results.read_header()
    invocation = {
        "started_at_unix": time.time(), "command": inv.command, "policies": inv.policies,
        "targets": inv.targets.describe(), "settings": _settings_dict(inv.settings),
        "host": platform.node(), "python": platform.python_version(),
    }
    if header is None:
        header = {
            "tool": "prefillq bench", "scenario": inv.workload.name, "workload": inv.workload.params,
            "requests": len(inv.workload.requests), "workload_fingerprint": fingerprint,
            "payload": inv.payload_description, "payload_seed": inv.settings.payload_seed,
            "schedule": [[s.request_id, s.arrival_s, s.prompt_tokens, s.output_tokens, s.klass]
                         for s in inv.workload.requests],
            "invocations": [],
        }
    else:
        if header.get("workload_fingerprint") != fingerprint:
            raise BenchError(f"{inv.results.root} holds results of a different schedule "
                             f"({header.get('scenario')}, {header.get('requests')} requests); "
                             "use another --out directory")
        if header.get("payload_seed") != inv.settings.payload_seed:
            raise BenchError(f"{inv.results.root} was written with --payload-seed {header.get('payload_seed')}; "
                             "rounds would not pair up, use the same seed or another --out directory")
        existing = {run["run"] for run in inv.results.read_runs()}
        clash = [run_id(phase, r, p, k) for phase, r, p, k in planned_runs(inv.policies, inv.settings,
                                                                             inv.targets.fresh_per_run)
                 if run_id(phase, r, p, k) in existing]
        if clash:
            raise BenchError(f"{inv.results.root} already holds run {clash[0]} (policies "
                             f"{', '.join(sorted({r.split('-', 1)[1] for r in existing}))}); label this "
                             "server differently with --policy-label, or use another --out directory")
    header["invocations"].append(invocation)
    inv.results.write_header(header)


def _settings_dict(settings: ProtocolSettings) -> dict[str, Any]:
    return {"warmup": settings.warmup, "reps": settings.reps, "rotate": settings.rotate,
            "payload_seed": settings.payload_seed, "timeout_s": settings.timeout_s,
            "lateness_limit_ms": settings.lateness_limit_ms, "throughput_drop": settings.throughput_drop,
            "allow_errors": settings.allow_errors, "baseline": settings.baseline,
            "pairs": [list(p) for p in settings.pairs]}


def execute_run(inv: Invocation, url: str, name: str, phase: str, round_index: int, policy: str,
                payloads: list[Payload], reporter: Reporter, position: int) -> dict[str, Any]:
    """Send one run, writing each request as it finishes; returns its runs.jsonl line (also appended).

    On Ctrl-C the in-flight requests are written as interrupted, the run line is appended with
    ``interrupted: true`` and KeyboardInterrupt propagates.
    """
    inv.results.requests_dir.mkdir(parents=True, exist_ok=True)
    path = inv.results.requests_path(name)
    if path.exists():  # left by a run that was killed before it could finish: keep it, out of the way
        path.rename(path.with_name(f"{path.name}.partial-{time.strftime('%Y%m%d-%H%M%S')}"))
    wake_error = None
    if inv.settings.wake_before_run and payloads:
        wake_error = wake_server(url, payloads[0].body, api_key=inv.api_key)
    reporter.run_started(name, len(payloads))
    started = time.time()
    result: RunResult | None = None
    interrupted = False
    with path.open("a") as stream:
        writer = JsonlWriter(stream, {"policy": policy, "phase": phase, "round": round_index, "run": name})
        try:
            result = asyncio.run(run_load(payloads, url, timeout_s=inv.settings.timeout_s, on_record=writer,
                                          api_key=inv.api_key, on_progress=reporter.run_progress))
        except KeyboardInterrupt:
            interrupted = True
    records, _ = inv.results.read_records(name)
    info: dict[str, Any] = {
        "run": name, "policy": policy, "phase": phase, "round": round_index, "position": position, "url": url,
        "started_at_unix": started, "requests": len(payloads), "recorded": len(records),
        "interrupted": interrupted, "server_failed": None, "load_average_1m": _load_average(),
        "prewarmed_connections": result.prewarmed_connections if result else None,
        "wake_up_error": wake_error,
    }
    info["metrics"] = run_metrics(records)
    if interrupted:
        inv.results.append_run(info)
        reporter.run_finished(name, info)
        raise KeyboardInterrupt
    return info


def _load_average() -> float | None:
    """The client machine's 1-minute load average after the run: a busy machine explains odd rounds."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run_protocol(inv: Invocation, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run warm-ups and measured rounds, then analyse; the summary is written even when interrupted
    or when a server dies (which re-raises :class:`ServerFailed` afterwards)."""
    reporter = reporter or Reporter()
    prepare_results(inv)
    payload_cache: dict[int, list[Payload]] = {}

    def payloads_for(phase: str, round_index: int, url: str) -> list[Payload]:
        seed = inv.settings.payload_seed_for(phase, round_index)
        if seed not in payload_cache:
            payload_cache.clear()
            payload_cache[seed] = inv.make_payloads(seed, url)
        return payload_cache[seed]

    failure: BaseException | None = None
    try:
        plan = planned_runs(inv.policies, inv.settings, inv.targets.fresh_per_run)
        positions: dict[tuple[str, int], int] = {}
        for phase, round_index, policy, warmup_index in plan:
            name = run_id(phase, round_index, policy, warmup_index)
            url = inv.targets.open(policy)
            payloads = payloads_for(phase, round_index if warmup_index is None else warmup_index, url)
            position = positions.get((phase, round_index), 0)
            positions[(phase, round_index)] = position + 1
            info = execute_run(inv, url, name, phase, round_index, policy, payloads, reporter, position)
            try:
                inv.targets.check(policy)
            except ServerFailed as exc:
                info["server_failed"] = str(exc)
                inv.results.append_run(info)
                reporter.run_finished(name, info)
                raise
            inv.results.append_run(info)
            reporter.run_finished(name, info)
            if phase == "measured":
                inv.targets.done(policy)
    except (KeyboardInterrupt, ServerFailed) as exc:
        failure = exc
    finally:
        inv.targets.close()
    summary = analyse(inv.results, inv.settings)
    inv.results.write_summary(summary)
    if failure is not None:
        raise failure
    return summary


# ---------------------------------------------------------------------------------------------------
# Analysis


@dataclass
class LoadedRun:
    info: dict[str, Any]
    records: list[RequestRecord]
    metrics: dict[str, Any]


def load_runs(results: ResultsDir) -> list[LoadedRun]:
    """Every run in the directory, with metrics recomputed from its request file.

    A request file without a runs.jsonl line (the process was killed mid-run) is loaded as an
    interrupted run.
    """
    loaded: list[LoadedRun] = []
    seen: set[str] = set()
    for info in results.read_runs():
        if info["run"] in seen:
            continue
        seen.add(info["run"])
        records, _ = results.read_records(info["run"])
        loaded.append(LoadedRun(info=info, records=records, metrics=run_metrics(records)))
    if results.requests_dir.exists():
        for path in sorted(results.requests_dir.glob("*.jsonl")):
            name = path.stem
            if name in seen:
                continue
            records, raw = results.read_records(name)
            first = raw[0] if raw else {}
            info = {"run": name, "policy": first.get("policy", name.split("-", 1)[-1]),
                    "phase": first.get("phase", "measured"), "round": first.get("round", -1),
                    "interrupted": True, "server_failed": None, "requests": None, "recorded": len(records)}
            loaded.append(LoadedRun(info=info, records=records, metrics=run_metrics(records)))
    return loaded


def disturbed_rounds(runs: Sequence[LoadedRun], policies: Sequence[str], settings: ProtocolSettings
                     ) -> dict[int, list[str]]:
    """Measured round -> reasons it is disturbed (rounds absent from the dict are clean)."""
    measured = [run for run in runs if run.info["phase"] == "measured"]
    rounds = sorted({run.info["round"] for run in measured})
    by_round: dict[int, dict[str, LoadedRun]] = {r: {} for r in rounds}
    for run in measured:
        by_round[run.info["round"]][run.info["policy"]] = run
    throughput_median = {
        policy: median([run.metrics.get("output_tokens_per_s") for run in measured if run.info["policy"] == policy])
        for policy in policies
    }
    reasons: dict[int, list[str]] = {}
    for round_index in rounds:
        found: list[str] = []
        if round_index in settings.exclude_rounds:
            found.append("excluded by the user")
        for policy in policies:
            run = by_round[round_index].get(policy)
            if run is None:
                found.append(f"{policy} did not run")
                continue
            m = run.metrics
            if run.info.get("interrupted"):
                found.append(f"{policy} run was interrupted")
            if run.info.get("server_failed"):
                found.append(f"{policy} server failed")
            if m.get("failed", 0) > settings.allow_errors:
                found.append(f"{policy}: {m['failed']} failed request(s)")
            late = m.get("send_lateness_p99_ms")
            if late is not None and late > settings.lateness_limit_ms:
                found.append(f"{policy}: send lateness P99 {late:.1f} ms > {settings.lateness_limit_ms:g} ms")
            typical = throughput_median.get(policy)
            value = m.get("output_tokens_per_s")
            if typical and value is not None and value < (1.0 - settings.throughput_drop) * typical:
                found.append(f"{policy}: output {value:.1f} tok/s is {100 * (1 - value / typical):.0f}% below "
                             f"its median {typical:.1f}")
        if found:
            reasons[round_index] = found
    return reasons


def policies_in(runs: Sequence[LoadedRun], baseline: str) -> list[str]:
    names: list[str] = []
    for run in runs:
        if run.info["policy"] not in names:
            names.append(run.info["policy"])
    if baseline in names:
        names.remove(baseline)
        names.insert(0, baseline)
    return names


def analyse(results: ResultsDir, settings: ProtocolSettings | None = None) -> dict[str, Any]:
    """The summary of everything in a results directory (what ``summary.json`` holds)."""
    header = results.read_header() or {}
    if settings is None:
        settings = ProtocolSettings()
    runs = load_runs(results)
    policies = policies_in(runs, settings.baseline)
    measured = [run for run in runs if run.info["phase"] == "measured"]
    all_rounds = sorted({run.info["round"] for run in measured})
    disturbed = disturbed_rounds(runs, policies, settings)
    kept = [r for r in all_rounds if r not in disturbed]
    used_disturbed = False
    if not kept and all_rounds:
        # Nothing clean: report every round where all policies ran rather than nothing, and say so.
        complete = [r for r in all_rounds
                    if all(any(run.info["round"] == r and run.info["policy"] == p for run in measured)
                           for p in policies)]
        kept = complete or all_rounds
        used_disturbed = True

    by_key = {(run.info["round"], run.info["policy"]): run for run in measured}
    policy_blocks: dict[str, dict[str, Any]] = {}
    for policy in policies:
        per_round = [by_key[(r, policy)].metrics for r in kept if (r, policy) in by_key]
        if not per_round:
            continue
        keys = [k for k, v in per_round[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
        block: dict[str, Any] = {key: median([m.get(key) for m in per_round]) for key in keys}
        for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
            block[key] = sum(m.get(key) or 0 for m in per_round)  # counts add up over rounds
        block["reps"] = len(per_round)
        policy_blocks[policy] = block

    pairs: list[tuple[str, str]] = []
    if settings.baseline in policies:
        pairs += [(settings.baseline, p) for p in policies if p != settings.baseline]
    for base, treatment in settings.pairs:
        if (base, treatment) not in pairs:
            pairs.append((base, treatment))
    intervals: dict[str, Any] = {}
    for base, treatment in pairs:
        rounds = [r for r in kept if (r, base) in by_key and (r, treatment) in by_key]
        metrics: dict[str, Any] = {}
        for metric in COMPARE_METRICS:
            comparison = compare_paired(
                [by_key[(r, base)].metrics.get(metric) for r in rounds],
                [by_key[(r, treatment)].metrics.get(metric) for r in rounds],
                samples=settings.bootstrap_samples, seed=settings.bootstrap_seed,
            )
            metrics[metric] = None if comparison is None else comparison.to_dict()
        intervals[f"{treatment}_vs_{base}"] = {"baseline": base, "treatment": treatment, "rounds": rounds,
                                               "metrics": metrics}

    round_rows = []
    for r in all_rounds:
        order = sorted((run for run in measured if run.info["round"] == r), key=lambda run: run.info.get("position", 0))
        round_rows.append({"round": r, "order": [run.info["policy"] for run in order],
                           "disturbed": r in disturbed, "reasons": disturbed.get(r, []), "used": r in kept})
    warmups = [run for run in runs if run.info["phase"] == "warmup"]
    return {
        "tool": "prefillq bench",
        "scenario": header.get("scenario"),
        "workload": header.get("workload"),
        "requests_per_run": header.get("requests"),
        "baseline": settings.baseline,
        "settings": _settings_dict(settings),
        "policies": policy_blocks,
        "intervals": intervals,
        "rounds": round_rows,
        "excluded_rounds": sorted(disturbed),
        "used_disturbed_rounds": used_disturbed,
        "warmup_runs": len(warmups),
        "runs": [{**{k: v for k, v in run.info.items() if k != "metrics"}, "metrics": run.metrics} for run in runs],
    }


# ---------------------------------------------------------------------------------------------------
# Simulator vs measurement

SIM_METRICS = (
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "long_ttft_p50_ms",
    "long_ttft_p95_ms",
    "long_e2e_p95_ms",
    "short_tpot_p50_ms",
    "output_tokens_per_s",
)


def workload_from_header(header: dict[str, Any] | None) -> Workload | None:
    """The schedule a results folder was measured on (stored in bench.json)."""
    from prefillq.workload import RequestSpec

    if not header or not header.get("schedule"):
        return None
    requests = [RequestSpec(request_id=str(rid), arrival_s=float(at), prompt_tokens=int(prompt),
                            output_tokens=int(output), klass=str(klass))
                for rid, at, prompt, output, klass in header["schedule"]]
    return Workload(name=str(header.get("scenario") or "bench"), requests=requests,
                    params=dict(header.get("workload") or {}))


def simulated_vs_measured(workload: Workload, summary: dict[str, Any], profile: str, *,
                          budget: int | None = None, configs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate every measured policy on the same schedule; per metric: measured, predicted, error.

    ``error`` is ``predicted / measured - 1``. Labels that are not policy names are skipped.
    """
    from prefillq.config import ConfigError, load_config
    from prefillq.sim import simulate

    result: dict[str, Any] = {"profile": profile, "budget": budget, "policies": {}, "skipped": []}
    for label, measured in summary.get("policies", {}).items():
        config = (configs or {}).get(label)
        if config is None:
            try:
                config = load_config(label)
            except ConfigError:
                result["skipped"].append(label)
                continue
        simulated = simulate(workload, config, profile=profile, budget=budget)
        rows: dict[str, Any] = {}
        for metric in SIM_METRICS:
            real, predicted = measured.get(metric), simulated.summary.get(metric)
            error = predicted / real - 1.0 if real and predicted is not None else None
            rows[metric] = {"measured": real, "predicted": predicted, "error": error}
        result["policies"][label] = rows
    return result
