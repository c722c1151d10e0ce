"""compare's reference schedules in worker processes: the same numbers as one after another, errors surface."""

from __future__ import annotations

import os

import pytest

from prefillq.sim.background import Background, can_fork
from prefillq.sim.compare import CompareSettings, prepare_comparison
from tests.test_compare_cli import run

needs_fork = pytest.mark.skipif(not can_fork(), reason="worker processes are forked (POSIX)")


def _pid() -> int:
    return os.getpid()


def _fails() -> None:
    raise RuntimeError("a worker's simulation failed")


@needs_fork
def test_calls_run_in_forked_workers_and_come_back_in_order():
    big = list(range(100_000))  # inherited through the fork, never pickled
    calls = [lambda k=k: (k, sum(big[k::3]), _pid()) for k in range(3)]
    done = []
    results = Background(calls, workers=2, on_done=lambda: done.append(1)).results()
    assert [(k, total) for k, total, _ in results] == [(k, sum(big[k::3])) for k in range(3)]
    assert all(pid != os.getpid() for _, _, pid in results)
    assert len(done) == 3
    here = Background(calls, workers=0).results()  # no workers: here, in order, the same values
    assert [(k, total) for k, total, _ in here] == [(k, total) for k, total, _ in results]
    assert all(pid == os.getpid() for _, _, pid in here)


@needs_fork
def test_a_workers_exception_is_raised_when_the_results_are_asked():
    runs = Background([lambda: 1, _fails], workers=2)
    with pytest.raises(RuntimeError, match="worker's simulation failed"):
        runs.results()


@pytest.mark.parametrize("scenario", ["long-first", "multi-turn"])
def test_the_comparison_is_the_same_whatever_the_jobs(scenario):
    def compared(jobs):
        setup = prepare_comparison(CompareSettings(scenario=scenario, policies=["default", "hrrn"], jobs=jobs))
        comparison = setup.run()
        return comparison.summaries, comparison.achievable, comparison.bound

    serial = compared(1)
    assert serial[1] is not None
    assert compared(None) == serial  # each reference schedule in a worker of its own
    assert compared(2) == serial     # both in one worker


def test_jobs_without_reference_schedules_is_refused():
    result = run("--scenario", "long-first", "--no-achievable", "--jobs", "2")
    assert result.exit_code == 2
    assert "--jobs 2" in result.output and "--no-achievable" in result.output
    result = run("--scenario", "long-first", "--jobs", "0")
    assert result.exit_code == 2


def _in_a_pool_worker(_: int) -> list:
    return Background([lambda: os.getpid()], workers=1).results()


@needs_fork
def test_inside_a_pool_worker_the_calls_run_there():
    # multiprocessing.Pool's workers are daemonic and may not start processes of their own
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        (pids,) = pool.map(_in_a_pool_worker, [0])
    assert len(pids) == 1 and pids[0] != os.getpid()
