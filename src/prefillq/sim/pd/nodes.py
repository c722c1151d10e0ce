"""The requests and node roles of the disaggregated topology: client requests and their segments, the
prefill node (either engine model) that hands finished prompts over, and the decode node that pulls them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefillq.requests import QueuedRequest
from prefillq.sim.costs import CostModel
from prefillq.sim.lightllm import LightLLMNode
from prefillq.sim.node import DECODE, EngineLimits, SimRequest, check_fits_kv, kv_overflow
from prefillq.sim.vllm import VllmNode
from prefillq.workload import RequestSpec

CONTINUATION_PRIORITY = -1
TRANSFER_WAIT, TRANSFERRING, CUT = "transfer-wait", "transferring", "cut"


def internal_priority(segment_index: int) -> int:
    """The internal inference priority of a segment: elevated (-1) only for continuations (SPEC §5)."""
    return CONTINUATION_PRIORITY if segment_index > 0 else 0


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


class PrefillRole:
    """What makes an engine node a prefill node (mixed into either engine model's node class).

    The step that completes a prompt samples the first token; unless that was the last token owed,
    the request's KV stays here (``awaiting_transfer``) until the decode node has pulled it
    (:meth:`release`).
    """

    def __init__(self, policy: Any, cost: CostModel, limits: EngineLimits, *,
                 on_prefilled: Callable[[SegmentRequest, float], None], **options: Any) -> None:
        super().__init__(policy, cost, limits, view=segment_view, **options)  # type: ignore[call-arg]
        self.on_prefilled = on_prefilled
        self.awaiting_transfer = 0  # finished prompts whose KV the decode node has not pulled yet

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        if r.num_output >= r.output_tokens:  # an allowance of one token: done right here
            super()._prefill_completed(r, step, end)  # type: ignore[misc]
            return
        r.status = TRANSFER_WAIT
        self.awaiting_transfer += 1
        self.on_prefilled(r, end)  # type: ignore[arg-type]

    def release(self, r: SegmentRequest) -> None:
        """The decode node has the KV: free this node's copy."""
        self.awaiting_transfer -= 1
        self.release_kv(r)  # type: ignore[attr-defined]

    def _may_idle_after_preemption(self) -> bool:
        """A prefill node may: the KV it holds for transfers will be freed."""
        return self.awaiting_transfer > 0


class PrefillNode(PrefillRole, VllmNode):
    """A vLLM-mode node that only prefills; a finished prompt's KV waits here for its transfer."""


class LightLLMPrefillNode(PrefillRole, LightLLMNode):
    """A LightLLM-like prefill node (router admission, re-ranked ready list, skip-on-overflow), no decodes.

    Its router is LightLLM's ``PDQueue`` (``req_queue/chunked_prefill/impl_for_pd.py``): FCFS with break
    on the request count and on Σ (prompt + max_new_tokens) of the requests it holds (kept until the
    decode node has pulled the KV) below the KV capacity; it has no prefill-token gate.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.prefill_token_gate = False

    def _kv_admits(self, r: SimRequest) -> bool:
        need = r.prompt_tokens + r.output_tokens
        if self.reserved_tokens + need < self.kv_capacity_tokens:
            return True
        if need >= self.kv_capacity_tokens:  # it would hold the FCFS head forever
            raise kv_overflow(r, f"{need} KV tokens", f"the KV cache holds {self.kv_capacity_tokens} tokens",
                              r.output_tokens)
        return False


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

    def _schedule_waiting(self, budget: int, step: int, chunks: list[tuple[SimRequest, int]]) -> int:
        """Inbound requests (FCFS by default) get a seat and KV blocks, then their KV transfer starts."""
        inbound = self.waiting
        while inbound and self.seats_used < self.limits.max_num_seqs:
            r: SegmentRequest = inbound.peek_request()
            check_fits_kv(r, self.limits, "the decode node's KV cache")
            need = -(-r.prompt_tokens // self.block_size)
            if need > self.free_blocks:
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
