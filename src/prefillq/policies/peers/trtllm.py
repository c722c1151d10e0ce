"""TensorRT-LLM's ``context_scheduling_policy = "shortest_uncached_first"`` with
``context_starvation_iterations``, as documented for release 1.4 (``SchedulerConfig`` in the LLM API
reference of 1.4.0rc4, NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``).

Pending context requests are admitted fewest uncached prompt tokens first (the prompt less what reusable
KV covers, read at every pass); a request that has waited more than ``context_starvation_iterations``
scheduler iterations goes ahead of them, oldest first. The starvation counter counts iterations (steps),
not tokens or seconds: a long request's wait is bounded in steps, whatever they carry. The engine
re-sorts its pending list each iteration, O(n log n) per pass, and is emulated as such.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from prefillq.policies.base import MEMORY_LIMIT, Entry
from prefillq.policies.peers.sorted_list import SortedEachPassQueue

# TensorRT-LLM leaves the guard off by default (None). The emulation turns it on with this many
# iterations (our choice: about 2 s of 30 ms steps), so that the row shows the rule it is named for.
STARVATION_ITERATIONS = 64


class TRTLLMShortestUncachedQueue(SortedEachPassQueue):
    """``trtllm_suf``: starved requests (waited > N iterations) first, oldest first; then fewest uncached."""

    policy = "trtllm_suf"
    starvation_iterations = STARVATION_ITERATIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The iteration at which each request first entered (kept when it is popped and handed back).
        self._entered_at: OrderedDict[str, int] = OrderedDict()

    def _insert_rest(self, entry: Entry) -> None:
        if entry.key not in self._entered_at:
            self._entered_at[entry.key] = self._steps
            if len(self._entered_at) > MEMORY_LIMIT:
                self._entered_at.popitem(last=False)
        super()._insert_rest(entry)

    def _sort_key(self, entry: Entry) -> tuple[int, int, int]:
        entered = self._entered_at.get(entry.key, self._steps)
        if self._steps - entered > self.starvation_iterations:
            return (0, entered, entry.arrival)
        return (1, entry.view.remaining_prefill_tokens, entry.arrival)
