"""Disaggregated prefill/decode (PD): a router in front of prefill/decode node pairs (SPEC §5).

``nodes.py`` holds the requests and the two node roles, ``router.py`` the router, ``system.py`` the
settings (:class:`PdConfig`) and the event loop (:class:`PdSystem`).

    simulate(workload, "hrrn", topology="1p1d")                       # one prefill + one decode node
    simulate(workload, "hrrn", topology="1p1d", pd=PdConfig(pairs=2, busy_retry_timeout_s=0.5))

The pieces, each a small variation of an engine node (``sim/vllm.py``, ``sim/lightllm.py``):

* **Prefill node** (:class:`PrefillNode`): runs the policy queue exactly like a mixed node (same step
  loop, same ``on_prefill_submitted`` call every step) but never decodes. The step that completes a
  prompt samples the request's first token, and the request's KV blocks stay held on the prefill
  node until the decode node has pulled them.
* **Decode node** (:class:`DecodeNode`): decodes only. A request that finished its prefill waits in
  the decode node's inbound queue (FCFS) until a running seat (its own ``max_num_seqs``) and KV
  blocks for the prompt are free; the decode node then reserves the blocks and pulls the KV over the
  pair's link. Transfers on one link run one after another; each takes
  ``(bytes_per_token * tokens + bytes_per_request) / link_bytes_per_s`` (the profile's
  ``kv_transfer``). The prefill node frees its copy when the transfer ends; the request decodes from
  the decode node's next step. When a running decode needs a KV block and none is free, the decode
  node ends the newest running request's *segment* (where a mixed vLLM node would preempt it).
* **Router** (:class:`Router`): sends each client request to a pair (round-robin), holds requests in
  an admission queue ordered by ``admission_priority`` then arrival when a prefill node's waiting
  queue is at its configured limit, resubmits a cut request as a continuation segment, and, only
  when enabled, retries a request that found its pair busy on another pair.

Decisions (documented in docs/pd.md):

* **TTFT** is the end of the prefill step on the prefill node: that node samples the first token and
  the router streams it straight to the client, as in LightLLM's and vLLM's PD modes. The KV
  transfer therefore shows up in the gap to the second token and in E2E, not in TTFT.
* **Continuation segments.** A cut request comes back as segment k+1: prompt = original prompt +
  every token generated so far, allowance = the tokens still owed, on the *same* pair, straight into
  that prefill node's queue (it was admitted already). Its internal inference priority is -1
  (:func:`internal_priority`); a first segment's is always 0, whatever its cached tokens. The
  continuation's prefill recomputes the whole extended prompt (no prefix cache is modelled). The
  client sees one request: one record whose TTFT and E2E span every segment.
* **Two priorities.** ``admission_priority`` (from the workload, e.g. a trace's field of that name)
  orders only the router's admission queue. The internal ``priority`` that the prefill queue orders
  by is set here, from the segment index, and from nowhere else.
* **Busy-node retry** is off unless ``busy_retry_timeout_s > 0`` (or the environment variable
  ``PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S``). A pair is busy when its prefill node's waiting queue is at
  the configured limit or its decode node is full (no free seat, no free KV block, or requests
  already waiting for one). With retry on, a request whose home pair is busy goes to the first pair
  that is not; if every pair is busy the router keeps trying for at most the timeout, then sends it
  home. Retries happen only before a request's first token: continuation segments never move.
"""

from prefillq.sim.pd.nodes import (
    CONTINUATION_PRIORITY,
    ClientRequest,
    DecodeNode,
    LightLLMPrefillNode,
    Pair,
    PrefillNode,
    SegmentRequest,
    internal_priority,
    segment_view,
)
from prefillq.sim.pd.router import BUSY_RETRY_ENV, Router, busy_retry_timeout_from_env, parse_busy_retry_timeout
from prefillq.sim.pd.system import PdConfig, PdSystem, token_times

__all__ = ["BUSY_RETRY_ENV", "CONTINUATION_PRIORITY", "ClientRequest", "DecodeNode", "LightLLMPrefillNode", "Pair",
           "PdConfig", "PdSystem", "PrefillNode", "Router", "SegmentRequest", "busy_retry_timeout_from_env",
           "internal_priority", "parse_busy_retry_timeout", "segment_view", "token_times"]
