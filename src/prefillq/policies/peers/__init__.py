"""Other engines' own prefill-queue options, emulated on our contract so that the simulator can run them
beside ours (docs/peers.md). One small file per engine; each class names the release or commit its rules
were read from. They are for comparison: the vLLM plug-in does not offer them."""

from __future__ import annotations

from prefillq.policies.peers.dynamo import DynamoWSPTQueue
from prefillq.policies.peers.sglang import SGLangHRRNQueue, SGLangSPFQueue
from prefillq.policies.peers.trtllm import TRTLLMShortestUncachedQueue

PEER_QUEUES = {
    "sglang_hrrn": SGLangHRRNQueue,
    "sglang_spf": SGLangSPFQueue,
    "trtllm_suf": TRTLLMShortestUncachedQueue,
    "dynamo_wspt": DynamoWSPTQueue,
}

__all__ = ["PEER_QUEUES", "DynamoWSPTQueue", "SGLangHRRNQueue", "SGLangSPFQueue", "TRTLLMShortestUncachedQueue"]
