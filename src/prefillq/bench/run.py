"""Running the measurement protocol of SPEC §6: the round plan, each run, and a whole bench call.

A *round* runs every policy once on the identical schedule and identical payloads (token ids are
seeded per round, so rounds differ from each other but never between policies). Warm-up rounds come
first (full mixed load) and are kept on disk but out of the statistics; then ``reps`` measured rounds,
the order of policies following a Williams design (:func:`round_order`), so no policy always runs
first or last, or always right after the same other policy.

Everything is appended to the results directory (:mod:`prefillq.bench.results`) as it happens; the
summary comes from :mod:`prefillq.bench.analysis`. Progress goes to a :class:`Reporter`; nothing here
prints.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefillq.bench.analysis import ProtocolSettings, run_metrics
from prefillq.bench.client import JsonlWriter, RunResult, check_server, fit_text_prompts, run_load, wake_server
from prefillq.bench.launch import ServerFailed, Targets
from prefillq.bench.payload import Payload, PayloadOptions, build_payload
from prefillq.bench.pinning import client_cpus
from prefillq.bench.results import BenchError, ResultsDir, analyse, file_label, workload_fingerprint, writing
from prefillq.workload import Workload

PlannedRun = tuple[str, int, str, int | None]  # (phase, round, policy, warm-up index)


def williams_rows(count: int) -> list[list[int]]:
    """A Williams design for ``count`` treatments: rows in which every treatment directly precedes
    every other one equally often (``count`` rows when even; for an odd count two squares, the second
    the first one mirrored, ``2 * count`` rows). Each treatment also takes every position equally often.
    """
    if count < 1:
        return []
    first = [0]  # 0, 1, n-1, 2, n-2, ...: the differences of neighbours run through every non-zero residue
    low, high = 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    square = [[(value + shift) % count for value in first] for shift in range(count)]
    if count % 2:
        square += [row[::-1] for row in square]
    return square


def round_order(policies: Sequence[str], round_index: int, rotate: bool = True) -> list[str]:
    """Policies in the order they run in a round: row ``round_index`` of a Williams design, so over
    a full cycle (as many rounds as policies, twice that for an odd number) each policy runs in each
    position, and directly before each other policy, equally often. Round 0 keeps the given order."""
    if not rotate or not policies:
        return list(policies)
    rows = williams_rows(len(policies))
    name = {treatment: policies[j] for j, treatment in enumerate(rows[0])}  # relabelled: row 0 is the given order
    return [name[treatment] for treatment in rows[round_index % len(rows)]]


def run_id(phase: str, round_index: int, policy: str, warmup_index: int | None = None,
           machine: str | None = None) -> str:
    """``measured03-hrrn``; ``warmup00-1-hrrn`` (a fresh server's second warm-up); ``...@MACHINE`` when
    the run is labelled with the machine it ran on (folders merged from several machines stay apart).
    The policy label appears in its file-name form (:func:`~prefillq.bench.results.file_label`:
    ``measured02-hrrn_partial_prefills=ordered``); the run's records keep the label itself."""
    suffix = "" if warmup_index is None else f"-{warmup_index}"
    where = "" if machine is None else f"@{machine}"
    return f"{phase}{round_index:02d}{suffix}-{file_label(policy)}{where}"


def planned_runs(policies: Sequence[str], settings: ProtocolSettings, fresh_per_run: bool) -> list[PlannedRun]:
    """(phase, round, policy, warm-up index) in execution order."""
    plan: list[PlannedRun] = []
    if not fresh_per_run:
        for round_index in range(settings.warmup):
            plan += [("warmup", round_index, p, None) for p in round_order(policies, round_index, settings.rotate)]
    for round_index in range(settings.reps):
        for policy in round_order(policies, round_index, settings.rotate):
            if fresh_per_run:
                plan += [("warmup", round_index, policy, k) for k in range(settings.warmup)]
            plan.append(("measured", round_index, policy, None))
    return plan


class Reporter:
    """Hooks for showing progress; the default shows nothing."""

    def status(self, message: str) -> None:
        """A line of news (server started, round disturbed, ...)."""

    def planned(self, runs: int) -> None:
        """The servers answer; ``runs`` runs (warm-ups included) are about to start."""

    def text_prompts_approximate(self) -> None:
        """Text prompts could not be fitted with ``/tokenize`` (said once per bench call)."""

    def run_started(self, name: str, total: int) -> None:
        """A run of ``total`` requests begins."""

    def run_progress(self, finished: int, total: int) -> None:
        """``finished`` of ``total`` requests of the current run are done."""

    def run_finished(self, name: str, info: dict[str, Any]) -> None:
        """The run ended; ``info`` is its runs.jsonl line."""


@dataclass
class Invocation:
    """One protocol run: what it runs and where."""

    workload: Workload
    policies: list[str]
    targets: Targets
    make_payloads: Callable[[int, str], list[Payload]]  # (payload seed, server URL) -> payloads
    results: ResultsDir
    settings: ProtocolSettings = field(default_factory=ProtocolSettings)
    payload_description: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    api_key: str | None = None
    machine: str | None = None  # the label of the machine the servers run on, recorded in every run


def prepare_results(inv: Invocation) -> None:
    """Write or extend ``bench.json``; refuse to mix schedules or to overwrite runs already saved."""
    fingerprint = workload_fingerprint(inv.workload)
    header = inv.results.read_header()
    invocation = {
        "started_at_unix": time.time(), "command": inv.command, "policies": inv.policies,
        "targets": inv.targets.describe(), "settings": inv.settings.to_dict(),
        "host": platform.node(), "python": platform.python_version(), "client_cpus": client_cpus(),
    }
    if inv.machine is not None:
        invocation["machine"] = inv.machine
    if header is None:
        header = {
            "tool": "prefillq bench", "scenario": inv.workload.name, "workload": inv.workload.params,
            "requests": len(inv.workload.requests), "workload_fingerprint": fingerprint,
            "payload": inv.payload_description, "payload_seed": inv.settings.payload_seed,
            "schedule": schedule_entries(inv.workload),
            "invocations": [],
        }
    else:
        _check_extension(inv, header)
    header["invocations"].append(invocation)
    inv.results.write_header(header)


def schedule_entries(workload: Workload) -> list[list[Any]]:
    """bench.json's schedule: ``[id, arrival_s, prompt, output, short/long]`` per request, and the request's
    priority class as a sixth item when the workload has classes (some request not at 0)."""
    classes = any(spec.priority for spec in workload.requests)
    return [[s.request_id, s.arrival_s, s.prompt_tokens, s.output_tokens, s.klass, *([s.priority] if classes else [])]
            for s in workload.requests]


def _check_extension(inv: Invocation, header: dict[str, Any]) -> None:
    """BenchError when ``inv`` cannot add its runs to a folder that already has ``header``."""
    if header.get("workload_fingerprint") != workload_fingerprint(inv.workload):
        raise BenchError(f"{inv.results.root} holds results of a different schedule "
                         f"({header.get('scenario')}, {header.get('requests')} requests); "
                         "use another --out directory")
    if header.get("payload_seed") != inv.settings.payload_seed:
        raise BenchError(f"{inv.results.root} was written with --payload-seed {header.get('payload_seed')}; "
                         "rounds would not pair up, use the same seed or another --out directory")
    measured_as = {(item.get("settings") or {}).get("measure", "prefillq")
                   for item in header.get("invocations") or [] if isinstance(item, dict)}
    if measured_as - {inv.settings.measure}:
        raise BenchError(f"{inv.results.root} was measured with --measure {sorted(measured_as)[0]}; the two "
                         "definitions do not pair up, use the same --measure or another --out directory")
    runs = inv.results.read_runs()
    existing = {run["run"] for run in runs}
    planned = [run_id(*run, machine=inv.machine)
               for run in planned_runs(inv.policies, inv.settings, inv.targets.fresh_per_run)]
    clash = [name for name in planned if name in existing]
    if clash:
        raise BenchError(f"{inv.results.root} already holds run {clash[0]} (policies "
                         f"{', '.join(sorted({str(run.get('policy')) for run in runs}))}); label this "
                         "server differently with --policy-label (or its machine with --machine), or use "
                         "another --out directory")


def execute_run(inv: Invocation, url: str, name: str, phase: str, round_index: int, policy: str,
                payloads: list[Payload], reporter: Reporter, position: int) -> dict[str, Any]:
    """Send one run, writing each request as it finishes; returns its runs.jsonl line.

    On Ctrl-C the in-flight requests are written as interrupted, the run line is appended with
    ``interrupted: true`` and KeyboardInterrupt propagates.
    """
    path = inv.results.requests_path(name)
    with writing(path):
        inv.results.requests_dir.mkdir(parents=True, exist_ok=True)
        if path.exists():  # left by a run that was killed before it could finish: keep it, out of the way
            path.rename(path.with_name(f"{path.name}.partial-{time.strftime('%Y%m%d-%H%M%S')}"))
        stream = path.open("a")
    wake_error = None
    if inv.settings.wake_before_run and payloads:
        wake_error = wake_server(url, payloads[0].body, api_key=inv.api_key)
    reporter.run_started(name, len(payloads))
    started = time.time()
    result: RunResult | None = None
    interrupted = False
    labels: dict[str, Any] = {"policy": policy, "phase": phase, "round": round_index, "run": name}
    if inv.machine is not None:
        labels["machine"] = inv.machine
    with stream:
        writer = JsonlWriter(stream, labels)
        try:
            result = asyncio.run(run_load(payloads, url, timeout_s=inv.settings.timeout_s, on_record=writer,
                                          api_key=inv.api_key, on_progress=reporter.run_progress,
                                          measure=inv.settings.measure))
        except KeyboardInterrupt:
            interrupted = True
    records, _ = inv.results.read_records(name)
    info: dict[str, Any] = {
        "run": name, "policy": policy, "phase": phase, "round": round_index, "position": position, "url": url,
        "started_at_unix": started, "requests": len(payloads), "recorded": len(records),
        "interrupted": interrupted, "server_failed": None, "load_average_1m": _load_average(),
        "prewarmed_connections": result.prewarmed_connections if result else None,
        "wake_up_error": wake_error, "measure": inv.settings.measure,
    }
    if inv.machine is not None:
        info["machine"] = inv.machine
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


class _PayloadCache:
    """The payloads of the latest payload seed (every policy of a round sends the same ones)."""

    def __init__(self, inv: Invocation) -> None:
        self.inv = inv
        self.seed: int | None = None
        self.payloads: list[Payload] = []

    def get(self, phase: str, round_index: int, url: str) -> list[Payload]:
        seed = self.inv.settings.payload_seed_for(phase, round_index)
        if seed != self.seed:
            self.payloads = self.inv.make_payloads(seed, url)
            self.seed = seed
        return self.payloads


def _run_plan(inv: Invocation, reporter: Reporter) -> None:
    payloads = _PayloadCache(inv)
    positions: dict[tuple[str, int], int] = {}
    for phase, round_index, policy, warmup_index in planned_runs(inv.policies, inv.settings,
                                                                 inv.targets.fresh_per_run):
        name = run_id(phase, round_index, policy, warmup_index, machine=inv.machine)
        url = inv.targets.open(policy)
        batch = payloads.get(phase, round_index if warmup_index is None else warmup_index, url)
        position = positions.get((phase, round_index), 0)
        positions[(phase, round_index)] = position + 1
        info = execute_run(inv, url, name, phase, round_index, policy, batch, reporter, position)
        try:
            inv.targets.check(policy)
        except ServerFailed as exc:
            info["server_failed"] = str(exc)
            raise
        finally:
            inv.results.append_run(info)
            reporter.run_finished(name, info)
        if phase == "measured":
            inv.targets.done(policy)


def run_protocol(inv: Invocation, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run warm-ups and measured rounds, then analyse; the summary is written even when interrupted
    or when a server dies (which re-raises :class:`ServerFailed` afterwards)."""
    reporter = reporter or Reporter()
    prepare_results(inv)
    failure: BaseException | None = None
    try:
        _run_plan(inv, reporter)
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
# A whole ``prefillq bench`` call


@dataclass
class BenchSetup:
    """One bench call, parsed and checked: what runs where, and what goes into the request bodies."""

    workload: Workload
    policies: list[str]
    targets: Targets
    results: ResultsDir
    settings: ProtocolSettings = field(default_factory=ProtocolSettings)
    model: str | None = None  # the model to ask the servers for (None: the first one each lists)
    vocab_size: int = 1000
    text_prompts: bool = False
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    forward_priority: bool = False
    api_key: str | None = None
    command: str = ""
    machine: str | None = None


@dataclass
class BenchOutcome:
    """How a bench call ended: its summary (None when nothing was analysed) and what stopped it."""

    summary: dict[str, Any] | None
    server_failed: str | None = None  # a launched server died; the message ends with its log tail
    interrupted: bool = False


def preflight(setup: BenchSetup) -> str | None:
    """Start the servers kept for the whole protocol and check they answer; returns the model name.

    Raises ``ServerUnreachable`` or :class:`ServerFailed`.
    """
    targets = setup.targets
    if targets.fresh_per_run:  # only the first server is up now; the others start as their runs come
        first = planned_runs(setup.policies, setup.settings, fresh_per_run=True)[0][2]
        return check_server(targets.open(first), model=setup.model, api_key=setup.api_key)
    targets.start_all()
    served: str | None = None
    for label in setup.policies:
        name = check_server(targets.open(label), model=setup.model, api_key=setup.api_key)
        served = served or name
    return served


class PayloadFactory:
    """(payload seed, server URL) -> the payloads of one run, fitting text prompts when asked."""

    def __init__(self, setup: BenchSetup, options: PayloadOptions, reporter: Reporter) -> None:
        self.setup = setup
        self.options = options
        self.reporter = reporter
        self.warned = False

    def __call__(self, round_seed: int, url: str) -> list[Payload]:
        specs = self.setup.workload.requests
        texts: dict[str, str] = {}
        if self.options.text_prompts:
            texts, exact = fit_text_prompts(url, self.options, specs, round_seed, api_key=self.setup.api_key)
            if not exact and not self.warned:
                self.warned = True
                self.reporter.text_prompts_approximate()
        return [build_payload(spec, self.options, round_seed, text=texts.get(spec.request_id)) for spec in specs]


def payload_description(setup: BenchSetup, options: PayloadOptions) -> dict[str, Any]:
    """What bench.json records about the request bodies."""
    extra = {k: v for k, v in setup.extra_body.items() if k != "priority" or setup.forward_priority}
    return {"model": options.model, "vocab_size": setup.vocab_size, "text_prompts": setup.text_prompts,
            "ignore_eos": setup.ignore_eos, "extra_body": extra}


def run_bench(setup: BenchSetup, reporter: Reporter | None = None) -> BenchOutcome:
    """Bring the servers up, check them, run the protocol; servers are always stopped afterwards.

    Raises (after stopping the servers) ``ServerUnreachable``/:class:`ServerFailed`/KeyboardInterrupt
    when nothing could be measured, :class:`BenchError` for a set-up problem; a server dying or Ctrl-C
    during the protocol ends it early with the summary of what finished.
    """
    reporter = reporter or Reporter()
    try:
        served = preflight(setup)
    except BaseException:
        setup.targets.close()
        raise
    try:
        options = PayloadOptions(model=served or "", vocab_size=setup.vocab_size, text_prompts=setup.text_prompts,
                                 ignore_eos=setup.ignore_eos, extra_body=setup.extra_body,
                                 forward_priority=setup.forward_priority)
    except ValueError as exc:
        setup.targets.close()
        raise BenchError(str(exc)) from None
    invocation = Invocation(
        workload=setup.workload, policies=setup.policies, targets=setup.targets,
        make_payloads=PayloadFactory(setup, options, reporter), results=setup.results, settings=setup.settings,
        payload_description=payload_description(setup, options), command=setup.command, api_key=setup.api_key,
        machine=setup.machine,
    )
    reporter.planned(len(planned_runs(setup.policies, setup.settings, setup.targets.fresh_per_run)))
    try:
        return BenchOutcome(run_protocol(invocation, reporter))
    except BenchError:
        setup.targets.close()
        raise
    except ServerFailed as exc:
        outcome = BenchOutcome(None, server_failed=str(exc))
    except KeyboardInterrupt:
        outcome = BenchOutcome(None, interrupted=True)
    outcome.summary = setup.results.read_summary()
    return outcome
