"""Keys that follow the prefix cache (SPEC §4.1): a waiting request's remaining uncached work, re-read when
it can change. Does not import vLLM; the plug-in (:mod:`prefillq.integrations.vllm`) drives it.

A waiting request's prefix-cache hit is the longest run of its leading hash blocks that the cache holds.
It grows exactly when its *next* uncached block becomes cached, and vLLM caches a block when a request
computing it is scheduled. So each waiting request is indexed under the hash of its next uncached block;
after every step, the blocks that the step's scheduled requests filled are looked up in that index, and
only the waiting requests they extend are refreshed in the queue (their place, arrival and frozen cost
stay; their remaining work shrinks). The cost per step is one dictionary lookup per block the step filled,
whatever the queue's length. A hit that shrinks (its blocks were evicted) is not re-read: the request
keeps its smaller key until it is admitted, when vLLM's own lookup decides what it computes; eviction
only hits blocks nobody holds, the least recently used first.
"""

from __future__ import annotations

from typing import Any

from prefillq.policies import PolicyQueue


class CacheKeys:
    """The index of waiting requests by their next uncached block, for one scheduler's queue."""

    def __init__(self, queue: PolicyQueue, hash_block_size: int) -> None:
        self.queue = queue
        self.hash_block_size = hash_block_size
        self._waiting_on: dict[Any, dict[str, Any]] = {}  # block hash -> {request id: request}
        self._indexed_under: dict[str, Any] = {}  # request id -> the hash it is indexed under
        self.refreshed = 0  # requests whose key moved because another request filled their next block

    def seen(self, request: Any, cached: int) -> None:
        """The queue read ``request``'s view with ``cached`` hit tokens: index it under its next block."""
        self.forget(request)
        hashes = request.block_hashes
        index = cached // self.hash_block_size
        if index < len(hashes):
            self._waiting_on.setdefault(hashes[index], {})[request.request_id] = request
            self._indexed_under[request.request_id] = hashes[index]

    def forget(self, request: Any) -> None:
        """Drop ``request`` from the index (re-indexed, or finished: an aborted waiting request whose next
        block nobody computes would otherwise stay indexed)."""
        block = self._indexed_under.pop(request.request_id, None)
        if block is not None:
            waiting = self._waiting_on.get(block)
            if waiting is not None:
                waiting.pop(request.request_id, None)
                if not waiting:
                    del self._waiting_on[block]

    def after_step(self, scheduled: dict[str, int], requests: dict[str, Any]) -> None:
        """``scheduled``: this step's tokens per request (their ``num_computed_tokens`` already advanced)."""
        if not self._waiting_on:
            return
        size = self.hash_block_size
        queue = self.queue
        for request_id, tokens in scheduled.items():
            request = requests.get(request_id)
            if request is None:
                continue
            end = request.num_computed_tokens
            hashes = request.block_hashes
            for index in range((end - tokens) // size, min(end // size, len(hashes))):
                waiting = self._waiting_on.pop(hashes[index], None)
                if not waiting:
                    continue
                for other in waiting.values():
                    self._indexed_under.pop(other.request_id, None)
                    if other in queue:
                        queue.refresh_request(other)  # its view re-reads the hit and indexes it again
                        self.refreshed += 1
