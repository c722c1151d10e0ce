"""Where a sweep's cells run: worker processes on this machine, or a Ray cluster.

    with make_executor("process", jobs=4) as executor:
        rows = executor.map(run_cell, cells)                  # results in input order
    with make_executor("ray", ray_address="auto") as executor:  # an existing cluster; None: a local one
        rows = executor.map(run_cell, cells)

``map(fn, items, on_done=None)`` returns ``[fn(item) for item in items]`` in input order, whichever
order they finish in; ``on_done(done, total)`` is called as they finish. ``fn`` must be a module-level
function and the items picklable. Ray is imported only by :class:`RayExecutor` (``prefillq[ray]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from prefillq.sim.background import default_jobs

EXECUTORS = ("process", "ray")
OnDone = Callable[[int, int], None]


class ProcessExecutor:
    """``jobs`` worker processes (one: everything runs in this process, in order)."""

    def __init__(self, jobs: int = 1) -> None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
        self.jobs = jobs

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_done: OnDone | None = None) -> list[Any]:
        total = len(items)
        if self.jobs == 1 or total <= 1:
            results = []
            for item in items:
                results.append(fn(item))
                if on_done is not None:
                    on_done(len(results), total)
            return results
        from concurrent.futures import ProcessPoolExecutor, as_completed

        results: list[Any] = [None] * total
        with ProcessPoolExecutor(max_workers=min(self.jobs, total)) as pool:
            futures = {pool.submit(fn, item): position for position, item in enumerate(items)}
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(done, total)
        return results

    def close(self) -> None:
        """Nothing to release (the pool lives only inside :meth:`map`)."""

    def __enter__(self) -> ProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RayExecutor:
    """Tasks on Ray: the cluster at ``address`` (e.g. ``auto`` or ``ray://head:10001``), else a local Ray
    started here with ``num_cpus`` CPUs (shut down again by :meth:`close`). A Ray already initialised in
    this process is used as it is."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("the ray executor needs Ray: pip install 'prefillq[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                ray.init(address=address, **options)
            else:
                ray.init(num_cpus=num_cpus, **options)
            self.started = True

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], on_done: OnDone | None = None) -> list[Any]:
        ray = self.ray
        remote = ray.remote(num_cpus=1)(fn)
        refs = [remote.remote(item) for item in items]
        position = {ref: index for index, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[position[ref]] = ray.get(ref)
                done += 1
                if on_done is not None:
                    on_done(done, len(refs))
        return results

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_executor(kind: str = "process", *, jobs: int | None = None,
                  ray_address: str | None = None) -> ProcessExecutor | RayExecutor:
    """An executor by name (:data:`EXECUTORS`); ``jobs`` None means every CPU this process may use."""
    if kind == "process":
        if ray_address:
            raise ValueError("--ray-address goes with the ray executor")
        return ProcessExecutor(default_jobs() if jobs is None else jobs)
    if kind == "ray":
        return RayExecutor(ray_address, num_cpus=jobs)
    raise ValueError(f"unknown executor {kind!r}; valid executors: {', '.join(EXECUTORS)}")
