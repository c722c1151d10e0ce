"""Sweeps: a grid of simulations (policy specs x budgets x replicas x rate scales), run in parallel.

``grid.py`` defines the grid, its cells and the row each produces; ``executors.py`` runs cells in
worker processes or on Ray. ``prefillq sweep`` is the command; ``prefillq tune`` runs its candidate
simulations through the same executors.
"""

from prefillq.sweep.executors import EXECUTORS, ProcessExecutor, RayExecutor, default_jobs, make_executor
from prefillq.sweep.grid import (
    AXES,
    ROW_METRICS,
    Cell,
    SweepError,
    SweepGrid,
    SweepResult,
    grid_from,
    load_grid_file,
    run_cell,
    run_sweep,
)

__all__ = ["AXES", "EXECUTORS", "ROW_METRICS", "Cell", "ProcessExecutor", "RayExecutor", "SweepError", "SweepGrid",
           "SweepResult", "default_jobs", "grid_from", "load_grid_file", "make_executor", "run_cell", "run_sweep"]
