"""Calls started now in forked worker processes and collected later, while this process does other work.

    runs = Background([lambda: simulate(w, a).summary, lambda: simulate(w, b).summary], workers=1)
    ...                     # this process runs something else meanwhile
    first, second = runs.results()

The workers are forked (they inherit the calls and everything the calls use, e.g. a workload of a
million requests, without pickling it); only each call's result travels back, pickled. Where the
platform cannot fork, or with ``workers`` < 1, :meth:`Background.results` makes the calls here, in
order. Either way the results are the same: each call must depend only on what it was given.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

_PENDING: dict[int, list[Callable[[], Any]]] = {}  # token -> calls, read by the forked workers
_TOKENS = itertools.count()


def _call(token: int, index: int) -> Any:
    """In a worker: the ``index``-th call of the batch ``token`` (inherited through the fork)."""
    return _PENDING[token][index]()


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
        self._futures: list[Any] = []
        self._pool: Any = None
        self._results: list[Any] | None = None
        if workers < 1 or not self._calls or not can_fork() or multiprocessing.current_process().daemon:
            return  # (a daemonic process, e.g. a pool's worker, may not start processes: here, in order)
        from concurrent.futures import ProcessPoolExecutor

        self._token = next(_TOKENS)
        _PENDING[self._token] = self._calls
        # a fork-context pool forks all its workers on the first submit, so each inherits _PENDING as it is now
        self._pool = ProcessPoolExecutor(max_workers=min(workers, len(self._calls)),
                                         mp_context=multiprocessing.get_context("fork"))
        self._futures = [self._pool.submit(_call, self._token, index) for index in range(len(self._calls))]

    def results(self) -> list[Any]:
        """Every call's result, in the order of ``calls`` (waiting for the workers; a worker's exception is
        raised here). Asked again, the same list."""
        if self._results is not None:
            return self._results
        results = []
        try:
            for index, call in enumerate(self._calls):
                results.append(call() if self._pool is None else self._futures[index].result())
                if self._on_done is not None:
                    self._on_done()
        finally:
            self.close()
        self._results = results
        return results

    def close(self) -> None:
        """Stop the workers (those still running are terminated: their results are not wanted)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        _PENDING.pop(self._token, None)
        if not all(future.done() for future in self._futures):  # an error: no need to wait for the rest
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                if process.is_alive():
                    process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Background", "can_fork", "default_jobs"]
