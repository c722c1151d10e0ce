"""Lower bounds on short TTFT (SPEC §7): no schedule, policy or engine mode beats them, for each statistic."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq.config import POLICIES
from prefillq.metrics import percentile
from prefillq.sim import MODES, CostModel, Profile, simulate
from prefillq.sim.bound import (
    isolated_seconds,
    lower_bounds,
    most_within,
    order_statistic_bound,
    srpt_completions,
    work_seconds,
)
from prefillq.sim.compare import compare_policies
from prefillq.sim.costs import DEFAULT_LIMITS
from prefillq.workload import RequestSpec, Workload

STATS = ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms")
SHORT_MAX = 20  # prompts above this are "long" in the hand-made workloads


def profile(budget: int, c0: float = 0.01, c1: float = 0.001, c2: float = 0.0, c3: float = 0.0,
            c4: float = 0.0) -> Profile:
    defaults = dict(DEFAULT_LIMITS)
    defaults["max_num_batched_tokens"] = budget
    return Profile("test", "", "", CostModel(c0, c1, c2, c3, c4), defaults)


def workload(jobs: list[tuple[float, int]], output_tokens: int = 1) -> Workload:
    specs = [RequestSpec(f"r{i}", arrival, tokens, output_tokens, "long" if tokens > SHORT_MAX else "short")
             for i, (arrival, tokens) in enumerate(jobs)]
    return Workload("tiny", sorted(specs, key=lambda s: s.arrival_s), {})


def stats_ms(ttfts_s: list[float]) -> dict[str, float | None]:
    ms = [t * 1000.0 for t in ttfts_s]
    return {"short_ttft_mean_ms": sum(ms) / len(ms), "short_ttft_p50_ms": percentile(ms, 50),
            "short_ttft_p95_ms": percentile(ms, 95)}


def priority_schedule(jobs: list[tuple[float, int]], cost: CostModel, budget: int, rank: tuple[int, ...],
                      running_first: bool) -> list[float]:
    """TTFTs (s) of a naive engine: each step fills the budget in chunks, by ``rank`` among arrived
    requests (``running_first``: started prefills keep their place first, as in vLLM); one output token."""
    computed = [0] * len(jobs)
    started: list[int] = []
    ttft = [0.0] * len(jobs)
    left = set(range(len(jobs)))
    now = 0.0
    while left:
        ready = sorted((i for i in left if jobs[i][0] <= now), key=lambda i: rank[i])
        if not ready:
            now = min(jobs[i][0] for i in left)
            continue
        if running_first:
            ready = [i for i in started if i in left] + [i for i in ready if i not in started]
        room = budget
        chunks = []
        for i in ready:
            chunk = min(jobs[i][1] - computed[i], room)
            if chunk <= 0:
                break
            chunks.append((i, chunk))
            room -= chunk
            if i not in started:
                started.append(i)
        attention = sum(cost.attention_work(chunk, computed[i]) for i, chunk in chunks)
        now += cost.step_latency(budget - room, attention, 0, 0)
        for i, chunk in chunks:
            computed[i] += chunk
            if computed[i] == jobs[i][1]:
                ttft[i] = now - jobs[i][0]
                left.discard(i)
    return ttft


def best_over_orders(jobs: list[tuple[float, int]], cost: CostModel, budget: int) -> dict[str, float]:
    """The least value of each short-TTFT statistic over every priority order, both running rules."""
    shorts = [i for i, (_, tokens) in enumerate(jobs) if tokens <= SHORT_MAX]
    best = dict.fromkeys(STATS, float("inf"))
    for rank in itertools.permutations(range(len(jobs))):
        for running_first in (False, True):
            ttft = priority_schedule(jobs, cost, budget, rank, running_first)
            for key, value in stats_ms([ttft[i] for i in shorts]).items():
                best[key] = min(best[key], value)
    return best


def test_naive_engine_matches_the_simulator_under_fcfs():
    jobs = [(0.0, 30), (0.01, 3), (0.012, 7), (0.05, 25), (0.06, 1)]
    prof = profile(4, c2=0.0001)
    ttft = priority_schedule(jobs, prof.cost, 4, tuple(range(len(jobs))), running_first=True)
    result = simulate(workload(jobs), "default", profile=prof)
    assert [r.ttft_s for r in result.records] == pytest.approx(ttft, rel=1e-12)


def test_isolated_request_bound_is_its_simulated_ttft():
    # Not vacuous: on an idle engine the bound is reached (up to the 1 ns rounding guard).
    prof = profile(4, c2=0.0001)
    bounds = lower_bounds(workload([(0.5, 11)]), prof)
    ttft_ms = simulate(workload([(0.5, 11)]), "default", profile=prof).summary["short_ttft_p50_ms"]
    for key in STATS:
        assert ttft_ms - 1e-5 < bounds[key] <= ttft_ms
    assert isolated_seconds(prof.cost, 11, 4) == pytest.approx(prof.cost.prefill_latency(11, 4), rel=1e-12)


def fluid_srpt_percentile_ms(jobs, prof: Profile, q: float, budget: int | None = None) -> float:
    """What the removed "oracle" printed: percentiles of per-request max(fluid SRPT flow time at the best
    prefill rate, isolated latency). It bounds the mean, not percentiles (kept here to show that)."""
    budget = prof.limit("max_num_batched_tokens") if budget is None else budget
    rate = budget / prof.cost.step_latency(budget, 0.0, 0, 0)
    done = srpt_completions([(arrival, tokens / rate) for arrival, tokens in jobs])
    flows = [max(finish - arrival, prof.cost.prefill_latency(tokens, budget)) * 1000.0
             for (arrival, tokens), finish in zip(jobs, done, strict=True)]
    return percentile(flows, q)


def test_old_oracle_p95_is_beaten_by_default_and_the_bound_is_not():
    # Four short prompts of varied length: FCFS finishes the 8-token one later than SRPT would, but
    # the others earlier, and gets a lower P95 than the fluid-SRPT "oracle" printed.
    jobs = [(0.062, 1), (0.144, 3), (0.156, 8), (0.171, 2)]
    prof = profile(4)
    summary = simulate(workload(jobs), "default", profile=prof).summary
    assert summary["short_ttft_p95_ms"] < fluid_srpt_percentile_ms(jobs, prof, 95)
    bounds = lower_bounds(workload(jobs), prof)
    for key in STATS:
        assert bounds[key] <= summary[key]
    assert bounds["short_ttft_p95_ms"] <= best_over_orders(jobs, prof.cost, 4)["short_ttft_p95_ms"]


JOB = st.tuples(st.integers(0, 30).map(lambda ms: ms / 100.0),
                st.sampled_from([1, 2, 3, 4, 5, 7, 9, 13, 20, 24, 33]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(JOB, min_size=3, max_size=6).filter(lambda js: any(t <= SHORT_MAX for _, t in js)),
       budget=st.integers(2, 6), c0=st.sampled_from([0.0, 0.002, 0.01]), c2=st.sampled_from([0.0, 0.0002]))
def test_bound_is_below_every_priority_order(jobs, budget, c0, c2):
    prof = profile(budget, c0=c0, c2=c2)
    best = best_over_orders(jobs, prof.cost, budget)
    bounds = lower_bounds(workload(jobs), prof)
    for key in STATS:
        assert bounds[key] <= best[key], key


def test_old_oracle_fails_brute_force_somewhere():
    jobs = [(0.0, 5), (0.0, 1), (0.01, 3), (0.02, 2), (0.03, 9)]
    prof = profile(3)
    best = best_over_orders(jobs, prof.cost, 3)
    assert best["short_ttft_p95_ms"] < fluid_srpt_percentile_ms(jobs, prof, 95)
    assert lower_bounds(workload(jobs), prof)["short_ttft_p95_ms"] <= best["short_ttft_p95_ms"]


def test_srpt_by_hand():
    # Job 0 (work 4) runs 0-1, job 1 (work 1) preempts it at 1 and ends at 2; job 0 ends at 5.
    assert srpt_completions([(0.0, 4.0), (1.0, 1.0)]) == [5.0, 2.0]
    assert srpt_completions([(0.0, 4.0), (1.0, 1.0)], speed=2.0) == [2.5, 1.5]
    assert srpt_completions([]) == []


def test_a_burst_of_equal_prompts_reaches_every_bound():
    # 10 one-step prompts at once: the k-th can finish no sooner than k steps, which FCFS achieves.
    prof = profile(8)
    work = workload([(0.0, 8)] * 10)
    bounds = lower_bounds(work, prof)
    step_ms = isolated_seconds(prof.cost, 8, 8) * 1000
    summary = simulate(work, "default", profile=prof).summary
    expected = {"short_ttft_mean_ms": 5.5 * step_ms, "short_ttft_p50_ms": 5.5 * step_ms,
                "short_ttft_p95_ms": (9 + 0.55) * step_ms}
    for key in STATS:
        assert summary[key] == pytest.approx(expected[key], rel=1e-9)
        assert summary[key] * (1 - 1e-6) <= bounds[key] <= summary[key]
    assert "SRPT" in bounds["method"] and "isolated" in bounds["method"] and "window" in bounds["method"]


def test_most_within_counts_what_fits_by_hand():
    # Works 1, 1, 3 released at 0, 0, 10: within f = 2 the first two fit (0..2) and the third
    # alone needs 3 > 2; within f = 3 all three fit.
    arrivals, works, isolated = [0.0, 0.0, 10.0], [1.0, 1.0, 3.0], [1.0, 1.0, 3.0]
    assert most_within(arrivals, works, isolated, 2.0) == 2
    assert most_within(arrivals, works, isolated, 3.0) == 3
    assert most_within(arrivals, works, isolated, 1.5) == 1
    assert most_within(arrivals, works, isolated, 1.0, speed=2.0) == 2
    assert most_within(arrivals, works, [1.0, 5.0, 3.0], 3.0) == 2  # isolated time 5 > 3 cannot count
    assert order_statistic_bound(arrivals, works, isolated, 2) == pytest.approx(2.0, rel=1e-6)
    assert order_statistic_bound(arrivals, works, isolated, 2) <= 2.0


def test_bad_arguments_and_empty_class():
    prof = profile(4)
    with pytest.raises(ValueError):
        lower_bounds(workload([(0.0, 3)]), prof, budget=0)
    with pytest.raises(ValueError):
        lower_bounds(workload([(0.0, 3)]), prof, engines=0)
    with pytest.raises(ValueError):
        lower_bounds(workload([(0.0, 3)]), profile(4, c1=-0.001))
    empty = lower_bounds(workload([(0.0, 30)]), prof)
    assert empty["count"] == 0 and all(empty[key] is None for key in STATS)


LENGTHS = st.sampled_from([16, 40, 96, 128, 200, 300, 500, 900, 2000, 5000])
POLICY_CONFIGS = [*POLICIES, {"policy": "short_request_first", "threshold": 100},
                  {"policy": "short_request_first", "threshold": 1000, "long_max_wait_ms": 50}]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(st.tuples(st.integers(0, 2000), LENGTHS, st.integers(1, 12)), min_size=2, max_size=30),
       budget=st.sampled_from([64, 256, 1024]), template=st.sampled_from([0, 12]))
def test_no_policy_in_either_mode_beats_the_bound(data, budget, template):
    specs = [RequestSpec(f"r{i}", ms / 1000.0, tokens, out, "long" if tokens > 600 else "short")
             for i, (ms, tokens, out) in enumerate(data)]
    work = Workload("random", sorted(specs, key=lambda s: s.arrival_s), {})
    prof = profile(budget, c0=0.005, c1=2e-5, c2=1e-8, c3=1e-4, c4=1e-7)
    bounds = lower_bounds(work, prof, budget=budget, template_tokens=template)
    for mode in MODES:
        for policy in POLICY_CONFIGS:
            summary = simulate(work, policy, profile=prof, budget=budget, mode=mode,
                               template_tokens=template).summary
            for key in STATS:
                if bounds[key] is not None:
                    assert bounds[key] <= summary[key], (mode, policy, key)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(st.tuples(st.integers(0, 500), LENGTHS), min_size=4, max_size=24), pairs=st.integers(1, 2))
def test_disaggregated_prefill_nodes_do_not_beat_the_bound_with_as_many_engines(data, pairs):
    specs = [RequestSpec(f"r{i}", ms / 1000.0, tokens, 4, "long" if tokens > 600 else "short")
             for i, (ms, tokens) in enumerate(data)]
    work = Workload("random", sorted(specs, key=lambda s: s.arrival_s), {})
    bounds = lower_bounds(work, "h100-qwen3.5-0.8b", budget=256, engines=pairs)
    for policy in ("default", "hrrn"):
        summary = simulate(work, policy, profile="h100-qwen3.5-0.8b", budget=256, topology="1p1d",
                           pd={"pairs": pairs}).summary
        for key in STATS:
            if bounds[key] is not None:
                assert bounds[key] <= summary[key], (policy, key)


# --- review items 1 and 2 of issue 20: the bound with every simulated feature -------------------------


def shared_prefix(count: int = 20, tokens: int = 512, gap_s: float = 1.0) -> Workload:
    """``count`` prompts of ``tokens`` that share one trace block (a whole-prompt prefix), one a ``gap_s``."""
    specs = [RequestSpec(f"r{i}", i * gap_s, tokens, 4, "short", hash_ids=(1,)) for i in range(count)]
    return Workload("shared", specs, {"prefix_hash_block_tokens": tokens})


@pytest.mark.parametrize(("profile_name", "template"), [("h100-qwen3.5-0.8b", 12), ("cpu-tiny-llama", 1)])
def test_a_prefix_hit_that_reaches_into_the_template_does_not_beat_the_bound(profile_name, template):
    # The simulator's hit stops a token short of prompt + template, so a whole shared prompt hits when the
    # template adds tokens: the best case the bound assumes must go that far too.
    work = shared_prefix()
    comparison = compare_policies(lambda _seed: work, profile=profile_name, template_tokens=template)
    direct = lower_bounds(work, profile_name, template_tokens=template)
    for bound in (comparison.bound, direct):
        for policy, summary in comparison.summaries.items():
            for key in STATS:
                assert bound[key] <= summary[key], (policy, key)
    # ... and still counts the hit: without it the bound would be a whole 512-token prefill
    assert direct["short_ttft_p50_ms"] < lower_bounds(work, profile_name, template_tokens=template,
                                                      prefix_cache=False)["short_ttft_p50_ms"]


def cheaper_in_lightllm(budget: int = 256) -> Profile:
    base = profile(budget, c0=0.01, c1=2e-5)
    return replace(base, extra={"lightllm": {"step_overhead_s": 0.001, "prefill_token_s": 5e-6}})


def test_lightllm_mode_is_bounded_on_the_cost_it_runs_on():
    prof = cheaper_in_lightllm()
    work = workload([(0.0, 10), (0.001, 12), (0.002, 16), (0.5, 9)])
    # router_tick_s=0: the router admits at every step start, so nothing waits for a tick
    comparison = compare_policies(lambda _seed: work, ["default"], profile=prof, mode="lightllm",
                                  engine_options={"router_tick_s": 0.0})
    summary = comparison.summaries["default"]
    for key in STATS:
        assert comparison.bound[key] <= summary[key], key
    bounds = lower_bounds(work, prof, mode="lightllm")
    for key in STATS:
        assert bounds[key] <= summary[key], key
    # the vLLM-mode bound is on the base cost: above what LightLLM mode runs
    assert lower_bounds(work, prof)["short_ttft_p50_ms"] > summary["short_ttft_p50_ms"]


def cached_priority_schedule(jobs: list[tuple[float, int, tuple[int, ...]]], cost: CostModel, budget: int,
                             rank: tuple[int, ...], running_first: bool, block: int, template: int) -> list[float]:
    """TTFTs (s) of a naive engine with an infinite prefix cache (nothing is ever evicted: the best case
    for hits). Job = (arrival, prompt tokens, one hash per ``block`` tokens); the engine computes prompt +
    ``template`` tokens. A request's first chunk looks up its leading full hashed blocks, a token short of
    what it computes; a block is cached as soon as a chunk that fills it is scheduled."""
    cached: set[tuple[int, int]] = set()
    total = [tokens + template for _, tokens, _ in jobs]
    computed = [0] * len(jobs)
    started: list[int] = []
    ttft = [0.0] * len(jobs)
    left = set(range(len(jobs)))
    now = 0.0
    while left:
        ready = sorted((i for i in left if jobs[i][0] <= now), key=lambda i: rank[i])
        if not ready:
            now = min(jobs[i][0] for i in left)
            continue
        if running_first:
            ready = [i for i in started if i in left] + [i for i in ready if i not in started]
        room = budget
        chunks = []
        for i in ready:
            _, tokens, hashes = jobs[i]
            hashed = min(len(hashes) * block, tokens) // block
            if i not in started:
                hit = 0
                while hit < min(hashed, (total[i] - 1) // block) and (hashes[hit], hit) in cached:
                    hit += 1
                computed[i] = hit * block
            chunk = min(total[i] - computed[i], room)
            if chunk <= 0:
                break
            if i not in started:
                started.append(i)
            chunks.append((i, chunk, computed[i]))
            cached.update((hashes[b], b) for b in range(min(hashed, (computed[i] + chunk) // block)))
            computed[i] += chunk
            room -= chunk
        attention = sum(cost.attention_work(chunk, before) for _, chunk, before in chunks)
        now += cost.step_latency(budget - room, attention, 0, 0)
        for i, _, _ in chunks:
            if computed[i] == total[i]:
                ttft[i] = now - jobs[i][0]
                left.discard(i)
    return ttft


CACHED_JOB = st.tuples(st.integers(0, 20).map(lambda ms: ms / 100.0), st.sampled_from([3, 4, 5, 8, 9, 12]),
                       st.integers(0, 2), st.integers(0, 3))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(CACHED_JOB, min_size=2, max_size=5), budget=st.integers(3, 8), template=st.sampled_from([0, 1, 3]),
       c0=st.sampled_from([0.0, 0.01]), c2=st.sampled_from([0.0, 0.0002]))
def test_bound_with_prefix_caching_is_below_every_priority_order(rows, budget, template, c0, c2):
    # Blocks of 4 tokens, one hash per block: a job shares its group's first `shared` blocks.
    block = 4
    jobs = []
    for i, (arrival, tokens, group, shared) in enumerate(rows):
        count = -(-tokens // block)
        jobs.append((arrival, tokens, tuple(100 * (group + 1) + b if b < shared else 1000 * (i + 1) + b
                                            for b in range(count))))
    prof = replace(profile(budget, c0=c0, c2=c2), defaults={**profile(budget).defaults, "block_size": block})
    shorts = [i for i, (_, tokens, _) in enumerate(jobs) if tokens <= SHORT_MAX]
    best = dict.fromkeys(STATS, float("inf"))
    for rank in itertools.permutations(range(len(jobs))):
        for running_first in (False, True):
            ttft = cached_priority_schedule(jobs, prof.cost, budget, rank, running_first, block, template)
            for key, value in stats_ms([ttft[i] for i in shorts]).items():
                best[key] = min(best[key], value)
    specs = [RequestSpec(f"r{i}", arrival, tokens, 1, "short", hash_ids=hashes)
             for i, (arrival, tokens, hashes) in enumerate(jobs)]
    work = Workload("cached", sorted(specs, key=lambda s: s.arrival_s), {"prefix_hash_block_tokens": block})
    bounds = lower_bounds(work, prof, template_tokens=template)
    for key in STATS:
        assert bounds[key] <= best[key], key


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 600)), min_size=1, max_size=50),
       st.sampled_from([(0.01, 1e-4, 0.0), (0.0, 1e-3, 1e-7), (0.004, 0.0, 0.0), (0.0, 0.0, 0.0)]),
       st.sampled_from([16, 64, 1024]), st.sampled_from([1.0, 2.0]), st.integers(0, 2**32 - 1))
def test_the_window_bound_read_off_in_one_pass_counts_as_most_within(jobs, coefficients, budget, speed, seed):
    """lower_bounds reads every order statistic off one bottom-up pass (_order_thresholds): at any flow
    time, the thresholds at or below it count what most_within (the grids, f by f) counts."""
    import random

    from prefillq.sim.bound import _order_thresholds

    cost = CostModel(*coefficients)
    jobs = sorted((at / 100, tokens) for at, tokens in jobs)
    arrivals = [at for at, _ in jobs]
    works = [work_seconds(cost, tokens, budget) for _, tokens in jobs]
    isolated = [isolated_seconds(cost, tokens, budget) for _, tokens in jobs]
    thresholds = _order_thresholds(arrivals, works, isolated, speed)
    assert thresholds is not None and len(thresholds) == len(jobs)
    assert list(thresholds) == sorted(thresholds)
    rng = random.Random(seed)
    flows = [rng.uniform(0, 2 * max(isolated) + 4) for _ in range(20)]
    flows += [t * (1 + 1e-9) + 1e-12 for t in thresholds] + [t * (1 - 1e-9) - 1e-12 for t in thresholds]
    for flow in flows:  # (at a threshold itself the two may round either way: a rounding error apart)
        assert sum(t <= flow for t in thresholds) == most_within(arrivals, works, isolated, flow, speed)


def test_isolated_times_out_of_the_works_order_take_the_grids_f_by_f():
    # Sorting by work does not sort these isolated times: no one-pass thresholds, and the bound still comes out.
    from prefillq.sim.bound import _order_thresholds

    assert _order_thresholds([0.0, 0.0, 10.0], [1.0, 1.0, 3.0], [1.0, 5.0, 3.0], 1.0) is None
    assert order_statistic_bound([0.0, 0.0, 10.0], [1.0, 1.0, 3.0], [1.0, 5.0, 3.0], 2) == pytest.approx(3.0, rel=1e-6)
