"""The vLLM general plugin that asks Linux for AMX tile state (``prefillq.integrations.cpu``)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

from prefillq.integrations.cpu import enable_amx


def test_the_plugin_is_registered_where_vllm_looks_for_general_plugins() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("prefillq_cpu_amx") == "prefillq.integrations.cpu:enable_amx"


def test_enable_amx_grants_exactly_when_the_cpu_has_amx() -> None:
    import torch

    assert enable_amx() is torch.cpu._is_amx_tile_supported()
    assert enable_amx() is enable_amx()  # asking again is harmless (vLLM loads plugins in every process)


def test_enable_amx_without_torch_does_nothing() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from prefillq.integrations.cpu import enable_amx\n"
            "print(enable_amx())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
