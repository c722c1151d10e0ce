"""``prefillq compare``: the policies side by side on the simulated engine (the project's main job)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from prefillq.cli import check_format, fail, parse_set
from prefillq.cli.examples import TRACE_HELP
from prefillq.cli.goodput import TTFT_SLO_HELP, add_goodput, parse_slo, print_goodput
from prefillq.cli.recommendation import emulation_lines, markdown_notes, ms, print_recommendation
from prefillq.sim.pd import BUSY_RETRY_ENV

WORKLOAD, ENGINE, POLICIES, OUTPUT = "Workload", "Engine", "Policies", "Output"


class PanelledCommand(TyperCommand):
    """Plain help (option names never cut, as every command's), its options in titled groups: the
    ``rich_help_panel`` each option names, in the order the panels first appear; the rest last."""

    def format_options(self, ctx: Any, formatter: Any) -> None:  # click's Context, HelpFormatter (typer's own)
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Other", []).append(record)
        for panel in sorted(panels, key=lambda name: name == "Other"):
            with formatter.section(panel):
                formatter.write_dl(panels[panel])


def register(app: typer.Typer) -> None:
    app.command("compare", cls=PanelledCommand)(compare_command)


def compare_command(
    # --- Workload: what the engine is asked to serve ---
    scenario: Annotated[str | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="A published workload: long-first (the default: a burst of long prompts, then short ones), "
             "interleaved, sustained, long-then-stream, overload, low-load, multi-turn.")] = None,
    trace: Annotated[Path | None, typer.Option(
        rich_help_panel=WORKLOAD, help="Replay your own requests instead of a scenario. " + TRACE_HELP)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", rich_help_panel=WORKLOAD,
        help="Change one scenario parameter, KEY=VALUE (repeatable), e.g. --set rate=80 (requests/s).")] = None,
    repeats: Annotated[int, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Run a scenario this many times with different random arrivals (seeds seed..seed+N-1) and report "
             "the medians.")] = 1,
    seed: Annotated[int | None, typer.Option(
        rich_help_panel=WORKLOAD, help="Seed of a scenario's random arrivals in the first run (default 0).")] = None,
    rate_scale: Annotated[float | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Trace: replay this many times faster than recorded (2 = twice the request rate; default 1).")] = None,
    start: Annotated[float | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Trace: skip requests that arrived before this many seconds, on the trace's own clock "
             "(default 0).")] = None,
    duration: Annotated[float | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Trace: replay this many seconds of it, on the trace's own clock (before --rate-scale: "
             "--duration 600 --rate-scale 3 replays 600 s of the trace in 200 s).")] = None,
    limit: Annotated[int | None, typer.Option(
        rich_help_panel=WORKLOAD, help="Trace: replay at most this many requests.")] = None,
    long_threshold: Annotated[int | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Trace: prompts longer than this many tokens count as 'long' in the table (default: the threshold "
             "`prefillq tune` would choose: the valley between the trace's short and long prompts).")] = None,
    hash_block_tokens: Annotated[int | None, typer.Option(
        rich_help_panel=WORKLOAD,
        help="Trace: prompt tokens each entry of a record's hash_ids stands for (default 512, Mooncake's).")] = None,
    template_tokens: Annotated[int, typer.Option(
        rich_help_panel=WORKLOAD, help="Tokens your server's chat template adds to every prompt.")] = 0,
    # --- Engine: the server the workload runs on ---
    mode: Annotated[str, typer.Option(
        rich_help_panel=ENGINE,
        help="Which engine: vllm (vLLM V1's scheduler) or lightllm (LightLLM's router and ready list).")] = "vllm",
    profile: Annotated[str | None, typer.Option(
        rich_help_panel=ENGINE,
        help="The GPU and model, as step times: a profile name or JSON file; default: h200-qwen3-0.6b (measured "
             "on an H200) in --mode vllm, h100-qwen3.5-0.8b (fitted to LightLLM's published study) in --mode "
             "lightllm.")] = None,
    budget: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE,
        help="Prompt and decode tokens per step (vLLM's max_num_batched_tokens); default: the profile's.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="Most requests running at once (vLLM's max_num_seqs); default: the "
                                     "profile's.")] = None,
    kv_blocks: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="KV-cache blocks the GPU holds; default: the profile's.")] = None,
    long_prefill_token_threshold: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE,
        help="vLLM's static cap on the tokens a prefill gets per step (0 = off; default: the profile's, 0). "
             "In --mode lightllm it is the chunk size of every prefill (default: the budget).")] = None,
    prefix_cache: Annotated[bool | None, typer.Option(
        "--prefix-cache/--no-prefix-cache", rich_help_panel=ENGINE,
        help="vLLM's prefix caching (vllm mode, mixed topology): on by default when the requests carry block "
             "hashes (trace hash_ids, the multi-turn scenario); lightllm mode and 1p1d ignore the hashes, "
             "and refuse --prefix-cache.")] = None,
    scheduling_policy: Annotated[str, typer.Option(
        rich_help_panel=ENGINE,
        help="vLLM's --scheduling-policy: fcfs, or priority (strict tiers of the requests' priority class, each "
             "row's policy inside a tier; the worst (priority, arrival) running request is preempted when KV "
             "is short). Classes come from a trace's priority field or --set interactive_share=...")] = "fcfs",
    topology: Annotated[str, typer.Option(
        rich_help_panel=ENGINE,
        help="mixed (one engine doing prefill and decode) or 1p1d (a router in front of a prefill node running "
             "the policy and an FCFS decode node).")] = "mixed",
    pd_pairs: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="1p1d: prefill/decode pairs behind the router (default 1).")] = None,
    busy_retry_timeout_s: Annotated[str | None, typer.Option(
        rich_help_panel=ENGINE,
        help=f"1p1d: retry a request whose pair is busy on another pair for at most this many seconds, only "
             f"before its first token; 0 = off (default; env {BUSY_RETRY_ENV}, the flag wins).")] = None,
    prefill_waiting_limit: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE,
        help="1p1d: at most this many requests wait in a prefill node's queue; the router holds the rest, "
             "ordered by admission priority (default: no limit).")] = None,
    decode_policy: Annotated[str | None, typer.Option(
        rich_help_panel=ENGINE,
        help="1p1d: order of the decode node's inbound queue (default FCFS; short_request_first is refused on "
             "a decode-only node).")] = None,
    decode_max_num_seqs: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="1p1d: the decode node's running limit (default: --max-num-seqs).")] = None,
    decode_kv_blocks: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="1p1d: the decode node's KV blocks (default: --kv-blocks).")] = None,
    replicas: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE,
        help="Engine replicas behind a router, each running the row's policy (default 1: no router).")] = None,
    router: Annotated[str | None, typer.Option(
        rich_help_panel=ENGINE,
        help="With --replicas: round_robin (default), least_outstanding_tokens or prefix_affinity.")] = None,
    max_inflight_per_replica: Annotated[int | None, typer.Option(
        rich_help_panel=ENGINE, help="Gateway: requests in flight per replica.")] = None,
    lightllm_schedule: Annotated[str | None, typer.Option(
        rich_help_panel=ENGINE,
        help="--mode lightllm: step types: prefill-first (LightLLM's default: a step with a prefill runs no "
             "decodes), alternate (--disable_aggressive_schedule), mixed (--enable_prefill_decode_mixed), "
             "always-mixed (every step carries every decode).")] = None,
    router_tick_ms: Annotated[float | None, typer.Option(
        rich_help_panel=ENGINE,
        help="--mode lightllm: the router forms a batch every this many ms (default 30; 0 = every step).")] = None,
    prefill_token_gate: Annotated[bool, typer.Option(
        rich_help_panel=ENGINE,
        help="--mode lightllm: apply the router's ok_prefill rule (off by default: it contradicts the "
             "published figures, see docs/compare.md).")] = False,
    # --- Policies: the rows of the table ---
    policies: Annotated[str | None, typer.Option(
        rich_help_panel=POLICIES,
        help="Only these policies, comma-separated, each a row at its default settings (without it and "
             "--policy: default, promote_shortest, hrrn, short_request_first and auto with ordered partial "
             "prefills, and compare recommends one). The group 'peers' adds default, auto and the emulations "
             "of other engines' own options (sglang_hrrn, sglang_spf, trtllm_suf, dynamo_wspt; shown, never "
             "recommended), e.g. --policies peers or --policies hrrn,peers.")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", metavar="SPEC", rich_help_panel=POLICIES,
        help="A configured row (repeatable), labelled by SPEC as given: a policy name, NAME:KEY=VALUE[,KEY=VALUE] "
             "(e.g. srf:threshold=512,long_max_wait_ms=1500) or a JSON object "
             "(e.g. '{\"policy\": \"hrrn\"}'). Rows follow those of --policies; the recommendation is one of "
             "them.")] = None,
    gateway_policy: Annotated[list[str] | None, typer.Option(
        "--gateway-policy", metavar="SPEC", rich_help_panel=POLICIES,
        help="Hold requests at the router until a replica has a free slot, released in this policy's order "
             "(needs --max-inflight-per-replica). Repeatable: each row once per gateway ('none': no gateway), "
             "so short-first in the gateway, the engines or both sit side by side.")] = None,
    long_cost_limit: Annotated[float, typer.Option(
        metavar="PCT", rich_help_panel=POLICIES,
        help="The most the recommended row may raise long requests' TTFT p95 over default's, in percent "
             "(throughput stays within -2%). Raise it to accept a trade the output names 'Over the "
             "limits'.")] = 15.0,
    achievable: Annotated[bool, typer.Option(
        rich_help_panel=POLICIES,
        help="Also run the clairvoyant schedules (the row 'best reached by a clairvoyant schedule': the best "
             "short TTFT lies between the proven lower bound and it; one more simulation each).")] = True,
    # --- Output: what is printed and written ---
    fmt: Annotated[str, typer.Option(
        "--format", rich_help_panel=OUTPUT,
        help="table (fits the terminal), markdown, csv or json (every column and the recommendation, on "
             "stdout).")] = "table",
    wide: Annotated[bool, typer.Option(
        "--wide", rich_help_panel=OUTPUT, help="Show every column even where the terminal is too narrow.")] = False,
    out: Annotated[Path | None, typer.Option(
        rich_help_panel=OUTPUT,
        help="Write summary.json, summary.csv, records.csv, PNG plots and report.html (the table, the "
             "recommendation and the plots in one page) into this folder.")] = None,
    json_path: Annotated[Path | None, typer.Option(
        "--json", rich_help_panel=OUTPUT,
        help="Write the machine-readable summary (with the recommendation) to this file.")] = None,
    plots: Annotated[bool, typer.Option(rich_help_panel=OUTPUT, help="With --out, draw the PNG plots.")] = True,
    ttft_slo: Annotated[str | None, typer.Option(
        "--ttft-slo", metavar="SLO", rich_help_panel=OUTPUT, help=TTFT_SLO_HELP)] = None,
    jobs: Annotated[int | None, typer.Option(
        min=1, rich_help_panel=OUTPUT,
        help="Simulations at once: the clairvoyant schedules run in worker processes beside the rows "
             "(default: each in its own; 1: all here, one after another). The numbers are the same.")] = None,
) -> None:
    """Which prefill-queue policy to run: each side by side on a simulated engine (short/long TTFT, TPOT,
    throughput), and the one to run with its vLLM line."""
    from prefillq.sim.compare import CompareSettings

    _refuse_unused({"--rate-scale": rate_scale, "--limit": limit, "--start": start, "--duration": duration,
                    "--long-threshold": long_threshold, "--hash-block-tokens": hash_block_tokens},
                   trace, repeats, seed, replicas, router, gateway_policy or [], max_inflight_per_replica)
    pd = _pd_settings(topology, pd_pairs, busy_retry_timeout_s, prefill_waiting_limit, decode_policy,
                      decode_max_num_seqs, decode_kv_blocks)
    if not 0 <= long_cost_limit <= 10_000:
        fail(f"--long-cost-limit is a percentage from 0 to 10000, got {long_cost_limit:g}")
    settings = CompareSettings(
        scenario=scenario, overrides=parse_set(set_ or []), trace=trace,
        rate_scale=1.0 if rate_scale is None else rate_scale, limit=limit, start_s=start or 0.0,
        duration_s=duration, long_threshold=long_threshold,
        hash_block_tokens=512 if hash_block_tokens is None else hash_block_tokens,
        policies=None if policies is None else policies.split(","), policy_specs=policy or [],
        long_prefill_token_threshold=long_prefill_token_threshold,
        profile=profile, budget=budget, mode=mode, repeats=repeats, seed=seed or 0, template_tokens=template_tokens,
        max_num_seqs=max_num_seqs, kv_blocks=kv_blocks, topology=topology, pd=pd,
        fleet=_fleet_settings(replicas, router, gateway_policy or [], max_inflight_per_replica),
        gateway_policies=gateway_policy or [], prefix_cache=prefix_cache,
        engine_options=_engine_options(lightllm_schedule, router_tick_ms, prefill_token_gate), achievable=achievable,
        jobs=jobs, scheduling_policy=scheduling_policy, long_cost_limit=long_cost_limit / 100)
    if jobs is not None and jobs > 1 and (not achievable or topology != "mixed"):
        fail(f"--jobs {jobs} runs the reference schedules in worker processes beside the rows; with "
             f"{'--no-achievable' if not achievable else 'the 1p1d topology'} there are none and the rows run "
             "here one after another: drop --jobs")
    _compare(settings, out=out, json_path=json_path, plots=plots, fmt=check_format(fmt), wide=wide,
             slo=parse_slo(ttft_slo))


def _refuse_unused(trace_flags: dict[str, Any], trace: Path | None, repeats: int, seed: int | None,
                   replicas: int | None, router: str | None, gateways: list[str], inflight: int | None) -> None:
    """Exit 2 for an option given where it would change nothing (rather than run as if it were not given)."""
    if trace is None:
        given = [flag for flag, value in trace_flags.items() if value is not None]
        if given:
            fail(f"{', '.join(given)} shape a replayed trace: give --trace FILE (a scenario takes --set KEY=VALUE)")
    else:
        if repeats > 1:
            fail(f"--repeats {repeats} with --trace would run the same requests {repeats} times to the same "
                 "numbers (nothing in the simulator is random): drop --repeats")
        if seed is not None:
            fail("--seed picks a scenario's random arrivals; a trace's are fixed: drop --seed")
    if inflight is not None and not any(g.strip().lower() != "none" for g in gateways):
        fail("--max-inflight-per-replica caps what a gateway queue releases; without --gateway-policy SPEC "
             "(other than none) nothing waits at the gateway and it changes nothing")
    if len(gateways) == 1 and gateways[0].strip().lower() == "none":
        fail("--gateway-policy none alone is no gateway, as without the option: give it beside another "
             "--gateway-policy SPEC to compare the two, or drop it")
    if router is not None and (replicas is None or replicas < 2):
        fail(f"--router {router} picks among replicas; with {replicas or 1} there is nothing to pick: give "
             "--replicas N (N >= 2)")


def _fleet_settings(replicas: int | None, router: str | None, gateways: list[str], inflight: int | None) -> Any:
    """The fleet's settings from the flags (None when none was given); a bad one exits 2."""
    if replicas is None and router is None and not gateways and inflight is None:
        return None
    from prefillq.config import parse_policy_spec
    from prefillq.sim.fleet import FleetConfig

    real = [g for g in gateways if g.strip().lower() != "none"]
    if real and inflight is None:
        fail("--gateway-policy needs --max-inflight-per-replica (without a limit nothing waits at the gateway)")
    try:
        gateway = parse_policy_spec(real[0])[1] if len(gateways) == 1 and real else None
        return FleetConfig(replicas=1 if replicas is None else replicas, router=router or "round_robin",
                           gateway_policy=gateway, max_inflight_per_replica=inflight)
    except ValueError as exc:
        fail(str(exc))


def _engine_options(schedule: str | None, router_tick_ms: float | None, gate: bool) -> dict[str, Any]:
    """The LightLLM engine options given on the command line (checked with the other settings)."""
    options: dict[str, Any] = {}
    if schedule is not None:
        options["schedule"] = schedule
    if router_tick_ms is not None:
        options["router_tick_s"] = router_tick_ms / 1000.0
    if gate:
        options["prefill_token_gate"] = True
    return options


def _compare(settings: Any, *, out: Path | None, json_path: Path | None, plots: bool, fmt: str = "table",
             wide: bool = False, slo: Any = None) -> None:
    """Run the comparison with a progress bar, then print the table and write the files asked for."""
    from rich.console import Console
    from rich.markup import escape

    from prefillq.cli import progress_bar
    from prefillq.report import compare_json
    from prefillq.sim import SimulationError
    from prefillq.sim.compare import comparison_details, prepare_comparison, workload_split

    console = Console()
    errors = Console(stderr=True)
    try:
        setup = prepare_comparison(settings)
        with progress_bar("%", console=errors) as progress:  # the rows' simulated requests, as they advance
            task = progress.add_task(f"simulating {setup.label}", total=1.0)
            comparison = setup.run(on_progress=lambda done: progress.update(task, completed=done))
    except (ValueError, SimulationError) as exc:
        fail(str(exc))

    split = workload_split(comparison)
    add_goodput(comparison.summaries, comparison.records, slo)
    data = compare_json(scenario=comparison.workload, profile=comparison.profile, summaries=comparison.summaries,
                        bound=comparison.bound, extra=comparison_details(settings, comparison),
                        baseline=comparison.baseline)
    if settings.scheduling_policy == "priority" and data.get("priority_classes"):
        from prefillq.sim.recommend_classes import recommend_by_class

        data["recommendation"] = recommend_by_class(
            comparison.summaries, comparison.configs, baseline=comparison.baseline,
            classes=data["priority_classes"]["classes"], mode=settings.mode, plain=data.get("recommendation"))
    title = _title(setup.label, comparison, settings)
    data["title"] = title  # prefillq report prints the table again from summary.json
    if fmt != "table":
        for warning in comparison.warnings:
            errors.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        _print_formatted(fmt, comparison, data, title)
        print_goodput(fmt, comparison.summaries, slo)
        written = _write_files(comparison, data, out=out, json_path=json_path, plots=plots, title=title, split=split)
        for path in written:
            errors.print(f"wrote {path}", highlight=False)
        return
    for warning in comparison.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    print_table(console, comparison, settings, split, data, title, wide=wide)
    print_goodput(fmt, comparison.summaries, slo, console)
    if settings.fleet is not None:
        _print_fleet(console, comparison)
    _print_prefix_cache(console, comparison)
    if data.get("priority_classes"):
        from prefillq.report.tables import priority_class_lines

        for line in priority_class_lines(data["priority_classes"]["by_row"], width=min(console.width, 100)):
            console.print(escape(line), highlight=False)
    written = _write_files(comparison, data, out=out, json_path=json_path, plots=plots, title=title, split=split)
    if comparison.workload_params.get("priority_classes") and settings.scheduling_policy == "fcfs":
        console.print("[dim]the requests' priority classes are reported, not honoured: an FCFS engine ignores "
                      "them (--scheduling-policy priority serves them in tiers).[/dim]")
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def print_table(console: Any, comparison: Any, settings: Any, split: dict[str, Any], data: dict[str, Any],
                title: str, *, wide: bool = False) -> None:
    """The table fitted to the console (the recommended row marked), the footer and the recommendation."""
    from rich.markup import escape
    from rich.measure import Measurement

    from prefillq.report import compare_table

    recommendation = data.get("recommendation")
    table, hidden = compare_table(comparison.summaries, baseline=comparison.baseline, bound=comparison.bound,
                                  title=title, width=None if wide else console.width,
                                  achievable=comparison.achievable,
                                  recommended=recommendation["row"] if recommendation else None)
    if wide:
        unbounded = console.options.update(max_width=10_000)  # measure the table as if the terminal had no edge
        console.width = max(console.width, int(Measurement.get(console, unbounded, table).maximum))
    console.print(table)
    for line in footer_lines(comparison, settings, split, hidden) + emulation_lines(data):
        console.print(f"[dim]{escape(line)}[/dim]", highlight=False)
    if recommendation:
        print_recommendation(console, recommendation)
        from prefillq.report.tables import class_recommendation_lines

        for line in class_recommendation_lines(recommendation):
            console.print(escape(line), highlight=False)


def _count(value: Any) -> str:
    """A request count as a whole number (a median over repeats can be a float)."""
    return "0" if value is None else f"{round(float(value)):,}"


def _print_formatted(fmt: str, comparison: Any, data: dict[str, Any], title: str) -> None:
    """The comparison as Markdown, CSV or JSON on stdout (every column; nothing else on stdout)."""
    import json

    from prefillq.report.tables import compare_grid, csv_text, markdown_table

    if fmt == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    recommendation = data.get("recommendation")
    header, rows = compare_grid(comparison.summaries, baseline=comparison.baseline, bound=comparison.bound,
                                label_width=None, markup=False, achievable=comparison.achievable,
                                recommended=recommendation["row"] if recommendation else None)
    if fmt == "markdown":
        typer.echo(f"**{title}**\n")
        typer.echo(markdown_table(header, rows))
        typer.echo("")
        for line in markdown_notes(comparison, recommendation, data):
            typer.echo(line)
        from prefillq.report.tables import class_recommendation_lines

        class_lines = class_recommendation_lines(recommendation) if recommendation else []
        if class_lines:
            typer.echo("")
            typer.echo(class_lines[0])
            typer.echo("")
            for line in class_lines[1:]:
                typer.echo(f"* {line.strip()}")
        return
    from prefillq.report.tables import ACHIEVABLE_LABEL, BOUND_LABEL, COMPARE_COLUMNS

    keys = [key for key, *_ in COMPARE_COLUMNS]
    csv_rows = []
    for label, entry in data["policies"].items():
        change = entry.get("change_vs_default") or {}
        csv_rows.append([label, *(_raw(entry.get(k)) for k in keys), *(_raw(change.get(k)) for k in keys)])
    for label, key in ((BOUND_LABEL, "bound"), (ACHIEVABLE_LABEL, "achievable")):
        if data.get(key):
            csv_rows.append([label, *(_raw(data[key].get(k)) for k in keys), *("" for _ in keys)])
    typer.echo(csv_text(["policy", *keys, *(f"{k}_change" for k in keys)], csv_rows))


def _raw(value: Any) -> str:
    return "" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))


def footer_lines(comparison: Any, settings: Any, split: dict[str, Any], hidden: list[str]) -> list[str]:
    """The plain lines under the table (two sentences, four lines at 80 columns): the requests and the
    baseline; where the optimum lies and what was left out to fit. The bound's method is in
    docs/compare.md and under ``--format markdown``."""
    counts = next(iter(comparison.summaries.values()))
    first = (f"{_count(counts.get('short_count'))} short / {_count(counts.get('long_count'))} long requests"
             f"{_split_note(split, comparison)}; {_baseline_note(comparison.baseline)}.")
    second = bracket_line(comparison, settings)
    if hidden:
        second += f" --wide adds {', '.join(hidden)}."
    return [first, second]


def bracket_line(comparison: Any, settings: Any) -> str:
    """Where the optimum short TTFT p95 lies, in one plain sentence."""
    key = "short_ttft_p95_ms"
    bound = comparison.bound.get(key)
    if bound is None:
        return "No short requests: no bound on their TTFT."
    floor = f"Short TTFT p95: no schedule beats {ms(bound)} (proven lower bound)"
    reference = comparison.achievable
    if reference is None or reference.get(key) is None:
        why = "the 1p1d topology" if settings.topology != "mixed" else "--no-achievable"
        return f"{floor}; no clairvoyant reference ({why})."
    reached = reference[key]
    rows = [(summary[key], label) for label, summary in comparison.summaries.items() if summary.get(key) is not None]
    best_value, best_label = min(rows) if rows else (None, None)
    if best_value is not None and best_value < reached:
        return f"{floor}; {best_label} reaches {ms(best_value)}, a clairvoyant schedule {ms(reached)}."
    return f"{floor}; a clairvoyant schedule reaches {ms(reached)}."


def _print_fleet(console: Any, comparison: Any) -> None:
    """Per row: the requests each replica got, the imbalance and, with a gateway, its wait."""
    from rich.markup import escape

    for label, run in comparison.last_runs.items():
        fleet = run.fleet
        shares = "/".join(str(replica["requests"]) for replica in fleet["per_replica"])
        gateway = fleet.get("gateway")
        held = (f"; gateway {gateway['policy']} held {gateway['held']}, wait p95 "
                f"{gateway['wait_ms_p95'] or 0:,.0f} ms" if gateway else "")
        console.print(f"[dim]{escape(label)}: requests per replica {shares}, token imbalance (max/mean) "
                      f"{fleet['token_imbalance']:.2f}{held}[/dim]", highlight=False)


def _print_prefix_cache(console: Any, comparison: Any) -> None:
    """With prefix caching: each row's hit rate and the prompt tokens it prefilled."""
    from rich.markup import escape

    rows = [(label, summary) for label, summary in comparison.summaries.items()
            if summary.get("prefix_cache_hit_rate") is not None]
    if not rows:
        return
    parts = ", ".join(f"{escape(label)} {summary['prefix_cache_hit_rate']:.1%} ({summary['prefill_tokens']:,.0f} "
                      "tokens prefilled)" for label, summary in rows)
    console.print(f"[dim]prefix cache hit rate (hit / looked-up tokens at admission): {parts}[/dim]",
                  highlight=False)


def _baseline_note(baseline: str | None) -> str:
    """What the % changes are measured against, in words."""
    from rich.markup import escape

    if baseline is None:
        return "no % change: no row runs plain default (add --policy default)"
    if baseline == "default":
        return "% change vs default"
    return f"% change vs {escape(baseline)} (plain default)"


def _split_note(split: dict[str, Any], comparison: Any = None) -> str:
    """The split in words, for the line under the table (for a scenario, whose requests carry a class: the
    prompt lengths each class spans, so a threshold warning's own count can be read against it)."""
    method, threshold = split["method"], split["threshold"]
    if method == "scenario":
        rows = next(iter(comparison.records.values()), []) if comparison is not None else []
        short = [rec.prompt_tokens for _, rec in rows if rec.klass == "short"]
        long = [rec.prompt_tokens for _, rec in rows if rec.klass == "long"]
        if short and long and max(short) >= min(long):
            return (f" (classes as the scenario assigns them, not by prompt length: short prompts reach "
                    f"{max(short):,} tokens)")
        if short and long:
            return f" (the scenario's classes: short prompts up to {max(short):,} tokens, long from {min(long):,})"
        return ""
    if method == "recorded":
        return " (classes as recorded in the trace)"
    if method == "user":
        return f" (short = prompt tokens <= {threshold}, from --long-threshold)"
    if threshold is None:
        return f" (split: {method})"
    return f" (short = prompt tokens <= {threshold}, the threshold prefillq tune chooses: {method})"


def _title(label: str, comparison: Any, settings: Any) -> str:
    where = ""
    if settings.pd is not None:
        pairs = f" x{settings.pd.pairs}" if settings.pd.pairs > 1 else ""
        where = f", topology 1p1d{pairs}"
    if settings.fleet is not None:
        fleet = settings.fleet
        where += f", {fleet.replicas} replicas ({fleet.router})"
        if fleet.max_inflight_per_replica is not None:
            where += f", in-flight cap {fleet.max_inflight_per_replica}"
    repeats = f", {settings.repeats} repeats (medians)" if settings.repeats > 1 else ""
    if settings.long_prefill_token_threshold:
        where += f", long_prefill_token_threshold {settings.long_prefill_token_threshold}"
    for key, value in settings.engine_options.items():
        where += f", {key} {value}"
    return (f"{label} — profile {comparison.profile}, mode {settings.mode}{where}, budget {comparison.budget} "
            f"tokens/step{repeats}")


def _write_files(comparison: Any, data: dict[str, Any], *, out: Path | None, json_path: Path | None, plots: bool,
                 title: str, split: dict[str, Any]) -> list[Path]:
    from prefillq.report import write_json, write_records_csv, write_summary_csv

    written: list[Path] = []
    if json_path is not None:
        written.append(write_json(json_path, data))
    if out is None:
        return written
    if json_path is None or Path(json_path).resolve() != (out / "summary.json").resolve():
        written.append(write_json(out / "summary.json", data))
    rows = {policy: {**summary, "split_threshold": split["threshold"], "split_method": split["method"]}
            for policy, summary in comparison.summaries.items()}
    written.append(write_summary_csv(out / "summary.csv", rows))
    written.append(write_records_csv(out / "records.csv", comparison.records))
    if plots:
        from prefillq.report.plots import queue_plot, ttft_cdf_plot

        last = comparison.last_runs
        written.append(ttft_cdf_plot(out / "ttft_cdf.png", {p: r.records for p, r in last.items()},
                                     bound_ttft_s=comparison.bound.get("ttft_s"), title=title))
        written.append(queue_plot(out / "queue.png", {p: r.timeline for p, r in last.items()},
                                  {p: r.lanes for p, r in last.items()}, title=title))
    from prefillq.report.html import write_html_report
    written.append(write_html_report(out, title, kind="compare"))
    return written


def _pd_settings(topology: str, pairs: int | None, busy_retry_timeout_s: str | None, prefill_waiting_limit: int | None,
                 decode_policy: str | None, decode_max_num_seqs: int | None, decode_kv_blocks: int | None) -> Any:
    """The PdConfig of the 1p1d options (None for mixed); bad values exit 2 with a clear message."""
    from prefillq.sim.pd import PdConfig, busy_retry_timeout_from_env, parse_busy_retry_timeout
    from prefillq.sim.simulator import TOPOLOGIES

    if topology not in TOPOLOGIES:
        fail(f"unknown topology {topology!r}; valid topologies: {', '.join(TOPOLOGIES)}")
    given = {"--pd-pairs": pairs, "--busy-retry-timeout-s": busy_retry_timeout_s,
             "--prefill-waiting-limit": prefill_waiting_limit, "--decode-policy": decode_policy,
             "--decode-max-num-seqs": decode_max_num_seqs, "--decode-kv-blocks": decode_kv_blocks}
    if topology == "mixed":
        used = [flag for flag, value in given.items() if value is not None]
        if used:
            fail(f"{', '.join(used)} applies to --topology 1p1d only")
        return None
    try:
        # the flag wins over the environment, which is then not read at all
        timeout = (parse_busy_retry_timeout(busy_retry_timeout_s, "--busy-retry-timeout-s")
                   if busy_retry_timeout_s is not None else busy_retry_timeout_from_env())
        return PdConfig(pairs=1 if pairs is None else pairs, busy_retry_timeout_s=timeout,
                        prefill_waiting_limit=prefill_waiting_limit, decode_policy=decode_policy or "default",
                        decode_max_num_seqs=decode_max_num_seqs, decode_kv_blocks=decode_kv_blocks)
    except ValueError as exc:
        fail(str(exc).replace("pairs (prefill/decode pairs)", "--pd-pairs"))
