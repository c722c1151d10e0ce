"""Calls started now in forked worker processes and collected later, while this process does other work.

    runs = Background([lambda: simulate(w, a).summary, lambda: simulate(w, b).summary], workers=1)
    ...                     # this process runs something else meanwhile
    first, second = runs.results()

The workers are forked (they inherit the calls and everything the calls use, e.g. a workload of a
million requests, without pickling it); only each call's result travels back, pickled, through a pipe.
A worker exits as soon as its calls are done, so the memory it used is given back while this process
still works (its results wait in the pipe). Where the platform cannot fork, or with ``workers`` < 1,
:meth:`Background.results` makes the calls here, in order. Either way the results are the same: each
call must depend only on what it was given.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any


def _work(calls: Sequence[Callable[[], Any]], indices: list[int], channel: Any) -> None:
    """In a worker: make the calls ``indices`` in order, sending each ``(index, ok, result or exception)``."""
    try:
        for index in indices:
            try:
                outcome: tuple[int, bool, Any] = (index, True, calls[index]())
            except Exception as exc:  # raised again where the results are asked
                outcome = (index, False, exc)
            try:
                channel.send(outcome)
            except Exception as exc:  # a result (or exception) that cannot be pickled
                channel.send((index, False, RuntimeError(f"call {index}'s outcome cannot be sent back: {exc!r}")))
    finally:
        channel.close()


def default_jobs() -> int:
    """The CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether worker processes can be forked here (Linux and other POSIX systems)."""
    return "fork" in multiprocessing.get_all_start_methods()


class Background:
    """``calls`` (no arguments each) started in up to ``workers`` forked processes; see the module docstring."""

    def __init__(self, calls: Sequence[Callable[[], Any]], workers: int,
                 on_done: Callable[[], None] | None = None) -> None:
        self._calls = list(calls)
        self._on_done = on_done
        self._workers: list[tuple[Any, Any]] = []  # (process, the receiving end of its pipe)
        self._received: dict[int, tuple[bool, Any]] = {}
        self._results: list[Any] | None = None
        self._complete = False  # every result received (the workers end by themselves)
        if workers < 1 or not self._calls or not can_fork() or multiprocessing.current_process().daemon:
            return  # (a daemonic process, e.g. a pool's worker, may not start processes: here, in order)
        context = multiprocessing.get_context("fork")
        count = min(workers, len(self._calls))
        for worker in range(count):  # call i runs in worker i % count
            receiving, sending = context.Pipe(duplex=False)
            process = context.Process(target=_work, args=(self._calls, list(range(worker, len(self._calls), count)),
                                                          sending), daemon=True)
            process.start()
            sending.close()  # the worker holds the sending end: a worker gone shows as the end of the pipe
            self._workers.append((process, receiving))

    def results(self) -> list[Any]:
        """Every call's result, in the order of ``calls`` (waiting for the workers; a worker's exception is
        raised here). Asked again, the same list."""
        if self._results is not None:
            return self._results
        results = []
        try:
            for index, call in enumerate(self._calls):
                if self._workers:
                    ok, value = self._receive(index)
                    if not ok:
                        raise value
                else:
                    value = call()
                results.append(value)
                if self._on_done is not None:
                    self._on_done()
            self._complete = True
        finally:
            self.close()
        self._results = results
        return results

    def _receive(self, index: int) -> tuple[bool, Any]:
        """Call ``index``'s (ok, result or exception), read from its worker's pipe."""
        process, channel = self._workers[index % len(self._workers)]
        while index not in self._received:
            try:
                got, ok, value = channel.recv()
            except EOFError:
                process.join()
                raise RuntimeError(f"a worker process ended (exit code {process.exitcode}) before call {index} "
                                   "sent its result") from None
            self._received[got] = (ok, value)
        return self._received.pop(index)

    def close(self) -> None:
        """Stop the workers (after an error, those still running are terminated: their results are not wanted)."""
        workers, self._workers = self._workers, []
        for process, channel in workers:
            if not self._complete and process.is_alive():
                process.terminate()
            process.join()
            channel.close()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Background", "can_fork", "default_jobs"]
