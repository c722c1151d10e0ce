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
from prefillq.workload.split import ThresholdChoice, prompt_class, split_threshold
from prefillq.workload.traces import load_trace

__all__ = [
    "ALIASES",
    "SCENARIOS",
    "RequestSpec",
    "ThresholdChoice",
    "Workload",
    "WorkloadError",
    "load_trace",
    "prompt_class",
    "scenario",
    "scenario_names",
    "split_threshold",
]
