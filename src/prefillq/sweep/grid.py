"""The sweep grid: policy specs x budgets x replicas x rate scales over one workload, one row per cell.

    grid = SweepGrid(trace="conv.csv", policies=("default", "hrrn"), replicas=(2, 4), rate_scales=(4, 8))
    rows = run_sweep(grid, executor)          # -> SweepResult: one row per cell, in grid order

Every cell is a plain, picklable :class:`Cell`; :func:`run_cell` simulates one and returns its row
(settings plus the summary figures), so a cell runs the same in this process, a worker process or a
Ray worker. Nothing in a row depends on where or when it ran: same grid, same rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from prefillq.validation import check_int, check_number, reject_unknown_keys

AXES = ("policies", "budgets", "replicas", "rate_scales")
ROW_METRICS = ("short_ttft_p50_ms", "short_ttft_p95_ms", "short_ttft_p99_ms", "long_ttft_p50_ms",
               "long_ttft_p95_ms", "ttft_p95_ms", "short_e2e_p95_ms", "long_e2e_p95_ms", "short_tpot_p50_ms",
               "itl_p95_ms", "output_tokens_per_s", "completed", "failed", "short_count", "long_count")
"""The summary figures a row carries (keys of :func:`prefillq.metrics.summarize`)."""


class SweepError(ValueError):
    """A sweep that cannot be set up as asked (a bad grid file, axis or setting)."""


@dataclass(frozen=True)
class SweepGrid:
    """The axes (each a tuple; the grid is their product) and the settings every cell shares.

    A budget of None takes the profile's. ``trace`` (a path) or ``scenario`` (a name, with
    ``overrides``) is the workload; a rate scale replays it that many times faster.
    """

    policies: tuple[str, ...] = ("default", "short_request_first")
    budgets: tuple[int | None, ...] = (None,)
    replicas: tuple[int, ...] = (1,)
    rate_scales: tuple[float, ...] = (1.0,)
    trace: str | None = None
    scenario: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    limit: int | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    long_threshold: int | None = None
    profile: str | None = None  # None: the mode's default (sim.costs.default_profile)
    mode: str = "vllm"
    router: str = "round_robin"
    gateway_policy: str | None = None
    max_inflight_per_replica: int | None = None
    seed: int = 0
    template_tokens: int = 0
    ttft_slo: str | None = None  # a TTFT SLO (prefillq.slo): each row then carries its goodput

    def __post_init__(self) -> None:
        for axis in AXES:
            values = tuple(getattr(self, axis))
            if not values:
                raise SweepError(f"the {axis} axis is empty")
            object.__setattr__(self, axis, values)
        object.__setattr__(self, "overrides", dict(self.overrides))
        if self.profile is None:
            from prefillq.sim.costs import default_profile

            object.__setattr__(self, "profile", default_profile(self.mode))
        try:
            for budget in self.budgets:
                if budget is not None:
                    check_int("budget", budget, minimum=1)
            for replicas in self.replicas:
                check_int("replicas", replicas, minimum=1)
            for scale in self.rate_scales:
                check_number("rate scale", scale, strict=True)
            if self.max_inflight_per_replica is not None:
                check_int("max_inflight_per_replica", self.max_inflight_per_replica, minimum=1)
            if self.ttft_slo is not None:
                from prefillq.slo import parse_ttft_slo

                parse_ttft_slo(self.ttft_slo)  # SloError (a ValueError) names a bad one
        except ValueError as exc:
            raise SweepError(str(exc)) from None
        if self.trace is not None and self.scenario is not None:
            raise SweepError("give either a scenario or a trace, not both")
        if self.trace is not None and self.overrides:
            raise SweepError("scenario parameter overrides apply to scenarios, not traces")

    def cells(self) -> list[Cell]:
        """Every cell, in grid order (policies vary slowest, rate scales fastest)."""
        shared = {name: getattr(self, name) for name in _SHARED}
        shared["overrides"] = tuple(sorted(self.overrides.items()))
        return [Cell(index=index, policy=policy, budget=budget, replicas=replicas, rate_scale=float(scale), **shared)
                for index, (policy, budget, replicas, scale) in enumerate(
                    itertools.product(self.policies, self.budgets, self.replicas, self.rate_scales))]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for axis in AXES:
            data[axis] = list(data[axis])
        return data


_SHARED = ("trace", "scenario", "overrides", "limit", "start_s", "duration_s", "long_threshold", "profile", "mode",
           "router", "gateway_policy", "max_inflight_per_replica", "seed", "template_tokens", "ttft_slo")


@dataclass(frozen=True)
class Cell:
    """One simulation of the grid (picklable: plain values only)."""

    index: int
    policy: str
    budget: int | None
    replicas: int
    rate_scale: float
    trace: str | None
    scenario: str | None
    overrides: tuple[tuple[str, Any], ...]
    limit: int | None
    start_s: float
    duration_s: float | None
    long_threshold: int | None
    profile: str
    mode: str
    router: str
    gateway_policy: str | None
    max_inflight_per_replica: int | None
    seed: int
    template_tokens: int
    ttft_slo: str | None = None

    @property
    def fleet(self) -> dict[str, Any] | None:
        """The fleet settings, or None for one engine without a gateway (the plain simulator)."""
        if self.replicas == 1 and self.gateway_policy is None:
            return None
        gateway = None if self.gateway_policy is None else parse_policy(self.gateway_policy)
        return {"replicas": self.replicas, "router": self.router, "gateway_policy": gateway,
                "max_inflight_per_replica": self.max_inflight_per_replica}


def parse_policy(spec: str) -> Any:
    """A policy SPEC (a name, ``NAME:KEY=VALUE,...`` or JSON; :func:`prefillq.config.parse_policy_spec`)
    as the configuration ``simulate`` takes; ConfigError names a bad one."""
    from prefillq.config import parse_policy_spec

    return parse_policy_spec(spec)[1]


@lru_cache(maxsize=8)
def _workload(trace: str | None, scenario: str | None, overrides: tuple[tuple[str, Any], ...], seed: int,
              rate_scale: float, limit: int | None, start_s: float, duration_s: float | None,
              long_threshold: int | None) -> Any:
    """The cell's workload (cached per process: every cell of a worker that shares it reads it once)."""
    from prefillq.workload import Workload, load_trace
    from prefillq.workload import scenario as make_scenario

    if trace is not None:
        return load_trace(trace, rate_scale=rate_scale, limit=limit, start_s=start_s, duration_s=duration_s,
                          long_threshold=long_threshold)
    base = make_scenario(scenario or "long-first", seed=seed, **dict(overrides))
    if rate_scale == 1.0:
        return base
    requests = [dataclasses.replace(r, arrival_s=r.arrival_s / rate_scale) for r in base.requests]
    return Workload(base.name, requests, {**base.params, "rate_scale": rate_scale})


def cell_workload(cell: Cell) -> Any:
    return _workload(cell.trace, cell.scenario, cell.overrides, cell.seed, cell.rate_scale, cell.limit, cell.start_s,
                     cell.duration_s, cell.long_threshold)


def run_cell(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; its row: the cell's axes, then the figures of :data:`ROW_METRICS` and the fleet's."""
    from prefillq.sim import simulate

    result = simulate(cell_workload(cell), parse_policy(cell.policy), profile=cell.profile, budget=cell.budget,
                      mode=cell.mode, seed=cell.seed, template_tokens=cell.template_tokens, fleet=cell.fleet)
    row: dict[str, Any] = {"cell": cell.index, "policy": cell.policy, "budget": result.limits.max_num_batched_tokens,
                           "replicas": cell.replicas, "rate_scale": cell.rate_scale, "router": cell.router,
                           "gateway_policy": cell.gateway_policy or "",
                           "max_inflight_per_replica": cell.max_inflight_per_replica}
    row.update({key: result.summary.get(key) for key in ROW_METRICS})
    if cell.ttft_slo is not None:
        from prefillq.metrics import ttft_goodput
        from prefillq.slo import parse_ttft_slo

        row.update(ttft_goodput(result.records, parse_ttft_slo(cell.ttft_slo)))
    fleet = result.fleet
    row["token_imbalance"] = fleet.get("token_imbalance", 1.0)
    row["gateway_wait_p95_ms"] = fleet.get("gateway", {}).get("wait_ms_p95")
    row["warnings"] = _cell_warnings(cell, result.limits.max_num_batched_tokens)
    return row


def _cell_warnings(cell: Cell, budget: int) -> list[str]:
    """The cell's overload warning (the one ``prefillq compare`` prints), as a list (empty when none)."""
    from types import SimpleNamespace

    from prefillq.sim import load_profile
    from prefillq.sim.compare import prefill_load_warning

    settings = SimpleNamespace(trace=cell.trace, rate_scale=cell.rate_scale, template_tokens=cell.template_tokens,
                               pd=None, fleet=SimpleNamespace(replicas=cell.replicas) if cell.fleet else None)
    warning = prefill_load_warning(cell_workload(cell), load_profile(cell.profile), budget, settings)
    return [warning] if warning else []


@dataclass
class SweepResult:
    """The grid and one row per cell, in grid order."""

    grid: SweepGrid
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"grid": self.grid.to_dict(), "rows": [_jsonable(row) for row in self.rows]}


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in row.items()}


def run_sweep(grid: SweepGrid, executor: Any, on_done: Callable[[int, int], None] | None = None) -> SweepResult:
    """Run every cell of ``grid`` through ``executor`` (``prefillq.sweep.executors``); rows in grid order."""
    cells = grid.cells()
    check_grid(grid)
    cell_workload(cells[0])  # a bad trace or scenario fails here, once, with its own message
    rows = executor.map(run_cell, cells, on_done=on_done)
    return SweepResult(grid, rows)


def check_grid(grid: SweepGrid) -> None:
    """Fail before any worker starts on a setting no cell could run with (the error names it)."""
    from prefillq.config import load_config
    from prefillq.sim import MODES, load_profile
    from prefillq.sim.fleet import ROUTERS
    from prefillq.validation import check_choice

    for spec in grid.policies:
        load_config(parse_policy(spec))  # ConfigError names a bad spec
    if grid.gateway_policy is not None:
        load_config(parse_policy(grid.gateway_policy))
    check_choice("mode", grid.mode, MODES, error=SweepError)
    check_choice("router", grid.router, ROUTERS, error=SweepError)
    load_profile(grid.profile)


# --- grid files -------------------------------------------------------------------------------------

_LIST_KEYS = {"policies": str, "budgets": int, "replicas": int, "rate_scales": float}


def load_grid_file(path: str | Path) -> dict[str, Any]:
    """A grid file's settings (TOML, or JSON for a ``.json`` file), keys as :class:`SweepGrid`'s fields."""
    import tomllib

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SweepError(f"{path}: no such grid file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepError(f"{path}: cannot read the grid file ({exc})") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SweepError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'} ({exc})") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a table of settings")
    try:
        reject_unknown_keys(data, SweepGrid.__dataclass_fields__, f"{path}: grid settings")
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    for key in _LIST_KEYS:
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]
    return data


def grid_from(settings: Mapping[str, Any]) -> SweepGrid:
    """A grid from settings (a file's, updated by the command line's); SweepError for a bad one."""
    values = dict(settings)
    for key in _LIST_KEYS:
        if key in values:
            values[key] = tuple(values[key])
    try:
        return SweepGrid(**values)
    except TypeError as exc:
        raise SweepError(f"bad grid settings: {exc}") from None
