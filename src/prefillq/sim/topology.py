"""Disaggregated prefill/decode (PD): a router in front of prefill/decode node pairs (SPEC §5).

    simulate(workload, "hrrn", topology="1p1d")                       # one prefill + one decode node
    simulate(workload, "hrrn", topology="1p1d", pd=PdConfig(pairs=2, busy_retry_timeout_s=0.5))

The pieces, each a small variation of the vLLM-mode engine of ``engine.py``:

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

from __future__ import annotations

import heapq
import itertools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prefillq.config import load_config, validate_deployment
from prefillq.metrics import RequestRecord, percentile
from prefillq.requests import QueuedRequest
from prefillq.sim.costs import CostModel, KvTransfer
from prefillq.sim.engine import DECODE, EngineLimits, SimRequest, SimulationError, VllmNode
from prefillq.sim.lightllm import LightLLMNode
from prefillq.workload import RequestSpec, Workload

BUSY_RETRY_ENV = "PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S"
CONTINUATION_PRIORITY = -1
TRANSFER_WAIT, TRANSFERRING, CUT = "transfer-wait", "transferring", "cut"


def internal_priority(segment_index: int) -> int:
    """The internal inference priority of a segment: elevated (-1) only for continuations (SPEC §5)."""
    return CONTINUATION_PRIORITY if segment_index > 0 else 0


def parse_busy_retry_timeout(value: Any, source: str = "busy retry timeout") -> float:
    """A busy-retry timeout in seconds (0 = retry disabled); ValueError naming ``source`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{source} must be a number of seconds >= 0, got {value!r}")
    try:
        seconds = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a number of seconds >= 0 (0 disables retry), got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{source} must be a finite number of seconds >= 0 (0 disables retry), got {value!r}")
    return seconds


def busy_retry_timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S`` (0 when unset or empty); ValueError for a bad value."""
    env = os.environ if environ is None else environ
    text = env.get(BUSY_RETRY_ENV, "")
    if not text.strip():
        return 0.0
    return parse_busy_retry_timeout(text, BUSY_RETRY_ENV)


@dataclass(frozen=True)
class PdConfig:
    """How the disaggregated topology is built (every ``None`` takes the engine's or profile's value).

    ``busy_retry_timeout_s=None`` reads ``PREFILLQ_PD_BUSY_RETRY_TIMEOUT_S`` (0, i.e. off, when unset).
    ``prefill_waiting_limit`` is the router's admission limit: at most that many requests wait in a
    prefill node's queue; further ones wait in the router (None: no limit). ``decode_policy`` orders
    a decode node's inbound queue; ``short_request_first`` is refused there (SPEC §3.4).
    """

    pairs: int = 1
    busy_retry_timeout_s: float | None = None
    prefill_waiting_limit: int | None = None
    decode_policy: str = "default"
    decode_max_num_seqs: int | None = None
    decode_kv_blocks: int | None = None
    kv_bytes_per_token: float | None = None
    link_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pairs, bool) or not isinstance(self.pairs, int) or self.pairs < 1:
            raise ValueError(f"pairs (prefill/decode pairs) must be an int >= 1, got {self.pairs!r}")
        if self.busy_retry_timeout_s is not None:
            object.__setattr__(self, "busy_retry_timeout_s",
                               parse_busy_retry_timeout(self.busy_retry_timeout_s, "busy_retry_timeout_s"))
        for name in ("prefill_waiting_limit", "decode_max_num_seqs", "decode_kv_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("kv_bytes_per_token", "link_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < 0
                                      or (name == "link_bytes_per_s" and value == 0)):
                raise ValueError(f"{name} must be a finite number {'> 0' if name == 'link_bytes_per_s' else '>= 0'}"
                                 f", got {value!r}")
        decode = load_config(self.decode_policy)  # ConfigError (a ValueError) for an unknown policy
        validate_deployment(decode, kv_role="kv_consumer")
        object.__setattr__(self, "decode_policy", decode.policy)

    @classmethod
    def from_value(cls, value: PdConfig | Mapping[str, Any] | None) -> PdConfig:
        """A PdConfig from itself, a dict of its fields, or None (all defaults)."""
        if value is None:
            return cls()
        if isinstance(value, PdConfig):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"unknown PD setting(s) {', '.join(unknown)}; valid: "
                                 f"{', '.join(cls.__dataclass_fields__)}")
            return cls(**value)
        raise ValueError(f"pd must be a PdConfig or a dict, got {type(value).__name__}")

    def retry_timeout_s(self, environ: Mapping[str, str] | None = None) -> float:
        """The effective busy-retry timeout: this config's, else the environment's, else 0."""
        if self.busy_retry_timeout_s is not None:
            return self.busy_retry_timeout_s
        return busy_retry_timeout_from_env(environ)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- requests ---------------------------------------------------------------------------------------


class ClientRequest:
    """What the client sent and saw: one per workload request, across all of its segments."""

    __slots__ = ("arrival_s", "dispatched_s", "finish_s", "first_token_s", "generated", "home", "pair",
                 "pieces", "retried", "retry_deadline_s", "segments", "spec", "template_tokens")

    def __init__(self, spec: RequestSpec, template_tokens: int) -> None:
        self.spec = spec
        self.template_tokens = template_tokens
        self.arrival_s = spec.arrival_s
        self.home = -1                       # the pair the router chose first
        self.pair = -1                       # the pair that served it (differs from home only on retry)
        self.retried = False
        self.retry_deadline_s = math.inf
        self.dispatched_s: float | None = None
        self.generated = 0                   # output tokens streamed so far
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.segments: list[SegmentRequest] = []
        # per segment: (time of its prefill token, the decode node, its decode token runs)
        self.pieces: list[tuple[float, DecodeNode | None, list[tuple[int, int]]]] = []


class SegmentRequest(SimRequest):
    """One segment of a client request as the nodes see it (segment 0 is the request as sent)."""

    __slots__ = ("admission_priority", "client", "decode_node", "generated_before", "prefill_node",
                 "segment_index", "transfer_bytes", "transfer_end_s", "transfer_start_s")

    def __init__(self, client: ClientRequest, segment_index: int, arrival_s: float) -> None:
        spec = client.spec
        request_id = spec.request_id if segment_index == 0 else f"{spec.request_id}~{segment_index}"
        super().__init__(RequestSpec(request_id, arrival_s, spec.prompt_tokens + client.generated,
                                     spec.output_tokens - client.generated, spec.klass), client.template_tokens)
        self.client = client
        self.generated_before = client.generated
        self.segment_index = segment_index
        self.admission_priority = spec.admission_priority
        self.transfer_start_s: float | None = None
        self.transfer_end_s: float | None = None
        self.transfer_bytes = 0.0
        self.prefill_node: PrefillNode | LightLLMPrefillNode | None = None
        self.decode_node: DecodeNode | None = None


def segment_view(request: SegmentRequest) -> QueuedRequest:
    """What a policy sees of a segment: the internal priority comes from the segment index only."""
    view = request.view
    if view is None:
        view = request.view = QueuedRequest(
            request_id=request.request_id, prompt_tokens=request.prompt_tokens,
            priority=internal_priority(request.segment_index), admission_priority=request.admission_priority,
            segment_index=request.segment_index)
    view.cached_tokens = request.num_computed
    view.output_tokens = request.generated_before + request.num_output
    view.resumed = (request.segment_index > 0 or request.preemptions > 0 or request.num_output > 0
                    or request.num_computed > 0)
    return view


# --- the two node roles ---------------------------------------------------------------------------


class PrefillNode(VllmNode):
    """A vLLM-mode node that only prefills; a finished prompt's KV waits here for its transfer."""

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 on_prefilled: Callable[[SegmentRequest, float], None],
                 on_finish: Callable[[SimRequest], None]) -> None:
        super().__init__(policy, cost, limits, record_steps=record_steps, on_finish=on_finish, view=segment_view)
        self.on_prefilled = on_prefilled
        self.held_blocks = 0  # blocks of finished prompts whose KV has not been pulled yet

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        if r.num_output >= r.output_tokens:  # an allowance of one token: done right here
            super()._prefill_completed(r, step, end)
            return
        r.status = TRANSFER_WAIT
        self.held_blocks += r.blocks
        self.on_prefilled(r, end)  # type: ignore[arg-type]

    def waiting_count(self) -> int:
        return len(self.waiting)

    def release(self, r: SegmentRequest) -> None:
        """The decode node has the KV: free this node's copy."""
        self.free_blocks += r.blocks
        self.held_blocks -= r.blocks
        r.blocks = 0

    def _may_idle_after_preemption(self) -> bool:
        return self.held_blocks > 0


class LightLLMPrefillNode(LightLLMNode):
    """A LightLLM-like prefill node (router admission, re-ranked ready list, skip-on-overflow), no decodes.

    Its router reserves only the prompt's KV (the output is decoded elsewhere) and keeps it reserved
    until the decode node has pulled it.
    """

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 on_prefilled: Callable[[SegmentRequest, float], None],
                 on_finish: Callable[[SimRequest], None], chunk_size: int | None = None) -> None:
        super().__init__(policy, cost, limits, record_steps=record_steps, chunk_size=chunk_size, view=segment_view)
        self.on_prefilled = on_prefilled
        self.on_finish = on_finish

    def waiting_count(self) -> int:
        """Requests whose prefill has not started or not finished (router queue + ready list)."""
        return len(self.router_queue) - self.router_head + len(self.ready)

    def _reservation(self, r: SimRequest) -> int:
        return r.prompt_tokens

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        if r.output_tokens <= 1:
            super()._prefill_completed(r, step, end)
            return
        r.status = TRANSFER_WAIT
        self.on_prefilled(r, end)  # type: ignore[arg-type]

    def release(self, r: SegmentRequest) -> None:
        """The decode node has the KV: free this node's reservation."""
        self.reserved_tokens -= self._reservation(r)


class DecodeNode(VllmNode):
    """A vLLM-mode node that only decodes; it pulls KV from its prefill node and cuts segments when full."""

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 on_transfer: Callable[[SegmentRequest, float], None],
                 on_cut: Callable[[SegmentRequest, int, float], None],
                 on_finish: Callable[[SimRequest], None]) -> None:
        super().__init__(policy, cost, limits, record_steps=record_steps, on_finish=on_finish, view=segment_view)
        self.on_transfer = on_transfer
        self.on_cut = on_cut
        self.in_transfer = 0                   # seats (and blocks) reserved by KV being pulled
        self.arrived: list[SegmentRequest] = []  # KV here; they join the decodes at the next step
        self.max_seats_used = 0
        self.cut_count = 0

    @property
    def seats_used(self) -> int:
        return len(self.decoding) + self.in_transfer + len(self.arrived)

    def is_full(self) -> bool:
        """No seat or no KV block for one more request (or requests already queue for one)."""
        return bool(self.waiting) or self.seats_used >= self.limits.max_num_seqs or self.free_blocks == 0

    def has_work(self) -> bool:
        return bool(self.arrived) or super().has_work()

    def accept(self, r: SegmentRequest, now: float) -> None:
        """A prefilled request asks for a seat (it waits in the inbound queue until one is free)."""
        r.decode_node = self
        self.add_request(r, now)

    def transfer_done(self, r: SegmentRequest) -> None:
        self.in_transfer -= 1
        r.status = DECODE
        self.arrived.append(r)

    def step(self, now: float) -> float | None:
        if self.arrived:
            # Requests whose KV arrived decode from this step on; their first token came from the
            # prefill node, so their decode run "started" at the previous step (a virtual index that
            # the records skip).
            for r in self.arrived:
                r.seq = self.next_seq
                self.next_seq += 1
                r.blocks = 0  # reserved at admission; implicit from here on, like any decode
                self._join_decodes(r, self.step_index - 1)
            self.arrived.clear()
        return super().step(now)

    def _admit_waiting(self, budget: int, step: int, chunks: list[tuple[SimRequest, int]]) -> int:
        """Inbound requests (FCFS by default) get a seat and KV blocks, then their KV transfer starts."""
        inbound = self.waiting
        while inbound and self.seats_used < self.limits.max_num_seqs:
            r: SegmentRequest = inbound.peek_request()
            need = -(-r.prompt_tokens // self.block_size)
            if need > self.free_blocks:
                if need > self.limits.kv_blocks:
                    raise SimulationError(f"request {r.request_id} needs {need} KV blocks but the decode node "
                                          f"has {self.limits.kv_blocks}")
                break
            popped = inbound.pop_request()
            assert popped is r, "the policy queue must pop the request it peeked"
            self.free_blocks -= need
            r.blocks = need
            r.status = TRANSFERRING
            self.in_transfer += 1
            self.on_transfer(r, self.now)
        seats = self.seats_used
        if seats > self.max_seats_used:
            self.max_seats_used = seats
        return budget

    def _preempt(self, r: SimRequest, step: int) -> None:
        """Out of KV: end ``r``'s segment here (its tokens so far stand); the router continues it."""
        assert r.status == DECODE, "a decode node runs only decodes"
        out = r.out_before(step)
        if step - 1 >= r.run_start_step:
            r.token_runs.append((r.run_start_step, step - 1))
        self.free_blocks += -(-(r.prompt_tokens + out - 1) // self.block_size)
        self._leave_decodes(r, out, r.prompt_tokens + out)
        r.status = CUT
        r.blocks = 0
        self.cut_count += 1
        self.on_cut(r, out, self.now)  # type: ignore[arg-type]

    def _may_idle_after_preemption(self) -> bool:
        return True


# --- a pair, the router, and the event loop ----------------------------------------------------------


@dataclass
class Pair:
    """One prefill node, one decode node, and the link between them."""

    index: int
    prefill: PrefillNode | LightLLMPrefillNode
    decode: DecodeNode
    link_free_s: float = 0.0
    transfers: int = 0
    transfer_bytes: float = 0.0
    transfer_s: list[float] = field(default_factory=list)


class Router:
    """Admission (ordered by admission priority, then arrival), pair choice and opt-in busy retry."""

    def __init__(self, pairs: list[Pair], *, retry_timeout_s: float, prefill_waiting_limit: int | None,
                 wake: Callable[[float], None]) -> None:
        self.pairs = pairs
        self.retry_timeout_s = retry_timeout_s
        self.prefill_waiting_limit = prefill_waiting_limit
        self.wake = wake                                    # ask the event loop to call dispatch() at a time
        self.held: list[list[tuple[int, float, int, ClientRequest]]] = [[] for _ in pairs]  # per home pair
        self.retrying: list[tuple[int, float, int, ClientRequest]] = []  # heap: waiting for any pair
        self.pending = 0
        self.next_home = 0
        self.order = itertools.count()
        self.retried = 0
        self.held_count = 0
        self.max_hold_s = 0.0

    def accepting(self, pair: Pair) -> bool:
        limit = self.prefill_waiting_limit
        return limit is None or pair.prefill.waiting_count() < limit

    def busy(self, pair: Pair) -> bool:
        return not self.accepting(pair) or pair.decode.is_full()

    def arrive(self, client: ClientRequest, now: float) -> None:
        home = self.pairs[self.next_home % len(self.pairs)]
        self.next_home += 1
        client.home = home.index
        if self.retry_timeout_s > 0 and len(self.pairs) > 1 and self.busy(home):
            other = self._first_free(home)
            if other is not None:
                self._send(client, other, now)
                return
            client.retry_deadline_s = now + self.retry_timeout_s
            heapq.heappush(self.retrying, self._key(client))
            self.pending += 1
            self.wake(client.retry_deadline_s)
            return
        if self.accepting(home) and not self.held[home.index]:
            self._send(client, home, now)
        else:
            heapq.heappush(self.held[home.index], self._key(client))
            self.pending += 1

    def dispatch(self, now: float) -> None:
        """Send what the pairs can take now (called between events)."""
        if not self.pending:
            return
        for pair in self.pairs:
            queue = self.held[pair.index]
            while queue and self.accepting(pair):
                self.pending -= 1
                self._send(heapq.heappop(queue)[3], pair, now)
        if self.retrying:
            kept: list[tuple[int, float, int, ClientRequest]] = []
            while self.retrying:
                entry = heapq.heappop(self.retrying)
                client = entry[3]
                home = self.pairs[client.home]
                target = home if not self.busy(home) else self._first_free(home)
                if target is not None:
                    self.pending -= 1
                    self._send(client, target, now)
                elif now >= client.retry_deadline_s:  # the timeout bounds the retrying: go home
                    if self.accepting(home) and not self.held[home.index]:
                        self.pending -= 1
                        self._send(client, home, now)
                    else:
                        heapq.heappush(self.held[home.index], entry)
                else:
                    kept.append(entry)
            self.retrying = kept
            heapq.heapify(self.retrying)

    def _key(self, client: ClientRequest) -> tuple[int, float, int, ClientRequest]:
        return (client.spec.admission_priority, client.arrival_s, next(self.order), client)

    def _first_free(self, home: Pair) -> Pair | None:
        count = len(self.pairs)
        for offset in range(1, count):
            pair = self.pairs[(home.index + offset) % count]
            if not self.busy(pair):
                return pair
        return None

    def _send(self, client: ClientRequest, pair: Pair, now: float) -> None:
        if pair.index != client.home:
            client.retried = True
            self.retried += 1
        if now > client.arrival_s:
            self.held_count += 1
            self.max_hold_s = max(self.max_hold_s, now - client.arrival_s)
        client.pair = pair.index
        client.dispatched_s = now
        segment = SegmentRequest(client, 0, now)
        client.segments.append(segment)
        segment.prefill_node = pair.prefill
        pair.prefill.add_request(segment, now)


NODE_FREE, HANDOFF, TRANSFER_DONE, CUT_EVENT, FINISH, WAKE = range(6)


class PdSystem:
    """Router + prefill/decode pairs, driven by one event loop over arrivals and node steps."""

    def __init__(self, policy: Any, cost: CostModel, prefill_limits: EngineLimits, decode_limits: EngineLimits,
                 transfer: KvTransfer, config: PdConfig, *, retry_timeout_s: float, mode: str = "vllm",
                 record_steps: bool = False, **prefill_options: Any) -> None:
        validate_deployment(load_config(policy), kv_role="kv_producer")
        if mode not in ("vllm", "lightllm"):
            raise ValueError(f"unknown mode {mode!r}; valid modes: vllm, lightllm")
        if prefill_options and mode != "lightllm":
            raise ValueError(f"unknown vllm-mode options: {', '.join(prefill_options)}")
        self.transfer = transfer
        self.config = config
        self.mode = mode
        self.events: list[tuple[float, int, int, Any]] = []
        self.order = itertools.count()
        self.pairs: list[Pair] = []
        for index in range(config.pairs):
            prefill_class = PrefillNode if mode == "vllm" else LightLLMPrefillNode
            prefill = prefill_class(policy, cost, prefill_limits, record_steps=record_steps,
                                    on_prefilled=self._on_prefilled, on_finish=self._on_finish, **prefill_options)
            decode = DecodeNode(config.decode_policy, cost, decode_limits, record_steps=record_steps,
                                on_transfer=self._on_transfer, on_cut=self._on_cut, on_finish=self._on_finish)
            self.pairs.append(Pair(index, prefill, decode))
        self.pair_of: dict[int, Pair] = {}
        for pair in self.pairs:
            self.pair_of[id(pair.prefill)] = pair
            self.pair_of[id(pair.decode)] = pair
        self.nodes = [node for pair in self.pairs for node in (pair.prefill, pair.decode)]
        self.busy = {id(node): False for node in self.nodes}
        self.router = Router(self.pairs, retry_timeout_s=retry_timeout_s,
                             prefill_waiting_limit=config.prefill_waiting_limit, wake=self._wake)
        self.clients: list[ClientRequest] = []
        self.finished = 0
        self.continuations = 0

    # --- callbacks from the nodes (they fire inside a step; the effect happens at the given time) -----

    def _push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.events, (at, next(self.order), kind, payload))

    def _wake(self, at: float) -> None:
        self._push(at, WAKE, None)

    def _on_prefilled(self, r: SegmentRequest, end: float) -> None:
        self._push(end, HANDOFF, r)

    def _on_transfer(self, r: SegmentRequest, now: float) -> None:
        pair = self.pair_of[id(r.decode_node)]
        start = max(now, pair.link_free_s)
        seconds = self.transfer.seconds(r.prompt_tokens)
        pair.link_free_s = start + seconds
        pair.transfers += 1
        r.transfer_bytes = self.transfer.transfer_bytes(r.prompt_tokens)
        pair.transfer_bytes += r.transfer_bytes
        pair.transfer_s.append(seconds)
        r.transfer_start_s = start
        r.transfer_end_s = start + seconds
        self._push(start + seconds, TRANSFER_DONE, r)

    def _on_cut(self, r: SegmentRequest, tokens: int, now: float) -> None:
        self._push(now, CUT_EVENT, (r, tokens))

    def _on_finish(self, r: SimRequest) -> None:
        self._push(r.finish_s, FINISH, r)

    # --- event handlers -------------------------------------------------------------------------------

    def _handle(self, kind: int, payload: Any, now: float) -> None:
        if kind == NODE_FREE:
            self.busy[id(payload)] = False
        elif kind == HANDOFF:
            r: SegmentRequest = payload
            client = r.client
            if client.first_token_s is None:
                client.first_token_s = r.first_token_s
            self.pairs[client.pair].decode.accept(r, now)
        elif kind == TRANSFER_DONE:
            r = payload
            pair = self.pair_of[id(r.decode_node)]
            pair.prefill.release(r)
            pair.decode.transfer_done(r)
        elif kind == CUT_EVENT:
            r, tokens = payload
            self._close_segment(r, tokens)
            client = r.client
            self.continuations += 1
            segment = SegmentRequest(client, len(client.segments), now)
            client.segments.append(segment)
            segment.prefill_node = self._prefill_of(client)
            segment.prefill_node.add_request(segment, now)  # same pair: no admission, no retry
        elif kind == FINISH:
            r = payload
            client = r.client
            if client.first_token_s is None:
                client.first_token_s = r.first_token_s
            self._close_segment(r, r.output_tokens)
            client.finish_s = r.finish_s
            self.finished += 1

    def _prefill_of(self, client: ClientRequest) -> PrefillNode | LightLLMPrefillNode:
        return self.pairs[client.pair].prefill

    def _close_segment(self, r: SegmentRequest, tokens: int) -> None:
        client = r.client
        client.generated += tokens
        client.pieces.append((r.first_token_s, r.decode_node, r.token_runs if r.decode_node is not None else []))

    # --- the loop -------------------------------------------------------------------------------------

    def run(self, workload: Workload, template_tokens: int = 0,
            progress: Callable[[float], None] | None = None) -> list[ClientRequest]:
        clients = self.clients = [ClientRequest(spec, template_tokens) for spec in workload.requests]
        total = len(clients)
        events = self.events
        router = self.router
        nodes = self.nodes
        busy = self.busy
        next_arrival = 0
        reported = 0
        now = 0.0
        while True:
            t = clients[next_arrival].arrival_s if next_arrival < total else math.inf
            if events and events[0][0] < t:
                t = events[0][0]
            if t == math.inf:
                break
            if t > now:
                now = t
            while next_arrival < total and clients[next_arrival].arrival_s <= now:
                router.arrive(clients[next_arrival], clients[next_arrival].arrival_s)
                next_arrival += 1
            while events and events[0][0] <= now:
                _, _, kind, payload = heapq.heappop(events)
                self._handle(kind, payload, now)
            router.dispatch(now)
            for node in nodes:
                if not busy[id(node)] and node.has_work():
                    end = node.step(now)
                    if end is not None:
                        busy[id(node)] = True
                        self._push(end, NODE_FREE, node)
            if progress is not None and self.finished - reported >= 256:
                reported = self.finished
                progress(reported / max(1, total))
        if self.finished < total:
            stuck = [n for n in nodes if n.has_work()]
            raise SimulationError(f"the disaggregated system stopped with {total - self.finished} unfinished "
                                  f"requests ({len(stuck)} node(s) holding work they cannot schedule, "
                                  f"{router.pending} held by the router)")
        return clients

    # --- results --------------------------------------------------------------------------------------

    def records(self) -> list[RequestRecord]:
        """One record per client request; token times gathered from both nodes over all segments."""
        records: list[RequestRecord] = []
        for client in self.clients:
            spec = client.spec
            if client.finish_s is None or client.first_token_s is None:
                records.append(RequestRecord(spec.request_id, spec.klass, spec.prompt_tokens, spec.output_tokens,
                                             spec.arrival_s, spec.arrival_s, None, None, [], "not finished"))
                continue
            times = token_times(client)
            records.append(RequestRecord(
                request_id=spec.request_id, klass=spec.klass, prompt_tokens=spec.prompt_tokens,
                output_tokens=spec.output_tokens, scheduled_at=spec.arrival_s, sent_at=spec.arrival_s,
                ttft_s=client.first_token_s - spec.arrival_s, e2e_s=client.finish_s - spec.arrival_s,
                itl_s=[later - earlier for earlier, later in itertools.pairwise(times)],
            ))
        return records

    def stats(self) -> dict[str, Any]:
        """What the topology did: transfers, segments, retries, decode-node pressure."""
        transfer_s = [s for pair in self.pairs for s in pair.transfer_s]
        clients = self.clients
        return {
            "pairs": len(self.pairs),
            "busy_retry_timeout_s": self.router.retry_timeout_s,
            "prefill_waiting_limit": self.config.prefill_waiting_limit,
            "decode_policy": self.config.decode_policy,
            "transfers": sum(pair.transfers for pair in self.pairs),
            "transfer_bytes": sum(pair.transfer_bytes for pair in self.pairs),
            "transfer_ms_p50": _ms(percentile(transfer_s, 50)),
            "transfer_ms_p95": _ms(percentile(transfer_s, 95)),
            "transfer_ms_max": _ms(max(transfer_s, default=None)),
            "segments": sum(len(c.segments) for c in clients),
            "continuations": self.continuations,
            "cut_requests": sum(1 for c in clients if len(c.segments) > 1),
            "retried": self.router.retried,
            "held_by_router": self.router.held_count,
            "max_router_hold_ms": self.router.max_hold_s * 1000.0,
            "mode": self.mode,
            "prefill_steps": sum(pair.prefill.step_index for pair in self.pairs),
            "decode_steps": sum(pair.decode.step_index for pair in self.pairs),
            "prefill_preemptions": sum(pair.prefill.preemption_count for pair in self.pairs),
            "decode_max_seats_used": max(pair.decode.max_seats_used for pair in self.pairs),
        }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def token_times(client: ClientRequest) -> list[float]:
    """Every output token's time, in order, across the client's segments."""
    times: list[float] = []
    for first_token_s, decode_node, runs in client.pieces:
        times.append(first_token_s)
        if decode_node is None or not runs:
            continue
        step_end_s = decode_node.step_end_s
        for position, (start, stop) in enumerate(runs):
            if position == 0:
                start += 1  # the join index: the token of that index came from the prefill node
            if start <= stop:
                times.extend(step_end_s[start:stop + 1])
    return times

