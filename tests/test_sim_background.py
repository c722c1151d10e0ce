"""Background's workers: each exits as soon as its calls are done (the memory it used is given back while the
parent still works), and a worker that dies without sending its result is an error, not a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest

from prefillq.sim.background import Background, can_fork

needs_fork = pytest.mark.skipif(not can_fork(), reason="worker processes are forked (POSIX)")


def _wait_until(condition, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@needs_fork
def test_a_worker_ends_once_its_calls_are_done_before_the_results_are_asked():
    runs = Background([lambda: sum(range(1000)), lambda: os.getpid()], workers=2)
    processes = [process for process, _ in runs._workers]
    assert len(processes) == 2
    assert _wait_until(lambda: not any(process.is_alive() for process in processes))  # nobody asked yet
    total, pid = runs.results()
    assert total == sum(range(1000)) and pid != os.getpid()


@needs_fork
def test_several_calls_in_one_worker_come_back_in_order():
    calls = [lambda k=k: k * k for k in range(5)]
    assert Background(calls, workers=2).results() == [k * k for k in range(5)]
    assert Background(calls, workers=1).results() == [k * k for k in range(5)]


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@needs_fork
def test_a_worker_that_dies_is_an_error():
    with pytest.raises(RuntimeError, match="ended"):
        Background([lambda: 1, _killed], workers=2).results()


@needs_fork
def test_an_error_stops_the_other_workers():
    runs = Background([_killed, lambda: time.sleep(60)], workers=2)
    processes = [process for process, _ in runs._workers]
    with pytest.raises(RuntimeError):
        runs.results()
    assert not any(process.is_alive() for process in processes)
