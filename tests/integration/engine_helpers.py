"""Helpers for the real-vLLM tests: prompts, in-process engines, a recorder of the dispatch order."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCHEDULER = "prefillq.integrations.vllm.Scheduler"
VOCAB = 2048


def prompt_ids(length: int, seed: int) -> list[int]:
    """``length`` random token ids (ids 0-2 are special); different seeds share no prefix."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def start_engine(model: str, **overrides: Any) -> Any:
    """An in-process vLLM engine with the prefillq scheduler (eager mode: starts in seconds)."""
    from vllm import LLM

    args: dict[str, Any] = {"model": model, "scheduler_cls": SCHEDULER, "enforce_eager": True,
                            "max_num_batched_tokens": 512, "max_model_len": 2048, "seed": 0}
    args.update(overrides)
    return LLM(**args)


def stop_engine(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def scheduler_of(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.scheduler


@dataclass
class Dispatch:
    """One pop from the engine's waiting queue, as the scheduler made it."""

    request_id: str
    prompt_tokens: int
    priority: int
    was_preempted: bool
    preempted_waiting: int  # how many preempted requests were queued at that moment (this one included)


@dataclass
class DispatchLog:
    dispatches: list[Dispatch] = field(default_factory=list)

    @property
    def prompt_lengths(self) -> list[int]:
        return [d.prompt_tokens for d in self.dispatches]


def record_dispatches(llm: Any) -> DispatchLog:
    """Log every request vLLM pops from our waiting queue (the order vLLM actually dispatched)."""
    from vllm.v1.request import RequestStatus

    queue = scheduler_of(llm).waiting
    log = DispatchLog()
    original: Callable[[], Any] = queue.pop_request

    def pop_and_record() -> Any:
        preempted_waiting = sum(1 for r in queue if r.status == RequestStatus.PREEMPTED)
        request = original()
        log.dispatches.append(Dispatch(request.request_id, request.num_prompt_tokens, int(request.priority),
                                       request.status == RequestStatus.PREEMPTED, preempted_waiting))
        return request

    queue.pop_request = pop_and_record
    return log


class ServerProcess:
    """A server command in its own process group, its output in a log file; stop() ends the group."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Any) -> None:
        import subprocess

        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, url: str, timeout_s: float = 240.0) -> None:
        import time

        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"server not ready after {timeout_s} s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        import contextlib
        import os
        import signal
        import subprocess

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # an engine core that outlived the
            os.killpg(self.process.pid, signal.SIGKILL)                 # front-end shares its group
        self._log.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
