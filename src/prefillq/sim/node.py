"""What every simulated engine node shares: the request, the limits, the step record and the step's end.

A node (``vllm.py``'s :class:`VllmNode`, ``lightllm.py``'s :class:`LightLLMNode`, and the disaggregated
roles of ``pd/nodes.py``) decides *what* a step runs in its own way; what happens once the step has run
is the same everywhere and lives here in :meth:`SimNode._finish_step`: decodes whose last token came
in the step finish, prefill chunks are added, a prompt whose prefill completes samples its first token
and then either finishes (one output token) or starts decoding, and the timeline gets one point.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prefillq.metrics import ColumnRows
from prefillq.requests import QueuedRequest
from prefillq.sim.costs import CostModel
from prefillq.validation import check_int
from prefillq.workload import RequestSpec

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"


class SimulationError(RuntimeError):
    """The simulated engine cannot make progress (e.g. a request larger than the whole KV cache)."""


class SimRequest:
    """One request inside a simulated engine."""

    __slots__ = ("arrival_s", "blocks", "finish_batch", "finish_s", "finish_step", "first_batch", "first_scheduled_s",
                 "first_token_s", "hashes", "index", "klass", "num_computed", "num_output", "output_tokens",
                 "preemptions", "prefix", "priority", "prompt_tokens", "request_id", "run_start_out", "run_start_step",
                 "seq", "status", "target", "template_tokens", "token_runs", "view")

    def __init__(self, spec: RequestSpec, template_tokens: int = 0, index: int = -1) -> None:
        self._start(index, spec.request_id, spec.arrival_s, spec.prompt_tokens, spec.output_tokens, spec.klass,
                    spec.hash_ids, spec.priority, template_tokens)

    def _start(self, index: int, request_id: str, arrival_s: float, prompt_tokens: int, output_tokens: int,
               klass: str, hashes: tuple[int, ...] | None, priority: int, template_tokens: int) -> None:
        self.index = index             # position in the workload (where its results are recorded)
        self.request_id = request_id
        self.klass = klass
        self.priority = priority       # the client's class; honoured only in vLLM's priority scheduling mode
        self.template_tokens = template_tokens  # tokens the server's chat template adds to the prompt
        self.prompt_tokens = prompt_tokens = prompt_tokens + template_tokens  # what the engine computes
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.status = WAITING
        self.num_computed = 0          # tokens whose KV is computed (prefill progress)
        self.num_output = 0            # output tokens sampled (materialised; decodes: see out_before)
        self.target = prompt_tokens    # tokens to compute before the next sample (prompt + output)
        self.blocks = 0                # KV blocks held while waiting/prefilling (decodes: implicit)
        self.seq = -1                  # position in the running order (vLLM appends to `running`)
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.first_batch = 0           # sequences in the step that sampled the first token ...
        self.finish_batch = 0          # ... and the last one (the server's output work per step grows with them)
        self.preemptions = 0
        self.run_start_step = 0        # lockstep decode run: first step of the run that yields a token
        self.run_start_out = 0         # ... and the output count before that step
        self.finish_step = -1
        self.token_runs: list[tuple[int, int]] = []  # inclusive step ranges that produced tokens
        self.view: QueuedRequest | None = None
        self.hashes = hashes           # prefix block hashes (None: none known)
        self.prefix: Any = None        # its PrefixState on a node with a prefix cache

    def out_before(self, step: int) -> int:
        """Output count before ``step`` for a decode in lockstep."""
        return self.run_start_out + step - self.run_start_step


def request_factory(specs: Sequence[Any], template_tokens: int = 0) -> Callable[[int], SimRequest]:
    """``make(i)``: the simulated request of the workload's ``i``-th spec. A trace's requests
    (``TraceRequests``, whose ``fields(i)`` reads its columns) build none of their RequestSpecs."""
    fields = getattr(specs, "fields", None)
    if not callable(fields):
        return lambda i: SimRequest(specs[i], template_tokens, i)
    new = SimRequest.__new__

    def make(i: int) -> SimRequest:
        r = new(SimRequest)
        r._start(i, *fields(i), template_tokens)
        return r

    return make


def queue_view(request: SimRequest) -> QueuedRequest:
    """What the policy sees of a simulated request (SPEC §2).

    One QueuedRequest per request, refreshed in place: re-ranking engines ask for every ready
    request's view each step, and building (and validating) a fresh one each time dominated the run.
    """
    view = request.view
    if view is None:
        view = request.view = QueuedRequest.trusted(request.request_id, request.prompt_tokens)
    view.cached_tokens = request.num_computed
    view.output_tokens = request.num_output
    view.resumed = request.preemptions > 0 or request.num_output > 0 or request.num_computed > 0
    return view


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's scheduling limits (vLLM's names)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int
    block_size: int = 16
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        check_int("budget (max_num_batched_tokens)", self.max_num_batched_tokens, minimum=1)
        check_int("max_num_seqs", self.max_num_seqs, minimum=1)
        check_int("kv_blocks", self.kv_blocks, minimum=1)
        check_int("block_size", self.block_size, minimum=1)
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks * self.block_size


@dataclass(slots=True)
class StepRecord:
    """What one step did (kept only with ``record_steps=True``; used by the conservation tests)."""

    index: int
    start_s: float
    end_s: float
    prefill_chunks: list[tuple[str, int]]
    num_decodes: int
    running: int
    used_blocks: int
    preempted: list[str]


TimelinePoint = tuple[float, int, int, int, int]


class Timeline(ColumnRows[TimelinePoint]):
    """The node's state after each step, ``(t, waiting, running, decodes, tokens)``, kept as flat arrays
    (24 bytes a step instead of a tuple of Python numbers); reads as a sequence of tuples."""

    __slots__ = ("counts", "t")

    def __init__(self, t: array | None = None) -> None:
        # ``t``: a node's step end times, shared (the node appends each step's end once, and its counts here)
        self.t = array("d") if t is None else t
        self.counts = array("i")  # waiting, running, decodes, tokens of each step, one after the other

    def add(self, t: float, waiting: int, running: int, decodes: int, tokens: int) -> None:
        self.t.append(t)
        self.counts.extend((waiting, running, decodes, tokens))

    def append(self, point: TimelinePoint) -> None:
        self.add(*point)

    def __len__(self) -> int:
        return len(self.t)

    def _row(self, index: int) -> TimelinePoint:
        base = 4 * index
        waiting, running, decodes, tokens = self.counts[base:base + 4]
        return (self.t[index], waiting, running, decodes, tokens)

    def __iter__(self) -> Iterator[TimelinePoint]:
        counts = iter(self.counts)
        return ((t, *itertools.islice(counts, 4)) for t in self.t)  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(
            a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]


class Discarded:
    """A column nobody reads (a lean run's step end times and timeline): appends are kept nowhere."""

    __slots__ = ()

    # appends and extends are kept nowhere: a builtin taking one argument does it at C speed (a hot path's
    # per-step append costs no Python call)
    append = extend = staticmethod(id)

    def __len__(self) -> int:
        return 0


class _NoTimeline(Timeline):
    """The timeline of a run that keeps none (:meth:`SimNode.keep_no_history`): empty, whatever is added."""

    __slots__ = ()

    def __init__(self) -> None:
        self.t = self.counts = Discarded()  # type: ignore[assignment]

    def __iter__(self) -> Iterator[TimelinePoint]:
        return iter(())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kv_overflow(r: SimRequest, needed: str, cache: str, output_tokens: int = 0) -> SimulationError:
    """The error for a request that can never fit a node's KV cache (``cache`` says how big that is)."""
    tokens = f"{r.prompt_tokens} prompt tokens" + (f" + {output_tokens} output tokens" if output_tokens else "")
    return SimulationError(f"request {r.request_id} needs {needed} for its {tokens}, but {cache}")


def check_fits_kv(r: SimRequest, limits: EngineLimits, where: str = "the KV cache") -> None:
    """Raise if ``r``'s tokens to compute (its prompt; after a preemption, plus its output so far) need
    more KV blocks than the cache has: it could never run, and would preempt itself once it filled it."""
    blocks = ceil_div(r.target, limits.block_size)
    if blocks > limits.kv_blocks:
        raise kv_overflow(r, f"{blocks} KV blocks",
                          f"{where} holds {limits.kv_blocks} blocks ({limits.kv_capacity_tokens} tokens)",
                          r.target - r.prompt_tokens)


class SimNode:
    """The bookkeeping every simulated engine node shares; subclasses schedule the steps.

    A subclass provides ``add_request``, ``has_work``, ``step``, the counts ``waiting_count``,
    ``num_running``, ``num_decoding`` and ``used_blocks``, and the three KV/decode hooks
    ``release_kv`` (free what the node holds for a request), ``_start_decoding`` and ``_end_decode``.
    """

    def __init__(self, cost: CostModel, limits: EngineLimits, *, record_steps: bool = False,
                 on_finish: Callable[[SimRequest], None] | None = None) -> None:
        self.cost = cost
        self.limits = limits
        self.budget = limits.max_num_batched_tokens
        self.now = 0.0
        self.prefilling: list[SimRequest] = []    # running (admitted), prefill unfinished, in running order
        self.finish_at: dict[int, list[SimRequest]] = {}  # decodes by the step of their last token
        self.decode_context = 0                   # sum of context lengths of running decodes
        self.step_index = 0
        self.step_end_s = array("d")               # end time of every step (token times index it)
        self.finished: list[SimRequest] = []      # kept only with record_steps (memory); see finished_count
        self.finished_count = 0
        self.on_finish = on_finish
        self.record_steps = record_steps
        self.steps: list[StepRecord] = []
        # (t, waiting, running, decodes, tokens) after each step; its times are step_end_s (one array)
        self.timeline = Timeline(self.step_end_s)
        self.lanes: list[tuple[float, dict[str, int]]] = []  # lane sizes, for policies with lanes
        self._next_lane_sample = math.inf
        self.preemption_count = 0
        self._step_batch = 0                      # sequences in the step being finished

    def keep_no_history(self) -> None:
        """Keep no step end times, timeline or lane samples (a run read only for its requests' first-token and
        finish times, e.g. compare's reference schedules): the same steps, less memory. Call before the run."""
        self.step_end_s = Discarded()  # type: ignore[assignment]
        self.timeline = _NoTimeline()
        self.lanes = []
        self._next_lane_sample = math.inf

    # --- what a subclass provides ------------------------------------------------------------------

    def waiting_count(self) -> int:
        """Requests whose prefill has not started (or, where the policy orders them, not finished)."""
        raise NotImplementedError

    @property
    def num_running(self) -> int:
        raise NotImplementedError

    @property
    def num_decoding(self) -> int:
        raise NotImplementedError

    @property
    def used_blocks(self) -> int:
        raise NotImplementedError

    def release_kv(self, r: SimRequest) -> None:
        """Free the KV this node holds for ``r`` (its prefill finished and it leaves the node)."""
        raise NotImplementedError

    def _start_decoding(self, r: SimRequest, step: int) -> None:
        """``r``'s prefill completed in ``step`` (sampling a token): it decodes from step + 1."""
        raise NotImplementedError

    def _end_decode(self, r: SimRequest) -> None:
        """``r`` produced its last token: take it out of the running decodes and free its KV."""
        raise NotImplementedError

    def _point(self, tokens: int) -> tuple[int, int, int, int]:
        """The timeline's counts after a step that ran ``tokens``: (waiting, running, decodes, tokens)."""
        return self.waiting_count(), self.num_running, self.num_decoding, tokens

    def outputs_before(self, r: SimRequest, step: int) -> int:
        """Output tokens a decoding ``r`` has before ``step`` (lockstep: one a step; LightLLM overrides)."""
        return r.out_before(step)

    # --- shared -------------------------------------------------------------------------------------

    def _batch_latency(self, chunks: list[tuple[SimRequest, int]], prefill_tokens: int, num_decodes: int,
                       decode_context: int) -> float:
        """The cost model's latency of a batch of prefill chunks and decodes."""
        cost = self.cost
        attention = 0  # summed in chunk order, as sum() would
        for r, chunk in chunks:
            attention += cost.attention_work(chunk, r.num_computed)
        return cost.step_latency(prefill_tokens, attention, num_decodes, decode_context)

    def _record_step(self, step: int, start: float, end: float, chunks: list[tuple[SimRequest, int]],
                     num_decodes: int, preempted: list[SimRequest]) -> None:
        if self.record_steps:
            self.steps.append(StepRecord(step, start, end, [(r.request_id, c) for r, c in chunks], num_decodes,
                                         self.num_running, self.used_blocks, [r.request_id for r in preempted]))

    def _finish_step(self, step: int, end: float, chunks: list[tuple[SimRequest, int]], decoded: int,
                     prefill_tokens: int) -> None:
        """The step ran until ``end``: decodes finish, chunks land, completed prompts sample a token."""
        self.step_end_s.append(end)
        self.step_index = step + 1
        self.now = end
        self.decode_context += decoded
        self._step_batch = batch = len(chunks) + decoded
        ending = self.finish_at.pop(step, None)
        if ending is not None:
            self._end_decodes(ending, step, end)
        completed = False
        for r, chunk in chunks:
            r.num_computed += chunk
            if r.num_computed < r.target:
                continue
            completed = True
            r.num_output += 1               # the step that completes a prefill samples a token
            if r.first_token_s is None:
                r.first_token_s = end
                r.first_batch = batch
            self._prefill_completed(r, step, end)
        if completed:
            self.prefilling = [r for r in self.prefilling if r.status == PREFILL]
        # the timeline's point (its time is the step end appended above: the two share one array)
        self.timeline.counts.extend(self._point(prefill_tokens + decoded))
        if end >= self._next_lane_sample:
            self._sample_lanes(end)

    def _end_decodes(self, ending: list[SimRequest], step: int, end: float) -> None:
        """The decodes listed to give their last token in ``step`` finish at ``end`` (the entries of runs that a
        skip or a preemption moved are stale: left alone)."""
        for r in ending:
            if r.status == DECODE and r.finish_step == step:
                self._close_decode_run(r, step)
                self._end_decode(r)
                self._finish(r, end)

    def _close_decode_run(self, r: SimRequest, step: int) -> None:
        """``r``'s last token came in ``step``: record the steps of its current run (one range, lockstep)."""
        r.token_runs.append((r.run_start_step, step))

    def _prefill_completed(self, r: SimRequest, step: int, end: float) -> None:
        """A prefill finished in ``step`` and sampled a token: done, or it decodes here from step + 1.

        (A disaggregated prefill node overrides this: it hands the request's KV to a decode node.)
        """
        if r.num_output >= r.output_tokens:
            r.token_runs.append((step, step))
            self.release_kv(r)
            self._finish(r, end)
        else:
            self._start_decoding(r, step)

    def _sample_lanes(self, end: float) -> None:
        """Record the policy's lane sizes at ``end`` (nodes whose policy has no lanes record none)."""
        self._next_lane_sample = math.inf

    def _finish(self, r: SimRequest, end: float) -> None:
        r.status = FINISHED
        r.finish_s = end
        r.finish_batch = self._step_batch
        r.num_output = r.output_tokens
        self.finished_count += 1
        if self.record_steps:
            self.finished.append(r)
        if self.on_finish is not None:
            self.on_finish(r)
