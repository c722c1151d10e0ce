"""``prefillq tune``: the command line around :mod:`prefillq.tune` (which holds the logic)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.cli.examples import TRACE_HELP
from prefillq.cli.goodput import TTFT_SLO_HELP, parse_slo, print_goodput
from prefillq.tune import DEFAULT_W_SLO_MS, SIM_REQUEST_TARGET


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)


def tune_command(
    trace: Annotated[Path, typer.Option("--trace", help=TRACE_HELP)],
    profile: Annotated[str | None, typer.Option(help="Simulator cost-model profile (default: the "
                                                "simulator's default).")] = None,
    budget: Annotated[int | None, typer.Option(help="Prefill token budget per step (max_num_batched_tokens; "
                                               "default: the profile's).")] = None,
    long_slo_ms: Annotated[float, typer.Option(help="W_slo: the most extra queueing a long request may "
                                               "suffer, in ms (default 2000: MLPerf Inference's Llama-2-70B "
                                               "server TTFT limit).")] = DEFAULT_W_SLO_MS,
    favor: Annotated[str, typer.Option(help="short: long_max_wait_ms towards W_slo (short TTFT first); long: "
                                       "towards W_normal (fairness to long requests).")] = "short",
    rate_scale: Annotated[float, typer.Option(help="Replay the trace this many times faster.")] = 1.0,
    window_s: Annotated[float | None, typer.Option(help="Seconds of the trace to simulate (0 = all). "
                                                   "Default: the whole trace if it has at most "
                                                   f"{SIM_REQUEST_TARGET:,} requests, else the busiest "
                                                   "window holding about that many.")] = None,
    out: Annotated[Path | None, typer.Option(help="Draw the prompt-length histogram (PNG) in this folder "
                                             "(nothing is written without it).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every number to this JSON file.")
                         ] = None,
    jobs: Annotated[int | None, typer.Option(help="Candidate simulations run at once (default: every CPU; "
                                             "the result is the same).")] = None,
    executor: Annotated[str, typer.Option(help="process (worker processes here) or ray.")] = "process",
    ray_address: Annotated[str | None, typer.Option(help="Ray: an existing cluster (e.g. auto); default: a "
                                                    "local Ray.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table (the explanation, the predicted table and the "
                                     "configuration), or the predicted table as markdown, csv or json.")
                   ] = "table",
    ttft_slo: Annotated[str | None, typer.Option("--ttft-slo", metavar="SLO", help=TTFT_SLO_HELP
                                                 + " tune then recommends the configuration that maximises it.")
                        ] = None,
) -> None:
    """Choose threshold, long_max_wait_ms and the policy from a request trace, by simulation.

    The rules it follows are in docs/tune.md and docs/policies.md."""
    from rich.console import Console

    from prefillq.cli import check_format, fail, progress_bar
    from prefillq.config import ConfigError
    from prefillq.sweep import ProcessExecutor, make_executor
    from prefillq.tune import TuneError, plot_histogram, tune
    from prefillq.workload import WorkloadError, load_trace

    fmt = check_format(fmt)
    slo = parse_slo(ttft_slo)
    if favor not in ("short", "long"):
        fail(f"--favor must be 'short' or 'long', got {favor!r}")
    if not long_slo_ms > 0:
        fail(f"--long-slo-ms must be a positive number of milliseconds, got {long_slo_ms!r}")
    if not rate_scale > 0:
        fail(f"--rate-scale must be > 0, got {rate_scale!r}")
    if budget is not None and budget < 1:
        fail(f"--budget must be a positive number of tokens, got {budget!r}")
    if window_s is not None and window_s < 0:
        fail(f"--window-s must be >= 0, got {window_s!r}")
    _check_profile(profile, fail)
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be >= 1, got {jobs}")

    try:
        workload = load_trace(trace, rate_scale=rate_scale)
    except WorkloadError as exc:
        fail(str(exc))
    if not workload.requests:
        fail(f"{trace}: the trace has no requests (only a header or blank lines)")

    try:
        with progress_bar("simulations", label="[bold]simulating[/bold] {task.description}") as bar:
            task = bar.add_task("", total=8)

            def progress(label: str, done: int, total: int) -> None:
                bar.update(task, description=label, completed=done, total=total)

            with make_executor(executor, jobs=jobs, ray_address=ray_address) as runner:
                parallel = not (isinstance(runner, ProcessExecutor) and runner.jobs == 1)
                result = tune(workload, profile=profile, budget=budget, w_slo_ms=long_slo_ms, favor=favor,
                              window_s=window_s, progress=progress, executor=runner if parallel else None,
                              ttft_slo=slo)
    except (TuneError, WorkloadError, ConfigError, ValueError) as exc:
        fail(str(exc))

    if fmt != "table":
        _print_formatted(result, fmt)
    else:
        _print_result(result)  # before any file is written: a bad output path loses nothing simulated
    print_goodput(fmt, result.summaries, slo, Console(highlight=False))
    if json_path is not None:
        typer.echo(f"json:      {_written(lambda: result.write_json(json_path), json_path, fail)}", err=fmt != "table")
    if out is not None:
        from prefillq.workload.samples import trace_name  # sample:azure-conv -> azure-conv
        png_path = Path(out) / f"{trace_name(trace)}-tune-histogram.png"
        typer.echo(f"histogram: {_written(lambda: plot_histogram(result, png_path), png_path, fail)}",
                   err=fmt != "table")


def _written(write: Any, path: Path, fail: Any) -> Any:
    """Run one file write; an unwritable path is a one-line error (exit 2), not a traceback."""
    try:
        return write()
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")


def _check_profile(profile: str | None, fail: Any) -> None:
    """Fail early, with the valid choices, on an unknown simulator profile."""
    if profile is None:
        return
    from prefillq.sim import load_profile

    try:
        load_profile(profile)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        fail(str(exc).strip("'\""))


def _print_result(result: Any) -> None:
    from rich.console import Console

    from prefillq.tune import LIGHTLLM_STRATEGIES

    console = Console(highlight=False)
    name = Path(str(result.trace["path"])).name
    console.print(f"[bold]prefillq tune {name}[/bold]\n")
    for paragraph in result.explanation:
        console.print(paragraph, markup=False)
        console.print()
    console.print("[bold]Predicted (simulated) for the window above[/bold]")
    _print_table(result, console)
    wait = result.wait
    ordered = ", partial_prefills [bold]ordered[/bold]" if result.partial_prefills == "ordered" else ""
    console.print(f"\n[bold]Recommendation:[/bold] policy [bold]{result.policy}[/bold]{ordered}; short_request_first "
                  f"threshold {result.threshold.threshold} ({result.threshold.method}), long_max_wait_ms "
                  f"{wait.long_max_wait_ms:g} (W_normal P90/P95 {wait.w_normal_p90_ms:,.0f}/"
                  f"{wait.w_normal_p95_ms:,.0f} ms, W_slo {wait.w_slo_ms:,.0f} ms)\n")
    configs = result.configs
    width = console.width
    # Paste-ready: comments wrap at words; a long JSON argument breaks between its items, inside the quotes
    # (a newline there is JSON whitespace), so every line fits and still pastes as one command.
    ordered = ", partial_prefills ordered" if result.partial_prefills == "ordered" else ""
    _comment(f"vLLM with prefillq ({result.policy}{ordered}); the same class name with or without async "
             "scheduling:", width)
    typer.echo(_fit_command(configs["vllm"], width))
    _comment("the same through the vLLM Ascend key (short_request_first, tuned):", width)
    if configs.get("vllm_ascend_note"):
        _comment(f"note: {configs['vllm_ascend_note']}", width)
    typer.echo(_fit_command(configs["vllm_ascend"], width))
    _comment(f"LightLLM ({result.choice.lightllm_strategy}; it has no short_request_first):"
             if result.policy not in LIGHTLLM_STRATEGIES else "LightLLM:", width)
    if configs.get("lightllm_note"):
        _comment(f"note: {configs['lightllm_note']}", width)
    typer.echo(configs["lightllm"])
    for warning in result.warnings:
        _comment(warning, width)


def _comment(text: str, width: int) -> None:
    import textwrap

    typer.echo("\n".join(textwrap.wrap(text, width=width, initial_indent="# ", subsequent_indent="# ",
                                       break_long_words=False, break_on_hyphens=False)))


def _fit_command(command: str, width: int) -> str:
    """A shell command whose lines fit ``width``: a line ending in a quoted JSON object too long for it is
    broken after a comma or an opening brace of the object (inside the quotes the newline is JSON
    whitespace: still one shell word, still the same JSON)."""
    lines = []
    for line in command.split("\n"):
        inside = False
        while len(line) > width:
            quote = 0 if inside else line.find("'")
            cuts = [i for i in range(quote + 1, width) if line[i] in ",{"] if quote >= 0 else []
            if not cuts:
                break
            lines.append(line[:cuts[-1] + 1])
            line = "      " + line[cuts[-1] + 1:].lstrip()
            inside = True
        lines.append(line)
    return "\n".join(lines)


def _rows(result: Any) -> tuple[dict[str, Any], str]:
    """The predicted rows labelled for an operator (the recommended one with a ``*``) and the baseline row."""
    labels = {"short_request_first": "srf (tuned)", "short_request_first (strict)": "srf (strict)",
              "short_request_first (ordered)": "srf (tuned, ordered)"}
    rows: dict[str, Any] = {}
    for name, summary in result.summaries.items():
        label = labels.get(name, name)
        chosen = name == (f"{result.policy} (ordered)" if result.partial_prefills == "ordered" else result.policy)
        rows[f"{label} *" if chosen else label] = summary
    return rows, "default *" if result.policy == "default" else "default"


def _print_table(result: Any, console: Any) -> None:
    """The predicted table, as ``prefillq compare`` prints it (one row per policy, change vs default, fitted to
    the terminal); the recommended row carries a ``*``."""
    from prefillq.report import compare_table

    rows, baseline = _rows(result)
    table, hidden = compare_table(rows, baseline=baseline, width=console.width)
    console.print(table)
    not_shown = f" Not shown at this width: {', '.join(hidden)} (--format markdown shows all)." if hidden else ""
    console.print("* recommended; srf = short_request_first: (tuned) with the threshold and long_max_wait_ms "
                  "above, (strict) with long_max_wait_ms = 0, the run that measures W_normal; (ordered) with "
                  f"partial_prefills = \"ordered\".{not_shown}", style="dim")


def _print_formatted(result: Any, fmt: str) -> None:
    """The predicted table as markdown, CSV or JSON on stdout."""
    import json

    from prefillq.report.tables import compare_grid, csv_text, markdown_table

    rows, baseline = _rows(result)
    if fmt == "json":
        typer.echo(json.dumps({"policy": result.policy, "partial_prefills": result.partial_prefills,
                               "threshold": result.threshold.threshold,
                               "long_max_wait_ms": result.wait.long_max_wait_ms, "predicted": rows}, indent=2,
                              default=str))
        return
    header, cells = compare_grid(rows, baseline=baseline, label_width=None, markup=False)
    typer.echo(markdown_table(header, cells) if fmt == "markdown" else csv_text(header, cells))
