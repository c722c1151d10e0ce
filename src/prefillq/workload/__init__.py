"""Workloads shared by the simulator and the load generator: named scenarios and trace replay."""

from prefillq.workload.scenarios import (
    ALIASES,
    SCENARIOS,
    RequestSpec,
    Workload,
    WorkloadError,
    scenario,
    scenario_names,
)
from prefillq.workload.traces import default_long_threshold, load_trace

__all__ = [
    "ALIASES",
    "SCENARIOS",
    "RequestSpec",
    "Workload",
    "WorkloadError",
    "default_long_threshold",
    "load_trace",
    "scenario",
    "scenario_names",
]
