"""The vLLM general plugin that asks Linux for AMX tile state (``prefillq.integrations.cpu``).

The CPU facts are injected (a stand-in ``torch`` module), so every branch runs on any machine, with or
without AMX or torch."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from types import SimpleNamespace
from typing import Any

import pytest

from prefillq.integrations.cpu import enable_amx


def test_the_plugin_is_registered_where_vllm_looks_for_general_plugins() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("prefillq_cpu_amx") == "prefillq.integrations.cpu:enable_amx"


class FakeTorch:
    """What enable_amx reads of torch: whether the CPU has AMX tiles, and the call that asks the kernel."""

    def __init__(self, has_amx: Any, kernel_grants: bool = True, cpu_build: bool = True) -> None:
        self.asked = 0

        def init_amx() -> bool:
            self.asked += 1
            return kernel_grants

        def supported() -> bool:
            if isinstance(has_amx, Exception):
                raise has_amx
            return has_amx

        self._C = SimpleNamespace(_cpu=SimpleNamespace(_init_amx=init_amx) if cpu_build else None)
        self.cpu = SimpleNamespace(_is_amx_tile_supported=supported)


@pytest.mark.parametrize(("facts", "granted", "asked"), [
    ({"has_amx": True}, True, 1),                                  # AMX, the kernel grants it
    ({"has_amx": True, "kernel_grants": False}, False, 1),         # AMX, the kernel refuses
    ({"has_amx": False}, False, 0),                                # no AMX: the kernel is not asked
    ({"has_amx": True, "cpu_build": False}, False, 0),             # a torch without the CPU extension
    ({"has_amx": AttributeError("moved")}, False, 0),              # an internal torch API moved
])
def test_enable_amx_asks_the_kernel_exactly_when_the_cpu_has_amx(monkeypatch: pytest.MonkeyPatch,
                                                                 facts: dict[str, Any], granted: bool,
                                                                 asked: int) -> None:
    torch = FakeTorch(**facts)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert enable_amx() is granted
    assert torch.asked == asked
    assert enable_amx() is granted  # asking again is harmless (vLLM loads plugins in every process)
    assert torch.asked == 2 * asked


def test_enable_amx_without_torch_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert enable_amx() is False
