"""``prefillq sweep``: a grid of simulations (policies x budgets x replicas x rate scales), in parallel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.cli import check_format, fail, parse_set, progress_bar
from prefillq.cli.examples import TRACE_HELP
from prefillq.cli.goodput import TTFT_SLO_HELP, parse_slo


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)


def _values(items: list[str] | None, kind: type, flag: str) -> list[Any] | None:
    """Repeatable flags whose values may also be comma-separated: ``--budget 1024,2048 --budget 4096``."""
    if not items:
        return None
    values: list[Any] = []
    for item in items:
        for text in item.split(","):
            text = text.strip()
            if not text:
                continue
            try:
                values.append(kind(text))
            except ValueError:
                fail(f"{flag} expects {kind.__name__} values, got {text!r}")
    return values


def sweep_command(
    config: Annotated[Path | None, typer.Option("--config", help="Grid file (TOML, or JSON for .json): keys "
                                                "policies, budgets, replicas, rate_scales, trace, scenario, "
                                                "mode, router, ...; flags override it.")] = None,
    trace: Annotated[Path | None, typer.Option(help=TRACE_HELP)] = None,
    scenario: Annotated[str | None, typer.Option(help="Named scenario (default long-first).")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy spec (repeatable, or "
                                                     "comma-separated names).")] = None,
    budget: Annotated[list[str] | None, typer.Option("--budget", help="Token budget(s) per step "
                                                     "(repeatable or comma-separated).")] = None,
    replicas: Annotated[list[str] | None, typer.Option("--replicas", help="Replica count(s).")] = None,
    rate_scale: Annotated[list[str] | None, typer.Option("--rate-scale", help="Replay speed-up(s).")] = None,
    router: Annotated[str | None, typer.Option(help="round_robin, least_outstanding_tokens or "
                                               "prefix_affinity.")] = None,
    gateway_policy: Annotated[str | None, typer.Option(help="Hold requests at the router in this policy's "
                                                       "order (needs --max-inflight-per-replica).")] = None,
    max_inflight_per_replica: Annotated[int | None, typer.Option(help="Gateway: requests in flight per "
                                                                 "replica.")] = None,
    mode: Annotated[str | None, typer.Option(help="Engine model: vllm or lightllm.")] = None,
    profile: Annotated[str | None, typer.Option(help="Cost-model profile name or JSON file.")] = None,
    seed: Annotated[int | None, typer.Option(help="Scenario seed.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Scenario parameter KEY=VALUE.")] = None,
    limit: Annotated[int | None, typer.Option(help="Trace: at most this many requests.")] = None,
    start: Annotated[float | None, typer.Option(help="Trace: skip arrivals before this time (s).")] = None,
    duration: Annotated[float | None, typer.Option(help="Trace: window length (s).")] = None,
    jobs: Annotated[int | None, typer.Option(help="Cells run at once (default: every CPU).")] = None,
    executor: Annotated[str, typer.Option(help="process (worker processes here) or ray.")] = "process",
    ray_address: Annotated[str | None, typer.Option(help="Ray: an existing cluster (e.g. auto); default: "
                                                    "start a local Ray.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write sweep.json, sweep.csv and one PNG per metric "
                                             "here.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the rows as JSON here.")] = None,
    plots: Annotated[bool, typer.Option(help="With --out, draw the PNG plots.")] = True,
    fmt: Annotated[str, typer.Option("--format", help="table (fits the terminal), markdown, csv or json (every "
                                     "column, on stdout).")] = "table",
    ttft_slo: Annotated[str | None, typer.Option("--ttft-slo", metavar="SLO", help=TTFT_SLO_HELP)] = None,
) -> None:
    """Run a grid of simulations and write one row per cell (table, CSV, JSON, a plot per metric)."""
    from rich.console import Console

    from prefillq.config import ConfigError
    from prefillq.sim import SimulationError
    from prefillq.sweep import SweepError, grid_from, load_grid_file, make_executor, run_sweep
    from prefillq.workload import WorkloadError

    fmt = check_format(fmt)
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be >= 1, got {jobs}")
    flags = {"trace": None if trace is None else str(trace), "scenario": scenario, "router": router,
             "gateway_policy": gateway_policy, "max_inflight_per_replica": max_inflight_per_replica, "mode": mode,
             "profile": profile, "seed": seed, "limit": limit, "start_s": start, "duration_s": duration,
             "policies": _policies(policy), "budgets": _values(budget, int, "--budget"),
             "replicas": _values(replicas, int, "--replicas"),
             "rate_scales": _values(rate_scale, float, "--rate-scale"),
             "ttft_slo": None if ttft_slo is None else str(parse_slo(ttft_slo))}
    console = Console()
    try:
        settings = load_grid_file(config) if config is not None else {}
        settings.update({key: value for key, value in flags.items() if value is not None})
        if set_:
            settings["overrides"] = {**settings.get("overrides", {}), **parse_set(set_)}
        grid = grid_from(settings)
        if grid.gateway_policy is not None and grid.max_inflight_per_replica is None:
            fail("--gateway-policy needs --max-inflight-per-replica (without a limit nothing waits at the gateway)")
        _refuse_unused(settings, grid)
        cells = len(grid.cells())
        with make_executor(executor, jobs=jobs, ray_address=ray_address) as runner, \
                progress_bar("cells") as bar:
            task = bar.add_task("sweep", total=cells)
            result = run_sweep(grid, runner, on_done=lambda done, total: bar.update(task, completed=done))
    except (SweepError, ConfigError, WorkloadError, SimulationError, ValueError) as exc:
        fail(str(exc))
    _render(console, result, out=out, json_path=json_path, plots=plots, fmt=fmt)


def _refuse_unused(settings: dict[str, Any], grid: Any) -> None:
    """Exit 2 for a setting (flag or grid-file key) given where it would change nothing."""
    def flag(key: str) -> str:
        return "--" + key.removesuffix("_s").replace("_", "-")

    if grid.max_inflight_per_replica is not None and grid.gateway_policy is None:
        fail("--max-inflight-per-replica caps what a gateway queue releases; without --gateway-policy nothing "
             "waits at the gateway and it changes nothing")
    if "router" in settings and max(grid.replicas) < 2:
        fail(f"--router {grid.router} picks among replicas; every cell has one: give --replicas N (N >= 2)")
    if grid.trace is None:
        given = [flag(key) for key in ("limit", "start_s", "duration_s", "long_threshold") if key in settings]
        if given:
            fail(f"{', '.join(given)} shape a replayed trace: give --trace FILE (a scenario takes --set KEY=VALUE)")
    elif "seed" in settings:
        fail("--seed picks a scenario's random arrivals; a trace's are fixed: drop --seed")


def _policies(items: list[str] | None) -> list[str] | None:
    """``--policy`` values: a JSON spec stays whole; plain text splits on commas into names or specs."""
    if not items:
        return None
    specs: list[str] = []
    for item in items:
        text = item.strip()
        if text.startswith("{") or ":" in text:
            specs.append(text)
        else:
            specs.extend(part.strip() for part in text.split(",") if part.strip())
    return specs


def _render(console: Any, result: Any, *, out: Path | None, json_path: Path | None, plots: bool,
            fmt: str = "table") -> None:
    from prefillq.report import write_json
    from prefillq.report.sweep import sweep_plots, sweep_table, write_sweep_csv

    grid = result.grid
    source = f"trace {Path(grid.trace).name}" if grid.trace else f"scenario {grid.scenario or 'long-first'}"
    title = f"prefillq sweep: {source}, {grid.mode}, router {grid.router}" + (
        f", gateway {grid.gateway_policy} (in-flight {grid.max_inflight_per_replica})" if grid.gateway_policy else "")
    if fmt == "table":
        table, hidden = sweep_table(result.rows, title=title, width=console.width)
        console.print(table)
        if hidden:
            where = "in sweep.csv" if out is not None else "--out DIR writes them to sweep.csv"
            console.print(f"[dim]Not shown at this width: {', '.join(hidden)} ({where}; --json or "
                          "--format markdown show them too).[/dim]", highlight=False)
        cells_by_warning: dict[str, list[str]] = {}
        for row in result.rows:
            for warning in row.get("warnings") or []:
                cells_by_warning.setdefault(warning, []).append(str(row.get("cell")))
        for warning, cells in cells_by_warning.items():
            where = f"cell {cells[0]}" if len(cells) == 1 else f"cells {', '.join(cells)}"
            column = "the warnings column of sweep.csv" if out is not None else "the warnings of --json"
            console.print(f"[yellow]warning:[/yellow] {where} ({column}): {warning}",
                          highlight=False)
    else:
        _print_formatted(fmt, result)
    data = result.to_dict()
    written: list[Path] = []
    try:
        if json_path is not None:
            written.append(write_json(json_path, data))
        if out is not None:
            written.append(write_json(Path(out) / "sweep.json", data))
            written.append(write_sweep_csv(Path(out) / "sweep.csv", result.rows))
            if plots:
                written.extend(sweep_plots(out, result.rows, title=title))
            from prefillq.report.html import write_html_report
            written.append(write_html_report(out, title, kind="sweep"))
    except OSError as exc:
        fail(f"cannot write {exc.filename or out or json_path}: {exc.strerror or exc}")
    for path in written:
        if fmt == "table":
            console.print(f"wrote {path}", highlight=False)
        else:
            typer.echo(f"wrote {path}", err=True)


def _print_formatted(fmt: str, result: Any) -> None:
    import json

    from prefillq.report.sweep import sweep_grid
    from prefillq.report.tables import csv_text, markdown_table

    if fmt == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    header, cells = sweep_grid(result.rows)
    typer.echo(markdown_table(header, cells) if fmt == "markdown" else csv_text(header, cells))
