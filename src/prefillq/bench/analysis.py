"""The numbers of SPEC §6, as pure functions of run records: nothing here reads or writes a file.

* per-run metrics: ``summarize()`` keys plus the key names ``vllm bench serve`` uses, and send lateness;
* disturbed rounds: a measured round is *disturbed* when any of its runs sent late (send-lateness P99
  above a limit), had failed requests, lost its server, was interrupted, or produced an output
  throughput far below that policy's median (the signature of a stall such as a JIT compile in the
  middle of a run). Disturbed rounds are excluded for *all* policies, so the pairs stay pairs;
* the summary: per-policy medians over kept rounds and paired comparisons
  (:func:`prefillq.stats.compare_paired`);
* priority classes: when the schedule gives requests a ``priority`` class (a trace's field, a scenario's
  ``interactive_share``), each run's figures per class (``priority_<class>_<figure>`` keys), their medians
  and paired changes like every other metric, and ``priority_classes`` in the summary;
* the simulator's prediction next to the measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefillq.bench.pinning import header_hint
from prefillq.metrics import GOODPUT_KEYS, RequestRecord, median, percentile, summarize, tpot_s, ttft_goodput
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
# Metrics the simulator's prediction is set against.
SIM_METRICS = (
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "long_ttft_p50_ms",
    "long_ttft_p95_ms",
    "long_e2e_p95_ms",
    "short_tpot_p50_ms",
    "output_tokens_per_s",
)
WARMUP_SEED_OFFSET = 100_000
# Figures of each priority class (summarize() keys over that class's requests); the counts add up over rounds.
CLASS_FIGURES = (
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "long_ttft_p50_ms",
    "long_ttft_p95_ms",
    "ttft_p95_ms",
    "short_tpot_p50_ms",
    "output_tokens_per_s",
    "completed",
    "failed",
)
CLASS_COUNTS = ("completed", "failed")
CLASS_COMPARED = tuple(name for name in CLASS_FIGURES if name not in CLASS_COUNTS)  # with paired intervals


@dataclass
class ProtocolSettings:
    """How many rounds, and what counts as a disturbed round."""

    warmup: int = 1
    reps: int = 5  # at 3 rounds even a calibrated small-sample interval is too wide to show much
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
    measure: str = "prefillq"  # the clock definition: "prefillq" or "vllm-bench" (see bench/stream.py)
    ttft_slo: str | None = None  # TTFT SLO text (prefillq.slo): goodput per run, median and paired interval

    def payload_seed_for(self, phase: str, round_index: int) -> int:
        offset = WARMUP_SEED_OFFSET if phase == "warmup" else 0
        return self.payload_seed + offset + round_index

    def to_dict(self) -> dict[str, Any]:
        """The settings as recorded in bench.json and summary.json."""
        return {"warmup": self.warmup, "reps": self.reps, "rotate": self.rotate,
                "payload_seed": self.payload_seed, "timeout_s": self.timeout_s,
                "lateness_limit_ms": self.lateness_limit_ms, "throughput_drop": self.throughput_drop,
                "allow_errors": self.allow_errors, "baseline": self.baseline,
                "pairs": [list(p) for p in self.pairs], "measure": self.measure,
                **({"ttft_slo": self.ttft_slo} if self.ttft_slo else {})}


@dataclass
class LoadedRun:
    """One run: its runs.jsonl line, its request records and the metrics computed from them."""

    info: dict[str, Any]
    records: list[RequestRecord]
    metrics: dict[str, Any]


# ---------------------------------------------------------------------------------------------------
# Metrics of one run


def lateness_summary(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """P50/P99/max send lateness in ms (None without records)."""
    values = [(r.sent_at - r.scheduled_at) * 1000.0 for r in records]
    return {
        "send_lateness_p50_ms": percentile(values, 50),
        "send_lateness_p99_ms": percentile(values, 99),
        "send_lateness_max_ms": max(values) if values else None,
    }


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


def add_run_goodput(runs: Sequence[LoadedRun], slo_text: str | None) -> None:
    """Each run's TTFT-SLO goodput into its metrics (so medians and paired intervals cover it, SPEC §6)."""
    if not slo_text:
        return
    from prefillq.slo import parse_ttft_slo

    slo = parse_ttft_slo(slo_text)
    for run in runs:
        run.metrics.update(ttft_goodput(run.records, slo))


def class_key(priority: int, figure: str) -> str:
    """A per-class figure's key in a run's metrics, e.g. ``priority_0_short_ttft_p95_ms`` (the simulator's
    summaries use the same keys)."""
    return f"priority_{priority}_{figure}"


def request_classes(header: dict[str, Any] | None) -> dict[str, int]:
    """Request id -> priority class, from bench.json's schedule ({} when every request is at 0: no classes).

    A schedule entry is ``[id, arrival, prompt, output, short/long]`` with the class as a sixth item when
    the workload has classes (older folders have five items: no classes)."""
    classes = {str(entry[0]): int(entry[5]) for entry in (header or {}).get("schedule") or []
               if isinstance(entry, list | tuple) and len(entry) > 5 and entry[5] is not None}
    return classes if any(classes.values()) else {}


def add_class_metrics(runs: Sequence[LoadedRun], classes: dict[str, int]) -> list[int]:
    """Each run's figures per priority class into its metrics (``priority_<class>_<figure>``, figures of
    :data:`CLASS_FIGURES`; a class with no request in a run gets None); returns the classes, lowest first.
    Throughput per class is the class's output tokens over the whole run's duration."""
    order = sorted(set(classes.values()))
    for run in runs:
        members: dict[int, list[RequestRecord]] = {c: [] for c in order}
        for record in run.records:
            members.setdefault(classes.get(record.request_id, 0), []).append(record)
        duration = run.metrics.get("duration_s")
        for klass, group in members.items():
            figures = summarize(group) if group else {}
            if figures and duration:
                figures["output_tokens_per_s"] = figures["output_tokens"] / duration
            run.metrics.update({class_key(klass, name): figures.get(name) for name in CLASS_FIGURES})
    return order


def run_metrics(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Everything reported per run: ``summarize()`` keys, ``vllm bench serve`` keys, send lateness."""
    metrics = summarize(records)
    metrics.update(vllm_style_metrics(records, metrics["duration_s"]))
    metrics.update(lateness_summary(records))
    return metrics


# ---------------------------------------------------------------------------------------------------
# Rounds


def _run_problems(policy: str, run: LoadedRun, typical_throughput: float | None,
                  settings: ProtocolSettings) -> list[str]:
    """Why one measured run disturbs its round ([] when it does not)."""
    found: list[str] = []
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
    value = m.get("output_tokens_per_s")
    if typical_throughput and value is not None and value < (1.0 - settings.throughput_drop) * typical_throughput:
        found.append(f"{policy}: output {value:.1f} tok/s is {100 * (1 - value / typical_throughput):.0f}% "
                     f"below its median {typical_throughput:.1f}")
    return found


RoundKey = tuple[str | None, int]  # (machine label or None, round index): the unit that pairs up


def round_key(run: LoadedRun) -> RoundKey:
    """The round a run belongs to; rounds of different machines are different rounds."""
    return run.info.get("machine"), run.info["round"]


def _sorted_keys(keys: Any) -> list[RoundKey]:
    return sorted(keys, key=lambda key: (key[0] is not None, key[0] or "", key[1]))


def disturbed_rounds(runs: Sequence[LoadedRun], policies: Sequence[str], settings: ProtocolSettings
                     ) -> dict[RoundKey, list[str]]:
    """Measured round -> reasons it is disturbed (rounds absent from the dict are clean).

    A run's throughput is set against its policy's median on the same machine.
    """
    measured = [run for run in runs if run.info["phase"] == "measured"]
    by_round: dict[RoundKey, dict[str, LoadedRun]] = {key: {} for key in _sorted_keys({round_key(r) for r in measured})}
    for run in measured:
        by_round[round_key(run)][run.info["policy"]] = run
    throughput_median = {
        (policy, machine): median([run.metrics.get("output_tokens_per_s") for run in measured
                                   if run.info["policy"] == policy and run.info.get("machine") == machine])
        for policy in policies for machine in {run.info.get("machine") for run in measured}
    }
    reasons: dict[RoundKey, list[str]] = {}
    for key, round_runs in by_round.items():
        found: list[str] = []
        if key[1] in settings.exclude_rounds:
            found.append("excluded by the user")
        for policy in policies:
            run = round_runs.get(policy)
            if run is None:
                found.append(f"{policy} did not run")
                continue
            found += _run_problems(policy, run, throughput_median.get((policy, key[0])), settings)
        if found:
            reasons[key] = found
    return reasons


def policies_in(runs: Sequence[LoadedRun], baseline: str) -> list[str]:
    """The policy labels of ``runs`` in first-seen order, the baseline first."""
    names: list[str] = []
    for run in runs:
        if run.info["policy"] not in names:
            names.append(run.info["policy"])
    if baseline in names:
        names.remove(baseline)
        names.insert(0, baseline)
    return names


def kept_rounds(measured: Sequence[LoadedRun], policies: Sequence[str], disturbed: dict[RoundKey, list[str]],
                exclude_rounds: Sequence[int] = ()) -> tuple[list[RoundKey], bool]:
    """The rounds the statistics use, and whether they are disturbed ones.

    When no round is clean, every round where all policies ran is used rather than nothing (and the
    summary says so); rounds the user excluded are never used.
    """
    all_rounds = [key for key in _sorted_keys({round_key(run) for run in measured}) if key[1] not in exclude_rounds]
    kept = [key for key in all_rounds if key not in disturbed]
    if kept or not all_rounds:
        return kept, False
    ran = {(round_key(run), run.info["policy"]) for run in measured}
    complete = [key for key in all_rounds if all((key, p) in ran for p in policies)]
    return complete or all_rounds, True


def summary_warnings(measured: Sequence[LoadedRun], kept: Sequence[RoundKey], used_disturbed: bool,
                     disturbed: dict[RoundKey, list[str]], cpu_hint: str | None = None) -> list[str]:
    """One-line warnings for a summary whose figures are missing or suspect. ``cpu_hint``
    (:func:`prefillq.bench.pinning.sharing_hint`): when the client shares CPUs with the server, what to
    do about it, said in the warning about rounds that were sent late."""
    if not measured:
        return ["no measured run finished: there are no figures to report"]
    if not kept:
        return ["every measured round was excluded by the user: there are no figures to report"]
    late = [key for key, found in disturbed.items() if any("send lateness" in reason for reason in found)]
    fix = f"; {cpu_hint}" if late and cpu_hint else ""
    if used_disturbed:
        reasons = sorted({reason.split(":", 1)[-1].strip() for found in disturbed.values() for reason in found})
        return [f"every measured round ({len(kept)}) was disturbed (e.g. {reasons[0]}): the figures use them "
                f"anyway and deserve suspicion{fix}"]
    if fix:
        rounds = len({key for key in disturbed} | set(kept))
        return [f"{len(late)} of {rounds} measured rounds were sent late and are excluded{fix}"]
    return []


# ---------------------------------------------------------------------------------------------------
# The summary


def policy_block(per_round: Sequence[dict[str, Any]], classes: Sequence[int] = ()) -> dict[str, Any]:
    """One policy's figures: the median over rounds of every numeric metric; counts add up (per priority
    class too)."""
    keys = [k for k, v in per_round[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    keys += [key for c in classes for name in CLASS_FIGURES if (key := class_key(c, name)) not in keys]
    block: dict[str, Any] = {key: median([m.get(key) for m in per_round]) for key in keys}
    counts = ["completed", "failed", "total_input_tokens", "total_output_tokens"]
    counts += [class_key(c, name) for c in classes for name in CLASS_COUNTS]
    for key in counts:
        block[key] = sum(m.get(key) or 0 for m in per_round)
    block["reps"] = len(per_round)
    return block


def comparison_pairs(policies: Sequence[str], settings: ProtocolSettings) -> list[tuple[str, str]]:
    """(baseline, treatment) pairs: every policy against the baseline, then the extra ``pairs``."""
    pairs: list[tuple[str, str]] = []
    if settings.baseline in policies:
        pairs += [(settings.baseline, p) for p in policies if p != settings.baseline]
    for base, treatment in settings.pairs:
        if (base, treatment) not in pairs:
            pairs.append((base, treatment))
    return pairs


def comparison_dict(comparison: Any) -> dict[str, Any]:
    """A paired comparison as JSON, always with its ``p_value`` and ``method`` (None when unknown)."""
    data = comparison.to_dict()
    data["p_value"] = getattr(comparison, "p_value", None)
    data["method"] = getattr(comparison, "method", None)
    return data


def paired_block(by_key: dict[tuple[RoundKey, str], LoadedRun], kept: Sequence[RoundKey], base: str,
                 treatment: str, settings: ProtocolSettings, labelled: bool,
                 classes: Sequence[int] = ()) -> dict[str, Any]:
    """``treatment`` vs ``base`` on every compared metric (and each priority class's figures), over the
    kept rounds both ran.

    With machine labels the rounds are grouped by machine, so machine-to-machine spread counts.
    """
    rounds = [key for key in kept if (key, base) in by_key and (key, treatment) in by_key]
    groups = [machine for machine, _ in rounds] if labelled else None
    metrics: dict[str, Any] = {}
    per_class = tuple(class_key(c, name) for c in classes for name in CLASS_COMPARED)
    for metric in COMPARE_METRICS + (GOODPUT_KEYS if settings.ttft_slo else ()) + per_class:
        comparison = compare_paired(
            [by_key[(key, base)].metrics.get(metric) for key in rounds],
            [by_key[(key, treatment)].metrics.get(metric) for key in rounds],
            groups=groups, samples=settings.bootstrap_samples, seed=settings.bootstrap_seed,
        )
        metrics[metric] = None if comparison is None else comparison_dict(comparison)
    return {"baseline": base, "treatment": treatment, "rounds": [_round_label(key, labelled) for key in rounds],
            "metrics": metrics}


def _round_label(key: RoundKey, labelled: bool) -> Any:
    """A round in summary.json: its index, or ``[machine, index]`` when runs carry machine labels."""
    return [key[0], key[1]] if labelled else key[1]


def summarize_runs(runs: Sequence[LoadedRun], settings: ProtocolSettings,
                   header: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of a set of runs (what ``summary.json`` holds); ``header`` is bench.json's content."""
    header = header or {}
    add_run_goodput(runs, settings.ttft_slo)
    by_request = request_classes(header)
    classes = add_class_metrics(runs, by_request) if by_request else []
    policies = policies_in(runs, settings.baseline)
    measured = [run for run in runs if run.info["phase"] == "measured"]
    labelled = any(run.info.get("machine") is not None for run in measured)
    all_rounds = _sorted_keys({round_key(run) for run in measured})
    disturbed = disturbed_rounds(runs, policies, settings)
    kept, used_disturbed = kept_rounds(measured, policies, disturbed, settings.exclude_rounds)

    by_key = {(round_key(run), run.info["policy"]): run for run in measured}
    policy_blocks: dict[str, dict[str, Any]] = {}
    for policy in policies:
        per_round = [by_key[(key, policy)].metrics for key in kept if (key, policy) in by_key]
        if per_round:
            policy_blocks[policy] = policy_block(per_round, classes)
    intervals = {f"{treatment}_vs_{base}": paired_block(by_key, kept, base, treatment, settings, labelled, classes)
                 for base, treatment in comparison_pairs(policies, settings)}

    round_rows = []
    for key in all_rounds:
        order = sorted((run for run in measured if round_key(run) == key), key=lambda run: run.info.get("position", 0))
        row = {"round": key[1], "order": [run.info["policy"] for run in order], "disturbed": key in disturbed,
               "reasons": disturbed.get(key, []), "used": key in kept}
        if labelled:
            row["machine"] = key[0]
        round_rows.append(row)
    return {
        "tool": "prefillq bench",
        "scenario": header.get("scenario"),
        "workload": header.get("workload"),
        "requests_per_run": header.get("requests"),
        "baseline": settings.baseline,
        "settings": settings.to_dict(),
        "policies": policy_blocks,
        "intervals": intervals,
        "rounds": round_rows,
        "excluded_rounds": [_round_label(key, labelled) for key in _sorted_keys(disturbed)],
        "used_disturbed_rounds": used_disturbed,
        "all_rounds_disturbed": bool(measured) and len(disturbed) == len(all_rounds),
        "warnings": summary_warnings(measured, kept, used_disturbed, disturbed, header_hint(header)),
        "warmup_runs": sum(1 for run in runs if run.info["phase"] == "warmup"),
        **({"priority_classes": class_summary(policy_blocks, classes)} if classes else {}),
        "runs": [{**{k: v for k, v in run.info.items() if k != "metrics"}, "metrics": run.metrics} for run in runs],
    }


def class_summary(policy_blocks: dict[str, dict[str, Any]], classes: Sequence[int]) -> dict[str, Any]:
    """The per-class figures of every policy (``by_row``: policy -> class -> figure -> median over the kept
    rounds; counts add up), in the shape ``prefillq compare`` gives its ``priority_classes``."""
    return {"classes": list(classes), "figures": list(CLASS_FIGURES),
            "by_row": {policy: {str(c): {name: block.get(class_key(c, name)) for name in CLASS_FIGURES}
                                for c in classes} for policy, block in policy_blocks.items()}}


# ---------------------------------------------------------------------------------------------------
# Simulator vs measurement


def prediction_errors(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """Per metric: measured, predicted and ``error = predicted / measured - 1`` (None when undefined)."""
    rows: dict[str, Any] = {}
    for metric in SIM_METRICS:
        real, guess = measured.get(metric), predicted.get(metric)
        error = guess / real - 1.0 if real and guess is not None else None
        rows[metric] = {"measured": real, "predicted": guess, "error": error}
    return rows


def simulated_vs_measured(workload: Workload, summary: dict[str, Any], profile: str, *,
                          budget: int | None = None, configs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate every measured policy on the same schedule; per metric: measured, predicted, error.

    Labels that are not policy names (and have no config in ``configs``) are skipped; the ``stock`` row
    (vLLM's own scheduler) is simulated as ``default``, the arrival order stock vLLM keeps.
    """
    from prefillq.config import ConfigError, load_config
    from prefillq.sim import simulate

    result: dict[str, Any] = {"profile": profile, "budget": budget, "policies": {}, "skipped": []}
    for label, measured in summary.get("policies", {}).items():
        config = (configs or {}).get(label)
        if config is None:
            try:
                config = load_config("default" if label == "stock" else label)
            except ConfigError:
                result["skipped"].append(label)
                continue
        simulated = simulate(workload, config, profile=profile, budget=budget)
        result["policies"][label] = prediction_errors(measured, simulated.summary)
    return result
