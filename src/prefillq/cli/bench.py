"""``prefillq bench`` and ``prefillq report``: the command line around :mod:`prefillq.bench`."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.cli import check_format, parse_set
from prefillq.cli.examples import TRACE_HELP
from prefillq.cli.goodput import TTFT_SLO_HELP, parse_slo


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)
    app.command("report")(report_command)


def _parse_pairs(items: list[str], labels: list[str] | None = None) -> list[tuple[str, str]]:
    """``BASELINE:TREATMENT`` pairs. A label may hold ':' itself (``hrrn:partial_prefills=ordered``): the
    split taken is the one whose two sides are both known labels, else the first ':'."""
    from prefillq.cli import fail

    known = set(labels or [])
    pairs = []
    for item in items:
        splits = [(item[:i].strip(), item[i + 1:].strip()) for i, char in enumerate(item) if char == ":"]
        matching = [split for split in splits if split[0] in known and split[1] in known]
        base, treatment = matching[0] if matching else (splits[0] if splits else ("", ""))
        if not base or not treatment:
            fail(f"--pair expects BASELINE:TREATMENT, got {item!r}")
        pairs.append((base, treatment))
    return pairs


class _RichReporter:
    """Progress bar per run plus one line per finished run, on stderr."""

    def __init__(self, console: Any, intro: str = "{runs} runs") -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.intro = intro
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, auto_refresh=False, transient=True)
        self.task: Any = None

    def status(self, message: str) -> None:
        self.console.print(message)

    def planned(self, runs: int) -> None:
        self.console.print(self.intro.format(runs=runs))

    def text_prompts_approximate(self) -> None:
        self.console.print("[yellow]note:[/yellow] the server has no /tokenize: text prompts are about one "
                           "token per word; server-counted lengths are in server_prompt_tokens")

    def run_started(self, name: str, total: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task(name, total=total)
        self.progress.refresh()

    def run_progress(self, finished: int, total: int) -> None:
        # Called only when no send is due within 20 ms, so drawing never delays a send.
        if self.task is not None:
            self.progress.update(self.task, completed=finished)
            self.progress.refresh()

    def run_finished(self, name: str, info: dict[str, Any]) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.stop()
        m = info.get("metrics", {})
        late = m.get("send_lateness_p99_ms")
        note = " [red]interrupted[/red]" if info.get("interrupted") else ""
        self.console.print(
            f"  {name}: {m.get('completed', 0)} ok, {m.get('failed', 0)} failed; short TTFT p50 "
            f"{_ms(m.get('short_ttft_p50_ms'))}, long TTFT p95 {_ms(m.get('long_ttft_p95_ms'))}; "
            f"send lateness p99 {'-' if late is None else f'{late:.2f} ms'}{note}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so a terminated bench still stops the servers it started and writes
    its summary (a background job started by a non-interactive shell even ignores SIGINT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)  # asyncio.run's own: it cancels the running load cleanly, as Ctrl-C
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def bench_command(
    url: Annotated[list[str] | None, typer.Option("--url", help="A running OpenAI-compatible server (give one "
                                                  "per policy with --policies to compare several).")] = None,
    launch: Annotated[str | None, typer.Option(help="Start the servers ourselves, one per policy: 'vllm' (our "
                                               "scheduler inside vLLM) or 'mock' (the test server).")] = None,
    model: Annotated[str | None, typer.Option(help="--launch vllm: the model folder. --url: the served model "
                                              "name (default: the first the server lists).")] = None,
    policies: Annotated[str | None, typer.Option(help="Comma-separated policies to launch (or the labels of "
                                                 "the --url servers), e.g. stock,default,hrrn. 'stock' (--launch "
                                                 "only): the same server without prefillq's scheduler.")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", metavar="SPEC",
        help="--launch: one more server, configured and labelled by SPEC as given (repeatable), as in "
             "`prefillq compare`: a policy name, NAME:KEY=VALUE[,KEY=VALUE] (e.g. hrrn:partial_prefills=ordered) "
             "or a JSON object. Its config goes into that server's --additional-config; the default list of "
             "--policies is not added when --policy is given.")] = None,
    policy_label: Annotated[str | None, typer.Option(help="With one --url: the name of the policy that server "
                                                     "runs (default: default).")] = None,
    scenario: Annotated[str, typer.Option(help="Named workload (long-first, interleaved, sustained, "
                                          "long-then-stream, overload, low-load).")] = "long-first",
    trace: Annotated[Path | None, typer.Option(help="Replay a trace instead. " + TRACE_HELP)] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario parameter, KEY=VALUE "
                                                   "(repeatable), e.g. --set long_tokens=2048.")] = None,
    rate_scale: Annotated[float, typer.Option(help="--trace: replay this many times faster.")] = 1.0,
    limit: Annotated[int | None, typer.Option(help="--trace: at most this many requests.")] = None,
    seed: Annotated[int, typer.Option(help="Workload seed (arrivals, long/short mix).")] = 0,
    reps: Annotated[int, typer.Option(help="Measured rounds.")] = 5,
    warmup: Annotated[int, typer.Option(help="Warm-up rounds (full load, not measured).")] = 1,
    out: Annotated[Path | None, typer.Option(help="Results folder (default results/bench-<time>). Runs of "
                                             "other invocations there pair up with this one's.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 600.0,
    vocab_size: Annotated[int | None, typer.Option(help="Prompt token ids are drawn below this (default: "
                                                   "the model's vocab size when launching, else 1000).")] = None,
    text_prompts: Annotated[bool, typer.Option(help="Send text prompts (one common word per token, fitted "
                                               "with the server's /tokenize when it has one).")] = False,
    ignore_eos: Annotated[bool, typer.Option(help="Ask for exactly max_tokens output tokens.")] = True,
    measure: Annotated[str, typer.Option(help="Clock definition: 'prefillq' (from the bytes written on an open "
                                         "connection to the bytes of a token read) or 'vllm-bench' (as `vllm "
                                         "bench serve`: from the request being due, connecting on demand, to "
                                         "the event parsed). See docs/bench.md.")] = "prefillq",
    extra_body: Annotated[str | None, typer.Option(help="JSON object merged into every request body. A "
                                                   "'priority' key is dropped unless --forward-priority.")] = None,
    forward_priority: Annotated[bool, typer.Option(help="Operator opt-in: forward a 'priority' extra-body "
                                                   "field as vLLM's request priority.")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="Bearer token, if the server "
                                                "wants one.")] = None,
    payload_seed: Annotated[int, typer.Option(help="Seed of the prompt token ids (per round).")] = 0,
    lateness_limit_ms: Annotated[float, typer.Option(help="A round whose send lateness P99 exceeds this is "
                                                     "disturbed.")] = 10.0,
    throughput_drop: Annotated[float, typer.Option(help="A round whose output tok/s is this fraction below "
                                                   "its policy's median is disturbed.")] = 0.25,
    allow_errors: Annotated[int, typer.Option(help="Failed requests a run may have before its round is "
                                              "disturbed.")] = 0,
    baseline: Annotated[str | None, typer.Option(help="Policy every other one is compared with (default: stock "
                                                 "when it runs, else default).")] = None,
    pair: Annotated[list[str] | None, typer.Option(help="Also compare BASELINE:TREATMENT (repeatable).")] = None,
    exclude_round: Annotated[list[int] | None, typer.Option(help="Exclude this measured round (repeatable).")
                             ] = None,
    rotate: Annotated[bool, typer.Option(help="Vary the policy order between rounds (a Williams design: each "
                                         "policy directly precedes each other equally often).")] = True,
    wake: Annotated[bool, typer.Option(help="Send each server one tiny unmeasured request right before each "
                                       "run (an idle server's first step can be slow).")] = True,
    compare_sim: Annotated[str | None, typer.Option(help="Also simulate the same schedule with this cost-model "
                                                    "profile and print predicted vs measured.")] = None,
    budget: Annotated[int | None, typer.Option(help="Prefill token budget per step: passed to launched vLLM "
                                               "(--max-num-batched-tokens), to the launched mock's simulated "
                                               "engine and to --compare-sim.")] = None,
    servers: Annotated[str, typer.Option(help="--launch: 'all-at-once' (one server per policy, all kept up; "
                                         "needs room for all) or 'one-at-a-time' (a fresh server per run, each "
                                         "with its own warm-up; one accelerator is enough).")] = "all-at-once",
    python: Annotated[str | None, typer.Option(help="--launch vllm: the Python that has vLLM installed.")
                      ] = None,
    server_arg: Annotated[list[str] | None, typer.Option(help="Extra argument for launched servers "
                                                         "(repeatable), e.g. --server-arg=--max-num-seqs=64.")
                          ] = None,
    port: Annotated[int | None, typer.Option(help="--launch: first port (default: free ports).")] = None,
    server_cpus: Annotated[str | None, typer.Option(metavar="LIST", help="--launch: run the servers on these CPUs "
                                                    "(taskset -c LIST, e.g. 0 or 0-2); run the client on others, "
                                                    "e.g. taskset -c 3 prefillq bench ...")] = None,
    startup_timeout: Annotated[float, typer.Option(help="--launch: seconds to wait for a server.")] = 900.0,
    record_steps: Annotated[bool, typer.Option("--record-steps", help="--launch vllm: the plug-in's servers record "
                                               "their steps to OUT/steps, for calibrate --from-bench OUT.")] = False,
    threshold: Annotated[int | None, typer.Option(help="Policy threshold for launched servers.")] = None,
    long_max_wait_ms: Annotated[float | None, typer.Option(help="long_max_wait_ms for launched servers.")
                                ] = None,
    machine: Annotated[str | None, typer.Option(help="A label for the machine the servers run on, recorded in "
                                                "every run: results of several machines merged into one folder "
                                                "are then compared with machines as a level of their own.")
                       ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    fmt: Annotated[str, typer.Option("--format", help="table (fits the terminal), markdown, csv or json (on "
                                     "stdout).")] = "table",
    ttft_slo: Annotated[str | None, typer.Option("--ttft-slo", metavar="SLO", help=TTFT_SLO_HELP
                                                 + " With its paired interval like every other metric.")] = None,
) -> None:
    """Measure policies on a real server: warm-ups, measured rounds, paired intervals."""
    from rich.console import Console

    fmt = check_format(fmt)
    from prefillq.bench.analysis import ProtocolSettings
    from prefillq.bench.client import ServerUnreachable
    from prefillq.bench.launch import ServerFailed, default_baseline
    from prefillq.bench.results import BenchError, ResultsDir
    from prefillq.bench.run import BenchSetup, run_bench
    from prefillq.cli import fail

    console = Console(stderr=True)
    _check_options(urls=list(url or []), launch=launch, servers=servers, reps=reps, warmup=warmup, timeout=timeout,
                   budget=budget, measure=measure, server_cpus=server_cpus)
    if compare_sim:
        _check_profile(compare_sim)
        if budget is None:
            console.print("[yellow]note:[/yellow] without --budget the simulator uses its profile's prefill budget, "
                          "which may differ from the server's max_num_batched_tokens")
    labels, configs = _policy_labels(list(url or []), launch, policies, policy_label, threshold, long_max_wait_ms,
                                     specs=list(policy or []))
    if launch == "vllm" and not model:
        fail("--launch vllm needs --model DIR")
    if record_steps and launch != "vllm":
        fail("--record-steps asks the vLLM servers we launch to record their steps: use it with --launch vllm")
    if machine is not None and (not machine.strip() or any(c in machine for c in "/@\\") or machine != machine.strip()):
        fail(f"--machine must be a non-empty label without '/', '@' or surrounding spaces, got {machine!r}")
    workload = _workload(trace, scenario, set_ or [], rate_scale=rate_scale, limit=limit, seed=seed)
    extra = _extra_body(extra_body, forward_priority, console)

    results_dir = out or Path("results") / time.strftime("bench-%Y%m%d-%H%M%S")
    _check_out(results_dir)
    settings = ProtocolSettings(
        warmup=warmup, reps=reps, rotate=rotate, wake_before_run=wake, payload_seed=payload_seed, timeout_s=timeout,
        lateness_limit_ms=lateness_limit_ms, throughput_drop=throughput_drop, allow_errors=allow_errors,
        baseline=baseline or default_baseline(labels), pairs=_parse_pairs(pair or [], labels),
        exclude_rounds=list(exclude_round or []),
        measure=measure, ttft_slo=str(parse_slo(ttft_slo)) if ttft_slo else None,
    )
    targets, vocab = _targets(list(url or []), labels, launch, configs, model=model, results_dir=results_dir,
                              servers=servers, budget=budget, port=port, python=python, server_arg=server_arg or [],
                              startup_timeout=startup_timeout, vocab_size=vocab_size, console=console,
                              server_cpus=server_cpus,
                              record_steps=str(results_dir.resolve() / "steps") if record_steps else None)
    setup = BenchSetup(workload=workload, policies=labels, targets=targets, results=ResultsDir(results_dir),
                       settings=settings, model=model if not launch else None, vocab_size=vocab,
                       text_prompts=text_prompts, ignore_eos=ignore_eos, extra_body=extra,
                       forward_priority=forward_priority, api_key=api_key,
                       command=shlex.join(["prefillq", *sys.argv[1:]]), machine=machine)
    intro = (f"{workload.name}: {len(workload.requests)} requests per run; {{runs}} runs ({warmup} warm-up, "
             f"{reps} measured rounds) of {', '.join(labels)} -> {results_dir}")

    with _sigterm_as_interrupt():
        try:
            outcome = run_bench(setup, _RichReporter(console, intro))
        except (ServerUnreachable, BenchError) as exc:
            fail(str(exc))
        except ServerFailed as exc:
            console.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        exit_code = 0
        if outcome.server_failed:
            console.print(f"[red]error:[/red] {outcome.server_failed}", soft_wrap=True, highlight=False)
            exit_code = 1
        if outcome.interrupted:
            console.print(f"[yellow]interrupted[/yellow]: everything measured so far is in {results_dir}; "
                          "summary.json covers the runs that finished")
            exit_code = 130
        if outcome.summary is not None:
            _finish(outcome.summary, setup.results, workload, console, compare_sim=compare_sim, budget=budget,
                    configs=configs if launch else None, plots=plots, fmt=fmt)
        if exit_code:
            raise typer.Exit(exit_code)


def _check_options(*, urls: list[str], launch: str | None, servers: str, reps: int, warmup: int, timeout: float,
                   budget: int | None, measure: str, server_cpus: str | None = None) -> None:
    from prefillq.bench.launch import SERVER_MODES
    from prefillq.bench.pinning import server_cpus_problem
    from prefillq.bench.stream import MEASURES
    from prefillq.cli import fail

    if measure not in MEASURES:
        fail(f"--measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if bool(urls) == bool(launch):
        fail("give either --url (a running server) or --launch vllm|mock")
    if launch and launch not in ("vllm", "mock"):
        fail(f"--launch must be 'vllm' or 'mock', got {launch!r}")
    if servers not in SERVER_MODES:
        fail(f"--servers must be one of {', '.join(SERVER_MODES)}, got {servers!r}")
    if reps < 1 or warmup < 0:
        fail("--reps must be >= 1 and --warmup >= 0")
    if not timeout > 0:
        fail("--timeout must be > 0")
    if budget is not None and budget < 1:
        fail(f"--budget must be a positive number of tokens, got {budget}")
    if server_cpus is not None and not launch:
        fail("--server-cpus pins servers we launch: use it with --launch (start your own server under "
             "taskset -c LIST instead)")
    problem = server_cpus_problem(server_cpus) if server_cpus is not None else None
    if problem:
        fail(f"--server-cpus: {problem}")


def _policy_labels(urls: list[str], launch: str | None, policies: str | None, policy_label: str | None,
                   threshold: int | None, long_max_wait_ms: float | None,
                   specs: list[str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """The policy labels, and the configs of the servers we launch ({} for --url).

    ``--policies`` names are labelled by their canonical name and take ``--threshold`` and
    ``--long-max-wait-ms``; each ``--policy`` SPEC is labelled by itself and carries its own settings.
    """
    from prefillq.bench.launch import STOCK, STOCK_NEEDS_LAUNCH
    from prefillq.bench.results import file_label
    from prefillq.cli import fail
    from prefillq.config import ConfigError, load_config, parse_policy_spec

    configs: dict[str, Any] = {}
    specs = specs or []
    if specs and not launch:
        fail("--policy SPEC configures a server we launch: use it with --launch vllm|mock (with --url, "
             "--policies names what each running server does)")
    try:
        if launch:
            default_names = "" if specs else "default,hrrn,short_request_first"
            names = [p.strip() for p in (policies or default_names).split(",") if p.strip()]
            labelled: list[tuple[str, Any]] = []
            for name in names:
                if name == STOCK:
                    labelled.append((STOCK, None))
                    continue
                config = load_config(name)
                if threshold is not None:
                    config = config.with_(threshold=threshold)
                if long_max_wait_ms is not None:
                    config = config.with_(long_max_wait_ms=long_max_wait_ms)
                labelled.append((config.policy, config))
            labelled += [(STOCK, None) if spec.strip() == STOCK else parse_policy_spec(spec) for spec in specs]
            labels = [label for label, _ in labelled]
            configs = dict(labelled)
            safe = [file_label(label) for label in labels]
            if len(set(labels)) == len(labels) and len(set(safe)) != len(safe):
                shared = next(name for name in safe if safe.count(name) > 1)
                clashing = ", ".join(repr(label) for label, name in zip(labels, safe, strict=True) if name == shared)
                fail(f"policy labels {clashing} share the file name {shared!r}; write one of them differently")
        elif policies:
            labels = [p.strip() for p in policies.split(",") if p.strip()]
            if len(labels) != len(urls):
                fail(f"--policies names {len(labels)} policies but {len(urls)} --url were given")
        else:
            if len(urls) > 1:
                fail("several --url need --policies to name the policy each one runs")
            labels = [policy_label or "default"]
    except ConfigError as exc:
        fail(str(exc))
    if STOCK in labels and not launch:
        fail(STOCK_NEEDS_LAUNCH)
    if len(set(labels)) != len(labels):
        fail(f"policies repeat: {', '.join(labels)}")
    return labels, configs


def _workload(trace: Path | None, scenario: str, set_: list[str], *, rate_scale: float, limit: int | None,
              seed: int) -> Any:
    from prefillq.cli import fail
    from prefillq.workload import WorkloadError, load_trace
    from prefillq.workload import scenario as build_scenario

    overrides = parse_set(set_)
    try:
        if trace is not None:
            if overrides:
                fail("--set applies to --scenario, not --trace")
            workload = load_trace(trace, rate_scale=rate_scale, limit=limit)
        else:
            workload = build_scenario(scenario, seed=seed, **overrides)
    except WorkloadError as exc:
        fail(str(exc))
    if not workload.requests:
        fail("the workload has no requests")
    return workload


def _extra_body(extra_body: str | None, forward_priority: bool, console: Any) -> dict[str, Any]:
    from prefillq.cli import fail

    extra: dict[str, Any] = {}
    if extra_body:
        try:
            extra = json.loads(extra_body)
        except json.JSONDecodeError as exc:
            fail(f"--extra-body is not valid JSON: {exc.msg}")
        if not isinstance(extra, dict):
            fail("--extra-body must be a JSON object")
    if "priority" in extra and not forward_priority:
        console.print("[yellow]note:[/yellow] 'priority' in --extra-body is not forwarded: a client cannot set "
                      "the engine's internal priority; pass --forward-priority to send it as vLLM's "
                      "request priority")
    return extra


def _targets(urls: list[str], labels: list[str], launch: str | None, configs: dict[str, Any], *, model: str | None,
             results_dir: Path, servers: str, budget: int | None, port: int | None, python: str | None,
             server_arg: list[str], startup_timeout: float, vocab_size: int | None, console: Any,
             server_cpus: str | None = None, record_steps: str | None = None) -> tuple[Any, int]:
    """Where each policy's requests go, and the vocabulary size prompt ids are drawn below."""
    from prefillq.bench.launch import DEFAULT_VOCAB_SIZE, LaunchedTargets, UrlTargets, model_vocab_size

    if not launch:
        return UrlTargets(dict(zip(labels, urls, strict=True))), vocab_size or DEFAULT_VOCAB_SIZE
    served_model = model or "mock-model"
    extra_server_args = list(server_arg)
    if budget is not None and launch == "vllm":
        extra_server_args += ["--max-num-batched-tokens", str(budget)]
    elif budget is not None:  # the mock's simulated engine takes the same budget
        extra_server_args += ["--engine-limits", json.dumps({"max_num_batched_tokens": budget})]
    targets = LaunchedTargets(launch, configs, model=served_model, log_dir=results_dir / "logs", mode=servers,
                              base_port=port, extra_args=extra_server_args, python=python,
                              ready_timeout_s=startup_timeout, on_status=console.print, server_cpus=server_cpus,
                              record_steps=record_steps)
    vocab = vocab_size or (model_vocab_size(served_model) if launch == "vllm" else None) or DEFAULT_VOCAB_SIZE
    return targets, vocab


def _check_profile(profile: str) -> None:
    from prefillq.cli import fail
    from prefillq.sim.costs import ProfileError, load_profile

    try:
        load_profile(profile)
    except ProfileError as exc:
        fail(f"--compare-sim: {exc}")


def _finish(summary: dict[str, Any], results: Any, workload: Any, console: Any, *, compare_sim: str | None,
            budget: int | None, configs: dict[str, Any] | None, plots: bool, fmt: str = "table") -> None:
    from rich.console import Console

    from prefillq.bench.analysis import request_classes
    from prefillq.bench.results import load_runs
    from prefillq.report.bench import print_sim_comparison, print_summary, write_plots

    if compare_sim:
        from prefillq.bench.analysis import simulated_vs_measured
        from prefillq.cli import fail

        try:
            summary["compare_sim"] = simulated_vs_measured(workload, summary, compare_sim, budget=budget,
                                                           configs=configs)
        except (ValueError, KeyError) as exc:
            fail(f"--compare-sim: {exc}")
        results.write_summary(summary)
    out = Console() if fmt == "table" else Console(stderr=True)
    if fmt == "table":
        print_summary(summary, out)
    else:
        _print_formatted(summary, fmt)
    if compare_sim:
        print_sim_comparison(summary["compare_sim"], out)
    if plots:
        written = write_plots(results.root, load_runs(results), summary, request_classes(results.read_header()))
        if written:
            out.print(f"plots: {', '.join(str(p) for p in written)}")
    from prefillq.report.html import write_html_report
    report = write_html_report(results.root, summary.get("scenario") or "bench", kind="bench", summary=summary)
    out.print(f"report: {report}")
    out.print(f"summary: {results.summary_path}")


def report_command(
    directory: Annotated[Path, typer.Argument(help="A results folder written by prefillq bench.")],
    baseline: Annotated[str | None, typer.Option(help="Policy every other one is compared with (default: the "
                                                 "bench's --baseline if it ran, else stock if it ran, else default).")
                        ] = None,
    pair: Annotated[list[str] | None, typer.Option(help="Also compare BASELINE:TREATMENT (repeatable; default: "
                                                   "the bench's --pair).")] = None,
    lateness_limit_ms: Annotated[float | None, typer.Option(help="Disturbed-round send lateness limit "
                                                            "(default: the one the bench used).")] = None,
    throughput_drop: Annotated[float | None, typer.Option(help="Disturbed-round throughput drop (default: "
                                                          "the bench's).")] = None,
    allow_errors: Annotated[int | None, typer.Option(help="Failed requests allowed per run (default: the "
                                                     "bench's).")] = None,
    exclude_round: Annotated[list[int] | None, typer.Option(help="Exclude this measured round (repeatable).")
                             ] = None,
    compare_sim: Annotated[str | None, typer.Option(help="Simulate the same schedule with this profile and "
                                                    "print predicted vs measured.")] = None,
    budget: Annotated[int | None, typer.Option(help="Prefill token budget for --compare-sim.")] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    fmt: Annotated[str, typer.Option("--format", help="table (fits the terminal), markdown, csv or json (on "
                                     "stdout).")] = "table",
    ttft_slo: Annotated[str | None, typer.Option("--ttft-slo", metavar="SLO", help=TTFT_SLO_HELP
                                                 + " With its paired interval like every other metric.")] = None,
) -> None:
    """Re-render the tables, intervals and PNG plots of a bench results folder (rewrites summary.json)."""
    from rich.console import Console

    from prefillq.bench.analysis import ProtocolSettings
    from prefillq.bench.launch import default_baseline
    from prefillq.bench.results import BenchError, ResultsDir, analyse, workload_from_header
    from prefillq.cli import fail

    results = ResultsDir(directory)
    try:
        header = results.read_header()
        if header is None and not results.runs_path.exists():
            fail(f"{directory} is not a prefillq bench results folder (no bench.json or runs.jsonl)")
        used = results.used_settings(header)
        labels, recorded = [str(run.get("policy")) for run in results.read_runs()], used.get("baseline")
        settings = ProtocolSettings(  # the bench's own --baseline and --pair when their rows are in the folder
            baseline=baseline or (recorded if recorded in labels else default_baseline(labels)),
            pairs=_parse_pairs(pair, labels) if pair else [tuple(p) for p in used.get("pairs") or []
                                                           if len(p) == 2 and set(p) <= set(labels)],
            exclude_rounds=list(exclude_round or []),
            lateness_limit_ms=(lateness_limit_ms if lateness_limit_ms is not None
                               else used.get("lateness_limit_ms", 10.0)),
            throughput_drop=throughput_drop if throughput_drop is not None else used.get("throughput_drop", 0.25),
            allow_errors=allow_errors if allow_errors is not None else used.get("allow_errors", 0),
            measure=used.get("measure", "prefillq"),
            ttft_slo=str(parse_slo(ttft_slo)) if ttft_slo else used.get("ttft_slo"),
        )
        summary = analyse(results, settings)
        if not summary["runs"]:
            fail(f"{directory} holds no runs yet")
        results.write_summary(summary)
    except BenchError as exc:
        fail(str(exc))
    workload = workload_from_header(header) if compare_sim else None
    if compare_sim and workload is None:
        fail(f"{directory}/bench.json has no schedule to simulate")
    configs = None
    if compare_sim:
        _check_profile(compare_sim)
        configs = _configs_from_header(header)
    _finish(summary, results, workload, Console(stderr=True), compare_sim=compare_sim, budget=budget,
            configs=configs, plots=plots, fmt=check_format(fmt))


def _print_formatted(summary: dict[str, Any], fmt: str) -> None:
    """The protocol table as markdown or CSV (a cell's parts joined by spaces), or the summary as JSON."""
    import json

    from prefillq.report.bench import summary_grid
    from prefillq.report.tables import csv_text, markdown_table

    if fmt == "json":
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    grid = summary_grid(summary, separator=" ")
    if grid is not None:
        title, header, rows = grid
        typer.echo(f"**{title}**\n\n{markdown_table(header, rows)}" if fmt == "markdown" else csv_text(header, rows))


def _check_out(path: Path) -> None:
    """Fail before anything is sent when results cannot be written under ``path``."""
    import os

    from prefillq.cli import fail

    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        fail(f"cannot write results to {path}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        fail(f"cannot write results to {path}: {probe} is not writable")


def _configs_from_header(header: dict[str, Any] | None) -> dict[str, Any] | None:
    from prefillq.config import PolicyConfig

    configs: dict[str, Any] = {}
    for invocation in (header or {}).get("invocations", []):
        for name, data in ((invocation.get("targets") or {}).get("configs") or {}).items():
            if data is not None:  # None: the stock row, simulated as default
                configs[name] = PolicyConfig(**data)
    return configs or None
