"""A request that can never fit the KV cache stops the run with a clear error (request, tokens, capacity),
whichever engine mode or topology, even when its first chunk fits."""

from __future__ import annotations

import pytest

from prefillq.sim import SimulationError, simulate

from .test_pd_topology import profile as pd_profile
from .test_sim_engine import workload

# 40 blocks of 16 tokens = 640 tokens of KV; a 1000-token prompt's first 256-token chunk fits.
KV_BLOCKS = 40
CAPACITY_TOKENS = KV_BLOCKS * 16


@pytest.mark.parametrize("mode", ["vllm", "lightllm"])
@pytest.mark.parametrize("topology", ["mixed", "1p1d"])
def test_a_prompt_larger_than_the_kv_cache_names_request_prompt_and_capacity(mode, topology):
    w = workload(("small", 0.0, 50, 2), ("huge", 0.0, 1000, 2), ("after", 0.5, 50, 2))
    prof = pd_profile(kv_blocks=KV_BLOCKS, block_size=16)
    with pytest.raises(SimulationError) as failure:
        simulate(w, "default", profile=prof, budget=256, mode=mode, topology=topology)
    message = str(failure.value)
    assert "request huge" in message
    assert "1000 prompt tokens" in message
    assert f"{CAPACITY_TOKENS} tokens" in message
    assert "preemption left nothing to run" not in message


def test_a_prompt_larger_than_the_decode_nodes_kv_names_request_prompt_and_capacity():
    w = workload(("huge", 0.0, 1000, 3))
    with pytest.raises(SimulationError) as failure:
        simulate(w, "default", profile=pd_profile(kv_blocks=200), budget=256, topology="1p1d",
                 pd={"decode_kv_blocks": KV_BLOCKS})
    message = str(failure.value)
    assert "request huge" in message and "1000 prompt tokens" in message
    assert f"decode node's KV cache holds {KV_BLOCKS} blocks ({CAPACITY_TOKENS} tokens)" in message


def test_a_request_that_fits_exactly_still_runs():
    w = workload(("exact", 0.0, CAPACITY_TOKENS, 1))
    res = simulate(w, "default", profile=pd_profile(kv_blocks=KV_BLOCKS, block_size=16), budget=256)
    assert res.summary["completed"] == 1
