"""The simulator's vLLM engine model, run in real time behind the mock server.

When the mock is asked to stand in for a policy (``prefillq bench --launch mock --policies hrrn``), it
does not invent an ordering of its own: every completion becomes a request of a
:class:`~prefillq.sim.vllm.VllmNode` whose waiting queue is the real prefillq queue of that policy, and
the node's steps are played out on the wall clock. A step that the cost profile says takes 13 ms is
slept for 13 ms; requests that arrive meanwhile join the queue between steps (as in vLLM, whose
scheduler sees new requests at the start of a step); a token sampled in a step is handed to its
request's stream when the step ends.

:class:`EngineDriver` is the part without a clock (tests drive it with a virtual one and check it
against :func:`prefillq.sim.simulator.simulate`); :class:`RealTimeEngine` runs it on an asyncio loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefillq.sim.costs import default_profile, load_profile
from prefillq.sim.node import DECODE, FINISHED, EngineLimits, SimRequest, SimulationError, check_fits_kv
from prefillq.sim.vllm import VllmNode
from prefillq.workload import RequestSpec

DEFAULT_PROFILE = default_profile("vllm")  # the simulated vLLM engine: compare's default
LIMIT_KEYS = ("max_num_batched_tokens", "max_num_seqs", "kv_blocks", "block_size", "long_prefill_token_threshold")


class EngineRefused(ValueError):
    """A request the simulated engine could never run (it needs more KV than the whole cache)."""


@dataclass
class Progress:
    """Output tokens a request has produced so far, as of the end of the last step."""

    output_tokens: int
    tokens: int = 0
    finished: bool = False
    changed: asyncio.Event | None = None  # set by the real-time engine when ``tokens`` moves
    error: str | None = None  # the engine failed: the request will produce nothing more


@dataclass
class EngineDriver:
    """A :class:`VllmNode` fed with requests as they come, stepped by whoever owns the clock."""

    policy: Any  # any policy config form make_queue accepts
    profile: str = DEFAULT_PROFILE
    limits: dict[str, int] = field(default_factory=dict)  # overrides of the profile's defaults
    node: VllmNode = field(init=False)
    engine_limits: EngineLimits = field(init=False)

    def __post_init__(self) -> None:
        prof = load_profile(self.profile)
        unknown = sorted(set(self.limits) - set(LIMIT_KEYS))
        if unknown:
            raise ValueError(f"unknown engine limit {unknown[0]!r}; valid: {', '.join(LIMIT_KEYS)}")
        self.engine_limits = EngineLimits(**{key: int(self.limits.get(key, prof.limit(key))) for key in LIMIT_KEYS})
        self.node = VllmNode(self.policy, prof.cost, self.engine_limits)
        self.node.keep_no_history()  # a long-running server: no step end times, timeline or lane samples
        self.pending: list[SimRequest] = []
        self.active: dict[str, tuple[SimRequest, Progress]] = {}
        self._ids = itertools.count()

    @property
    def policy_name(self) -> str:
        """The policy, with ``(partial_prefills=ordered)`` when it orders partial prefills too (SPEC §3.6)."""
        ordered = self.partial_prefills != "first"
        return f"{self.node.policy_name} (partial_prefills={self.partial_prefills})" if ordered \
            else self.node.policy_name

    @property
    def partial_prefills(self) -> str:
        """How the engine's queue treats partial prefills, from the full config it was given."""
        return str(self.node.waiting.config.partial_prefills)

    def submit(self, prompt_tokens: int, output_tokens: int, at: float, label: str = "") -> tuple[str, Progress]:
        """A request that arrived at ``at``; it joins the engine's waiting queue before the next step (as
        vLLM's scheduler takes in new requests). Returns (engine id, progress)."""
        engine_id = f"{next(self._ids)}:{label}"
        request = SimRequest(RequestSpec(engine_id, at, prompt_tokens, output_tokens, "short"))
        try:
            check_fits_kv(request, self.engine_limits)
        except SimulationError as exc:
            raise EngineRefused(str(exc)) from None
        progress = Progress(output_tokens=output_tokens)
        self.pending.append(request)
        self.active[engine_id] = (request, progress)
        return engine_id, progress

    def busy(self) -> bool:
        return bool(self.pending) or self.node.has_work()

    def step(self, now: float) -> float | None:
        """Admit the pending requests and run one step from ``now``; its end time, or None when idle."""
        for request in self.pending:
            self.node.add_request(request, request.arrival_s)
        self.pending.clear()
        if not self.node.has_work():
            return None
        end = self.node.step(now)
        if end is None:
            raise SimulationError("the simulated engine has waiting requests but cannot schedule any of them")
        return end

    def collect(self, on_change: Callable[[Progress], None] | None = None) -> None:
        """Bring every request's :class:`Progress` up to the node's state after the last step."""
        node = self.node
        done: list[str] = []
        for engine_id, (request, progress) in self.active.items():
            if request.status == FINISHED:
                tokens = request.output_tokens
            elif request.status == DECODE:  # a running decode's count follows from the step counter
                tokens = request.out_before(node.step_index)
            else:
                tokens = request.num_output
            finished = request.status == FINISHED
            if tokens != progress.tokens or finished != progress.finished:
                progress.tokens, progress.finished = tokens, finished
                if on_change is not None:
                    on_change(progress)
            if finished:
                done.append(engine_id)
        for engine_id in done:
            del self.active[engine_id]


class RealTimeEngine:
    """Runs an :class:`EngineDriver` on the running asyncio loop, one step after another on the wall clock."""

    def __init__(self, driver: EngineDriver) -> None:
        self.driver = driver
        self.loop = asyncio.get_running_loop()
        self.origin = self.loop.time()
        self.wakeup = asyncio.Event()
        self.steps = 0
        self.failure: str | None = None
        self.task = self.loop.create_task(self._run())

    def now(self) -> float:
        return self.loop.time() - self.origin

    def submit(self, prompt_tokens: int, output_tokens: int, label: str = "") -> Progress:
        if self.failure is not None:
            raise EngineRefused(f"the simulated engine failed earlier: {self.failure}")
        _, progress = self.driver.submit(prompt_tokens, output_tokens, self.now(), label)
        progress.changed = asyncio.Event()
        self.wakeup.set()
        return progress

    async def _run(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # a broken engine must not leave its requests waiting forever
            self.failure = str(exc)
            for _, progress in self.driver.active.values():
                progress.error = f"simulated engine failed: {exc}"
                _notify(progress)

    async def _steps(self) -> None:
        driver = self.driver
        while True:
            if not driver.busy():
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            end = driver.step(self.now())
            if end is None:
                continue
            self.steps += 1
            delay = end - self.now()
            # A step the loop overslept simply ends late: the engine looks slower, as a real one would.
            await asyncio.sleep(max(0.0, delay))
            driver.collect(_notify)

    def close(self) -> None:
        self.task.cancel()


def _notify(progress: Progress) -> None:
    if progress.changed is not None:
        progress.changed.set()
