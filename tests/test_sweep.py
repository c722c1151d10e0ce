"""Sweeps: the grid's cells, the rows, grid files, and the same rows from every executor and job count."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefillq.sweep import (
    ProcessExecutor,
    RayExecutor,
    SweepError,
    SweepGrid,
    grid_from,
    load_grid_file,
    make_executor,
    run_cell,
    run_sweep,
)

GRID = SweepGrid(scenario="sustained", overrides={"duration_s": 1.0, "long_tokens": 4096},
                 policies=("default", "hrrn"), budgets=(512, 1024), replicas=(1, 2), rate_scales=(1.0, 2.0))


def test_the_grid_is_the_product_of_its_axes_in_order() -> None:
    cells = GRID.cells()
    assert len(cells) == 16
    assert [c.index for c in cells] == list(range(16))
    assert [(c.policy, c.budget, c.replicas, c.rate_scale) for c in cells[:3]] == [
        ("default", 512, 1, 1.0), ("default", 512, 1, 2.0), ("default", 512, 2, 1.0)]
    assert cells[-1].policy == "hrrn" and cells[-1].budget == 1024 and cells[-1].replicas == 2


def test_a_row_is_the_simulation_of_its_cell() -> None:
    from prefillq.sim import simulate
    from prefillq.workload import Workload, scenario

    cell = GRID.cells()[5]  # default, budget 1024, 1 replica, rate scale 2
    row = run_cell(cell)
    base = scenario("sustained", seed=0, duration_s=1.0, long_tokens=4096)
    workload = Workload(base.name, [dataclasses.replace(r, arrival_s=r.arrival_s / 2.0) for r in base.requests])
    expected = simulate(workload, "default", budget=1024)
    assert row["short_ttft_p95_ms"] == expected.summary["short_ttft_p95_ms"]
    assert row["budget"] == 1024 and row["replicas"] == 1 and row["rate_scale"] == 2.0


def test_rate_scale_speeds_the_arrivals_up_and_replicas_share_the_load() -> None:
    rows = run_sweep(SweepGrid(scenario="sustained", overrides={"duration_s": 1.0}, policies=("default",),
                               replicas=(1, 2), rate_scales=(1.0, 3.0)), ProcessExecutor(1)).rows
    by_cell = {(row["replicas"], row["rate_scale"]): row for row in rows}
    assert by_cell[(1, 3.0)]["short_ttft_p95_ms"] > by_cell[(1, 1.0)]["short_ttft_p95_ms"]
    assert by_cell[(2, 1.0)]["short_ttft_p95_ms"] < by_cell[(1, 1.0)]["short_ttft_p95_ms"]


def test_two_worker_processes_give_exactly_the_rows_of_one() -> None:
    serial = run_sweep(GRID, ProcessExecutor(1)).rows
    parallel = run_sweep(GRID, ProcessExecutor(2)).rows
    assert parallel == serial
    assert [row["cell"] for row in serial] == list(range(16))


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_the_ray_executor_gives_exactly_the_rows_of_one_job(local_ray) -> None:
    serial = run_sweep(GRID, ProcessExecutor(1)).rows
    with RayExecutor() as executor:   # uses the Ray this module started, and leaves it running
        assert not executor.started
        distributed = run_sweep(GRID, executor).rows
    assert distributed == serial
    assert local_ray.is_initialized()


def test_grid_files_in_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "grid.toml"
    toml.write_text('scenario = "sustained"\npolicies = ["default", "hrrn"]\nbudgets = [512]\nreplicas = 2\n'
                    'rate_scales = [1.0, 2.0]\nrouter = "least_outstanding_tokens"\n[overrides]\nduration_s = 1.0\n')
    grid = grid_from(load_grid_file(toml))
    assert grid.replicas == (2,) and grid.budgets == (512,) and grid.overrides == {"duration_s": 1.0}
    assert len(grid.cells()) == 4
    as_json = tmp_path / "grid.json"
    as_json.write_text(json.dumps({**load_grid_file(toml), "replicas": [2]}))
    assert grid_from(load_grid_file(as_json)) == grid


@pytest.mark.parametrize(("content", "name", "words"), [
    ('policies = ["default"]\nspeed = 3\n', "grid.toml", "speed"),
    ("policies = [", "grid.toml", "not valid TOML"),
    ("{", "grid.json", "not valid JSON"),
    ("[1, 2]", "grid.json", "table of settings"),
])
def test_bad_grid_files_name_the_problem(tmp_path: Path, content: str, name: str, words: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SweepError, match=words):
        load_grid_file(path)


@pytest.mark.parametrize(("settings", "words"), [
    ({"budgets": []}, "budgets axis is empty"),
    ({"replicas": [0]}, "replicas"),
    ({"rate_scales": [-1.0]}, "rate scale"),
    ({"trace": "a.csv", "scenario": "sustained"}, "not both"),
])
def test_bad_grids_name_the_problem(settings: dict, words: str) -> None:
    with pytest.raises(SweepError, match=words):
        grid_from(settings)


def test_make_executor_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="process, ray"):
        make_executor("dask")
    with pytest.raises(ValueError, match="ray executor"):
        make_executor("process", ray_address="auto")
    with pytest.raises(ValueError, match="jobs"):
        ProcessExecutor(0)


def test_the_sweep_command_writes_a_row_per_cell(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "prefillq", "sweep", "--scenario", "sustained", "--set", "duration_s=1",
         "--policy", "default,hrrn", "--replicas", "1", "--replicas", "2", "--rate-scale", "1,2", "--jobs", "2",
         "--router", "least_outstanding_tokens", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert len(data["rows"]) == 8
    assert data["grid"]["router"] == "least_outstanding_tokens"
    assert len((tmp_path / "sweep.csv").read_text().splitlines()) == 9
    assert (tmp_path / "sweep-short_ttft_p95_ms.png").stat().st_size > 0


def test_tune_through_worker_processes_chooses_exactly_as_in_process(tmp_path: Path) -> None:
    from prefillq.tune import tune
    from prefillq.workload import load_trace
    from tests.traces import two_lengths_trace

    workload = load_trace(two_lengths_trace(tmp_path / "t.csv", short=140, long=60), rate_scale=4.0)
    here = tune(workload).to_dict()
    there = tune(workload, executor=ProcessExecutor(2)).to_dict()
    assert there == here
    assert set(here["predicted"]) == {"default", "promote_shortest", "hrrn", "short_request_first", "auto",
                                      "promote_shortest (ordered)", "hrrn (ordered)",
                                      "short_request_first (ordered)", "auto (ordered)",
                                      "short_request_first (strict)"}


def test_sweep_at_80_columns_without_out_points_to_no_file_it_did_not_write() -> None:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "prefillq", "sweep", "--scenario", "sustained", "--set", "duration_s=1",
         "--policy", "default,hrrn", "--rate-scale", "1,2"],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Not shown at this width" in result.stdout
    assert "sweep.csv" not in result.stdout.replace("--out DIR writes them to sweep.csv", "")
    assert "--out DIR writes them to sweep.csv" in result.stdout


def test_long_commands_show_an_estimate_of_the_time_left() -> None:
    import io
    import re

    from rich.console import Console

    from prefillq.cli import progress_bar

    now = [0.0]
    out = io.StringIO()
    bar = progress_bar("cells", console=Console(file=out, force_terminal=True, width=100, no_color=True),
                       get_time=lambda: now[0])
    task = bar.add_task("sweep", total=8)
    for cell in range(1, 5):  # a cell every 10 s: four more take about 40 s
        now[0] = 10.0 * cell
        bar.update(task, completed=cell)
    bar.console.print(bar.get_renderable())
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert "4/8 cells" in text
    assert re.search(r"left 0:00:([0-9]{2})", text), text
    assert 30 <= int(re.search(r"left 0:00:([0-9]{2})", text).group(1)) <= 50


def test_compare_s_bar_shows_the_share_done_and_the_time_left() -> None:
    import io
    import re

    from rich.console import Console

    from prefillq.cli import progress_bar

    now = [0.0]
    out = io.StringIO()
    bar = progress_bar("%", console=Console(file=out, force_terminal=True, width=100, no_color=True),
                       get_time=lambda: now[0])
    task = bar.add_task("simulating", total=1.0)
    for step in range(1, 5):  # a tenth every 10 s: six tenths more take about 60 s
        now[0] = 10.0 * step
        bar.update(task, completed=step / 10)
    bar.console.print(bar.get_renderable())
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert " 40%" in text
    left = re.search(r"left 0:0([0-9]):([0-9]{2})", text)
    assert left and 45 <= 60 * int(left.group(1)) + int(left.group(2)) <= 75, text
