"""pytest plugin for vLLM's own scheduler tests on a CPU-only machine (stock and prefillq runs alike).

vLLM 0.34's CPU platform refuses an x86 machine without a Triton CPU backend whenever a config is
built. These tests run only the scheduler (no kernel), so the flag is set as their own conftest would.
"""

from __future__ import annotations

import vllm.triton_utils

vllm.triton_utils.HAS_TRITON = True
