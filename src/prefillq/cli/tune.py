"""``prefillq tune``: the command line around :mod:`prefillq.tune` (which holds the logic)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.tune import DEFAULT_W_SLO_MS, SIM_REQUEST_TARGET


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)


def tune_command(
    trace: Annotated[Path, typer.Option("--trace", help="Request trace: Azure CSV, Mooncake-style JSONL, or "
                                        "the per-request JSONL written by `prefillq bench`.")],
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
    out: Annotated[Path, typer.Option(help="Folder for the histogram PNG.")] = Path("."),
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every number to this JSON file.")
                         ] = None,
    jobs: Annotated[int | None, typer.Option(help="Candidate simulations run at once (default: every CPU; "
                                             "the result is the same).")] = None,
    executor: Annotated[str, typer.Option(help="process (worker processes here) or ray.")] = "process",
    ray_address: Annotated[str | None, typer.Option(help="Ray: an existing cluster (e.g. auto); default: a "
                                                    "local Ray.")] = None,
) -> None:
    """Choose threshold, long_max_wait_ms and the policy from a request trace (SPEC §3.5), by simulation."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from prefillq.cli import fail
    from prefillq.config import ConfigError
    from prefillq.sweep import ProcessExecutor, make_executor
    from prefillq.tune import TuneError, plot_histogram, tune
    from prefillq.workload import WorkloadError, load_trace

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

    console = Console(stderr=True)
    try:
        with Progress(TextColumn("[bold]simulating[/bold] {task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("", total=8)

            def progress(label: str, done: int, total: int) -> None:
                bar.update(task, description=label, completed=done, total=total)

            with make_executor(executor, jobs=jobs, ray_address=ray_address) as runner:
                parallel = not (isinstance(runner, ProcessExecutor) and runner.jobs == 1)
                result = tune(workload, profile=profile, budget=budget, w_slo_ms=long_slo_ms, favor=favor,
                              window_s=window_s, progress=progress, executor=runner if parallel else None)
    except (TuneError, WorkloadError, ConfigError, ValueError) as exc:
        fail(str(exc))

    _print_result(result)  # before any file is written: a bad output path loses nothing simulated
    if json_path is not None:
        typer.echo(f"json:      {_written(lambda: result.write_json(json_path), json_path, fail)}")
    png_path = Path(out) / f"{trace.stem}-tune-histogram.png"
    typer.echo(f"histogram: {_written(lambda: plot_histogram(result, png_path), png_path, fail)}")


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

    console = Console(soft_wrap=True, highlight=False)
    console.width = max(console.width, 160)  # eight columns and "(ordered)" rows; never squeeze them
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
    # Plain echo: no wrapping or markup, so the lines paste as they are.
    ordered = ", partial_prefills ordered" if result.partial_prefills == "ordered" else ""
    typer.echo(f"# vLLM with prefillq ({result.policy}{ordered}); the same class with or without async scheduling:")
    typer.echo(configs["vllm"])
    typer.echo("# the same through the vLLM Ascend key (short_request_first, tuned):")
    if configs.get("vllm_ascend_note"):
        typer.echo(f"# note: {configs['vllm_ascend_note']}")
    typer.echo(configs["vllm_ascend"])
    typer.echo(f"# LightLLM ({result.choice.lightllm_strategy}; it has no short_request_first):"
               if result.policy not in LIGHTLLM_STRATEGIES else "# LightLLM:")
    if configs.get("lightllm_note"):
        typer.echo(f"# note: {configs['lightllm_note']}")
    typer.echo(configs["lightllm"])
    for warning in result.warnings:
        typer.echo(f"# {warning}")


def _print_table(result: Any, console: Any) -> None:
    """The predicted table, exactly as ``prefillq compare`` prints it (one row per policy, change vs default);
    the recommended row carries a ``*``."""
    from prefillq.report import compare_table

    labels = {"short_request_first": "srf (tuned)", "short_request_first (strict)": "srf (strict)",
              "short_request_first (ordered)": "srf (tuned, ordered)"}
    rows: dict[str, Any] = {}
    for name, summary in result.summaries.items():
        label = labels.get(name, name)
        chosen = name == (f"{result.policy} (ordered)" if result.partial_prefills == "ordered" else result.policy)
        rows[f"{label} *" if chosen else label] = summary
    baseline = "default *" if result.policy == "default" else "default"
    console.print(compare_table(rows, baseline=baseline))
    console.print("* recommended; srf = short_request_first: (tuned) with the threshold and long_max_wait_ms "
                  "above, (strict) with long_max_wait_ms = 0, the run that measures W_normal; (ordered) with "
                  "partial_prefills = \"ordered\" (SPEC §3.6).", style="dim")
