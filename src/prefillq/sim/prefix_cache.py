"""A block-level prefix cache over a simulated vLLM node's KV pool (vLLM's automatic prefix caching).

What vLLM V1 does (``vllm/v1/core``: ``KVCacheManager.get_computed_blocks`` and ``allocate_slots``,
``BlockPool.get_new_blocks``, ``touch``, ``free_blocks`` and ``cache_full_blocks``), in our words:

* Only *full* blocks are cached, each under a hash of its tokens chained to the blocks before it.
* When a waiting request is admitted, the scheduler looks up the longest run of its leading blocks
  that the cache holds. The hit stops one token short of the request: a prompt that hits completely
  still recomputes its last token (to get logits), so at most ``(tokens - 1) // block_size`` blocks hit.
  The hit is counted in the hit-rate statistics at admission only (a lookup for a request that then
  does not fit is not counted); ``queries`` adds the request's tokens, ``hits`` the hit tokens. A
  preempted request is looked up again when it is admitted again (its tokens then include the output
  it had), and that lookup is counted apart, in ``preempted_*`` counters, out of the hit rate
  (``PrefixCacheStats.record`` in ``vllm/v1/metrics/stats.py``), so simulated and measured rates compare.
* Before admission, the policy's view of a waiting request carries the hit a lookup would find now
  (``cached_tokens``, as the vLLM integration's ``_prefix_hit`` probe does), so HRRN costs it by its
  uncached tokens (``VllmNode._prefix_view``).
* A hit block gains a reference (``touch``); if nobody held it, it leaves the free queue, so taking it
  costs a free block as a new block would.
* Blocks are cached as soon as they are allocated for a chunk that fills them (scheduling time).
* A request's freed blocks keep their hash: with no reference left they are *free but cached*, at the
  back of the free queue, in LRU order (a request's blocks are freed tail first, so its tail goes
  first). Blocks without a hash go to the front of the free queue and are reused first.
* A new block is taken from the front of the free queue; taking a cached block evicts its hash.

So the free queue is always "uncached free blocks, then cached free blocks from least to most
recently freed": :class:`PrefixCache` keeps the first part as a count and the second as an ordered
dict, and every operation costs O(blocks it touches).

Simplification: when a request fills a block whose hash the cache already holds (two requests that
computed the same block at once), vLLM caches the second copy too; here it stays an uncached block.

Block identity: a request's hashes are a trace's ``hash_ids`` (Mooncake: one id per
``hash_block_tokens`` tokens, chained, so one id stands for the whole prefix up to its block). The
engine block ``b`` (tokens ``[b * block_size, (b + 1) * block_size)``) is identified by the id of the
trace block holding its last token and by ``b``; only blocks that lie wholly inside the hashed part of
the prompt are cacheable (output tokens and the chat template's tokens have no hash).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from prefillq.workload import Workload

BlockKey = tuple[int, int]


class PrefixState:
    """A request's prefix-cache bookkeeping on a node (only requests with hashes get one)."""

    __slots__ = ("block_keys", "hit_tokens", "keys", "next_block", "probe_hit", "probe_version")

    def __init__(self, block_keys: list[BlockKey] | None = None) -> None:
        self.block_keys = block_keys or []  # the keys of its cacheable blocks (computed once)
        self.keys: list[BlockKey] = []  # cached blocks it references, in block order
        self.next_block = 0             # blocks up to here were considered for caching
        self.hit_tokens = -1            # tokens its first admission found cached (-1: not admitted yet)
        self.probe_version = -1         # the cache version of the last probe and what it found
        self.probe_hit = 0


class PrefixCache:
    """The cached blocks of one node's KV pool and the free queue's order (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, hash_block_tokens: int) -> None:
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        self.refs: dict[BlockKey, int] = {}                   # cached block -> requests referencing it
        self.evictable: OrderedDict[BlockKey, None] = OrderedDict()  # cached, unreferenced, LRU first
        self.uncached_free = num_blocks                       # free blocks without a hash
        self.version = 0                                      # bumped whenever a block is cached or evicted
        self.queries = 0                                      # tokens of the requests admitted (first time)
        self.hits = 0                                         # of which found cached
        self.preempted_requests = 0                           # re-admissions of preempted requests
        self.preempted_queries = 0                            # their tokens (prompt plus output so far)
        self.preempted_hits = 0                               # of which found cached
        self.evictions = 0

    @property
    def free(self) -> int:
        return self.uncached_free + len(self.evictable)

    # --- a request's blocks ------------------------------------------------------------------------

    def block_keys(self, hashes: Sequence[int], hashed_tokens: int) -> list[BlockKey]:
        """The keys of the engine blocks wholly inside the hashed part of a prompt of ``hashed_tokens``."""
        size, per_hash = self.block_size, self.hash_block_tokens
        count = min(len(hashes) * per_hash, hashed_tokens) // size
        return [(hashes[((b + 1) * size - 1) // per_hash], b) for b in range(count)]

    def lookup(self, keys: Sequence[BlockKey], max_blocks: int) -> int:
        """How many leading blocks (at most ``max_blocks``) the cache holds."""
        refs = self.refs
        hit = 0
        for key in keys[:max_blocks]:
            if key not in refs:
                break
            hit += 1
        return hit

    def evictable_among(self, keys: Sequence[BlockKey], blocks: int) -> int:
        """How many of the first ``blocks`` (all cached) nobody references: taking them uses free blocks."""
        refs = self.refs
        return sum(1 for key in keys[:blocks] if refs[key] == 0)

    def take_hit(self, keys: Sequence[BlockKey], blocks: int, state: PrefixState) -> None:
        """Reference the first ``blocks`` blocks (a hit at admission)."""
        refs = self.refs
        for key in keys[:blocks]:
            if refs[key] == 0:
                del self.evictable[key]
            refs[key] += 1
            state.keys.append(key)
        state.next_block = blocks

    def cache_full(self, keys: Sequence[BlockKey], upto_block: int, state: PrefixState) -> None:
        """The request's blocks below ``upto_block`` are now full (allocated for a scheduled chunk): cache
        the ones not cached yet (a block whose hash is already cached stays uncached)."""
        refs = self.refs
        for key in keys[state.next_block:upto_block]:
            if key not in refs:
                refs[key] = 1
                state.keys.append(key)
                self.version += 1
        if upto_block > state.next_block:
            state.next_block = upto_block

    # --- the free queue ----------------------------------------------------------------------------

    def allocate(self, count: int) -> None:
        """Take ``count`` blocks from the front of the free queue (the caller checked there are enough)."""
        plain = min(count, self.uncached_free)
        self.uncached_free -= plain
        count -= plain
        if count:
            evictable = self.evictable
            refs = self.refs
            for _ in range(count):
                key, _ = evictable.popitem(last=False)
                del refs[key]
            self.evictions += count
            self.version += 1

    def release(self, uncached: int, state: PrefixState | None) -> int:
        """A request frees ``uncached`` blocks without a hash and its cached ones (tail first); return how
        many blocks became free (a cached block another request still references does not)."""
        self.uncached_free += uncached
        if state is None:
            return uncached
        refs = self.refs
        freed = uncached
        for key in reversed(state.keys):
            left = refs[key] - 1
            refs[key] = left
            if left == 0:
                self.evictable[key] = None
                freed += 1
        state.keys = []
        state.next_block = 0
        return freed

    def record(self, tokens: int, hit_tokens: int, preempted: bool) -> None:
        """Count an admission's lookup: a first admission in the hit rate, a re-admission apart (vLLM's way)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += tokens
            self.preempted_hits += hit_tokens
        else:
            self.queries += tokens
            self.hits += hit_tokens

    def stats(self) -> dict[str, Any]:
        return {"queried_tokens": self.queries, "hit_tokens": self.hits,
                "hit_rate": self.hits / self.queries if self.queries else 0.0, "evicted_blocks": self.evictions,
                "preempted_requests": self.preempted_requests, "preempted_queried_tokens": self.preempted_queries,
                "preempted_hit_tokens": self.preempted_hits}


def best_case_uncached(workload: Workload, block_size: int, hash_block_tokens: int,
                       template_tokens: int = 0) -> Workload:
    """``workload`` with each prompt cut by the most a prefix cache could ever give it, for lower bounds.

    A request's engine block ``b`` can hit only if some other request that arrived no later (the same
    instant included: either may be admitted first) carried the hash of the trace block holding ``b``'s
    last token; the count of leading blocks for which that holds, capped as at admission a token short
    of what the engine computes (prompt plus ``template_tokens``), bounds its hit from above, whatever
    the cache size, the eviction or the number of replicas. The template's tokens follow the hashed
    prompt, so a whole prompt can hit when the template adds a token or more. A preempted request is
    looked up again with its output tokens added, but only one that had no first token yet matters for
    TTFT, and its cap is the same. Requests without hashes keep their prompts; every returned prompt
    is the tokens still to compute *less* ``template_tokens`` (what ``lower_bounds`` adds back).
    """
    ordered = sorted(workload.requests, key=lambda r: r.arrival_s)
    seen: set[int] = set()   # hashes of the requests that arrived strictly earlier
    relaxed = []
    start = 0
    while start < len(ordered):
        stop = start
        while stop < len(ordered) and ordered[stop].arrival_s == ordered[start].arrival_s:
            stop += 1
        group = ordered[start:stop]
        holders: dict[int, int] = {}  # hash -> requests of this instant that carry it
        for spec in group:
            for key in set(spec.hash_ids or ()):
                holders[key] = holders.get(key, 0) + 1
        for spec in group:
            hashes = spec.hash_ids
            if hashes is None:
                relaxed.append(spec)
                continue
            own = set(hashes)
            most = min(min(len(hashes) * hash_block_tokens, spec.prompt_tokens) // block_size,
                       (spec.prompt_tokens + template_tokens - 1) // block_size)
            hit = 0
            while hit < most:
                key = hashes[((hit + 1) * block_size - 1) // hash_block_tokens]
                if key not in seen and holders.get(key, 0) - (key in own) <= 0:
                    break
                hit += 1
            relaxed.append(replace(spec, prompt_tokens=spec.prompt_tokens - hit * block_size, hash_ids=None))
        for spec in group:
            seen.update(spec.hash_ids or ())
        start = stop
    return Workload(name=workload.name, requests=relaxed, params=dict(workload.params))


__all__ = ["BlockKey", "PrefixCache", "PrefixState", "best_case_uncached"]
