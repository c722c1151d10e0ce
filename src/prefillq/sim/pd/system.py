"""The disaggregated system: its settings (:class:`PdConfig`) and :class:`PdSystem`, the router plus
prefill/decode pairs driven by one event loop over arrivals, node steps, hand-offs, transfers and cuts."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from prefillq.config import load_config, validate_deployment
from prefillq.metrics import RequestRecord, percentile
from prefillq.sim.costs import CostModel, KvTransfer
from prefillq.sim.node import EngineLimits, SimRequest, SimulationError
from prefillq.sim.pd.nodes import ClientRequest, DecodeNode, LightLLMPrefillNode, Pair, PrefillNode, SegmentRequest
from prefillq.sim.pd.router import Router, busy_retry_timeout_from_env, parse_busy_retry_timeout
from prefillq.validation import check_int, check_number, settings_from
from prefillq.workload import Workload


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
        check_int("pairs (prefill/decode pairs)", self.pairs, minimum=1)
        if self.busy_retry_timeout_s is not None:
            object.__setattr__(self, "busy_retry_timeout_s",
                               parse_busy_retry_timeout(self.busy_retry_timeout_s, "busy_retry_timeout_s"))
        for name in ("prefill_waiting_limit", "decode_max_num_seqs", "decode_kv_blocks"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1)
        if self.kv_bytes_per_token is not None:
            check_number("kv_bytes_per_token", self.kv_bytes_per_token)
        if self.link_bytes_per_s is not None:
            check_number("link_bytes_per_s", self.link_bytes_per_s, strict=True)
        decode = load_config(self.decode_policy)  # ConfigError (a ValueError) for an unknown policy
        validate_deployment(decode, kv_role="kv_consumer")
        object.__setattr__(self, "decode_policy", decode.policy)

    @classmethod
    def from_value(cls, value: PdConfig | Mapping[str, Any] | None) -> PdConfig:
        """A PdConfig from itself, a dict of its fields, or None (all defaults)."""
        return settings_from(cls, value, "PD settings", "pd")

    def transfer_model(self, profile_transfer: KvTransfer) -> KvTransfer:
        """The profile's KV-transfer cost with this config's overrides."""
        if self.kv_bytes_per_token is None and self.link_bytes_per_s is None:
            return profile_transfer
        return KvTransfer(
            bytes_per_token=(profile_transfer.bytes_per_token if self.kv_bytes_per_token is None
                             else self.kv_bytes_per_token),
            link_bytes_per_s=(profile_transfer.link_bytes_per_s if self.link_bytes_per_s is None
                              else self.link_bytes_per_s),
            bytes_per_request=profile_transfer.bytes_per_request)

    def decode_limits(self, prefill: EngineLimits) -> EngineLimits:
        """A decode node's limits: its own seats and KV blocks, else the prefill node's."""
        seats = prefill.max_num_seqs if self.decode_max_num_seqs is None else self.decode_max_num_seqs
        return EngineLimits(
            max_num_batched_tokens=max(prefill.max_num_batched_tokens, seats), max_num_seqs=seats,
            kv_blocks=prefill.kv_blocks if self.decode_kv_blocks is None else self.decode_kv_blocks,
            block_size=prefill.block_size)

    def retry_timeout_s(self, environ: Mapping[str, str] | None = None) -> float:
        """The effective busy-retry timeout: this config's, else the environment's, else 0."""
        if self.busy_retry_timeout_s is not None:
            return self.busy_retry_timeout_s
        return busy_retry_timeout_from_env(environ)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def records(self, frontend_s: float = 0.0) -> list[RequestRecord]:
        """One record per client request; token times gathered from both nodes over all segments.

        ``frontend_s`` (the profile's time outside the steps) is added to each TTFT and E2E."""
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
                ttft_s=client.first_token_s - spec.arrival_s + frontend_s,
                e2e_s=client.finish_s - spec.arrival_s + frontend_s,
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

