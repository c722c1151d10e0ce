"""Run several policies on the same workload(s) and collect what ``prefillq compare`` reports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefillq.metrics import RequestRecord, median_summary
from prefillq.sim.costs import Profile, load_profile
from prefillq.sim.oracle import oracle
from prefillq.sim.simulator import SimResult, simulate
from prefillq.workload import Workload

DEFAULT_POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first")


@dataclass
class Comparison:
    """Summaries per policy (median over repeats), records, timelines and the oracle bound."""

    workload: str
    profile: str
    mode: str
    budget: int
    repeats: int
    seed: int
    summaries: dict[str, dict[str, Any]]
    per_repeat: dict[str, list[dict[str, Any]]]
    records: dict[str, list[tuple[int, RequestRecord]]]
    last_runs: dict[str, SimResult]
    oracle: dict[str, Any]
    workload_params: dict[str, Any] = field(default_factory=dict)


def compare_policies(make_workload: Callable[[int], Workload], policies: Sequence[str] = DEFAULT_POLICIES, *,
                     profile: str | Profile = "h100-qwen3.5-0.8b", budget: int | None = None, mode: str = "vllm",
                     repeats: int = 1, seed: int = 0, template_tokens: int = 0, max_num_seqs: int | None = None,
                     kv_blocks: int | None = None, topology: str = "mixed", pd: Any = None,
                     on_run_done: Callable[[str, int], None] | None = None) -> Comparison:
    """Simulate each policy on ``make_workload(seed + repeat)`` for every repeat."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    prof = load_profile(profile)
    budget_value = prof.limit("max_num_batched_tokens") if budget is None else int(budget)
    if budget_value < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget_value}")
    per_repeat: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    records: dict[str, list[tuple[int, RequestRecord]]] = {p: [] for p in policies}
    last_runs: dict[str, SimResult] = {}
    oracles: list[dict[str, Any]] = []
    workload = None
    for repeat in range(repeats):
        workload = make_workload(seed + repeat)
        oracles.append(oracle(workload, profile=prof, budget=budget_value, template_tokens=template_tokens))
        for policy in policies:
            result = simulate(workload, policy, profile=prof, budget=budget_value, mode=mode,
                              max_num_seqs=max_num_seqs, kv_blocks=kv_blocks, seed=seed + repeat,
                              template_tokens=template_tokens, topology=topology, pd=pd)
            per_repeat[policy].append(result.summary)
            records[policy].extend((repeat, rec) for rec in result.records)
            last_runs[policy] = result
            if on_run_done is not None:
                on_run_done(policy, repeat)
    assert workload is not None
    oracle_summary = median_summary([{k: v for k, v in o.items() if k != "ttft_s"} for o in oracles])
    oracle_summary["ttft_s"] = oracles[-1]["ttft_s"]
    return Comparison(
        workload=workload.name, profile=prof.name, mode=mode, budget=budget_value, repeats=repeats, seed=seed,
        summaries={p: median_summary(per_repeat[p]) for p in policies}, per_repeat=per_repeat, records=records,
        last_runs=last_runs, oracle=oracle_summary, workload_params=dict(workload.params),
    )
