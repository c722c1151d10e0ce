"""The simulator: a discrete-event model of a continuous-batching engine driven by the policy queues.

    from prefillq.sim import simulate, lower_bounds, load_profile
    res = simulate(scenario("long-first"), "hrrn", profile="h100-qwen3.5-0.8b", budget=1024)
    res = simulate(scenario("long-then-stream"), "hrrn", topology="1p1d", pd=PdConfig(pairs=2))
"""

from prefillq.sim.bound import lower_bounds
from prefillq.sim.costs import CostModel, Profile, ProfileError, list_profiles, load_profile
from prefillq.sim.node import EngineLimits, SimulationError
from prefillq.sim.pd import PdConfig
from prefillq.sim.simulator import MODES, TOPOLOGIES, SimResult, simulate

__all__ = ["MODES", "TOPOLOGIES", "CostModel", "EngineLimits", "PdConfig", "Profile", "ProfileError", "SimResult",
           "SimulationError", "list_profiles", "load_profile", "lower_bounds", "simulate"]
