"""The lower bound holds with every feature the simulator models (SPEC §7): a randomized search over
prefix sharing (block hashes), chat-template tokens, LightLLM cost overrides, fleets of replicas, both
partial-prefill modes, chunking caps and tight KV, asserting that no policy's simulated short-TTFT
statistic, nor any clairvoyant reference schedule's (the achievable row), falls below the bound
``compare`` prints beside them (issue 20)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefillq.config import POLICIES, PolicyConfig
from prefillq.sim import CostModel, Profile
from prefillq.sim.compare import compare_policies
from prefillq.sim.costs import DEFAULT_LIMITS
from prefillq.sim.fleet import ROUTERS, FleetConfig
from prefillq.workload import RequestSpec, Workload

STATS = ("short_ttft_mean_ms", "short_ttft_p50_ms", "short_ttft_p95_ms")
BLOCK = 16
SHORT_MAX = 200  # prompts above this are "long"
LENGTHS = st.sampled_from([1, 15, 16, 17, 31, 32, 48, 64, 100, 160, 200, 320, 500])


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Requests in a few prefix groups: each shares a drawn number of leading trace blocks with its group's
    chain, then has blocks of its own; some carry no hashes at all."""
    hash_block = draw(st.sampled_from([8, 16, 32]))
    rows = draw(st.lists(st.tuples(st.integers(0, 300), LENGTHS, st.integers(1, 6), st.integers(-1, 2),
                                   st.integers(0, 40)), min_size=2, max_size=16))
    specs = []
    for i, (ms, tokens, out, group, shared) in enumerate(rows):
        count = -(-tokens // hash_block)
        hashes = None if group < 0 else tuple(
            1000 * (group + 1) + b if b < shared else 10**6 * (i + 1) + b for b in range(count))
        specs.append(RequestSpec(f"r{i}", ms / 1000.0, tokens, out, "long" if tokens > SHORT_MAX else "short",
                                 hash_ids=hashes))
    specs.sort(key=lambda spec: spec.arrival_s)
    params = {"prefix_hash_block_tokens": hash_block} if any(s.hash_ids for s in specs) else {}
    return Workload("fuzz", specs, params)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    """A cost model, sometimes with a LightLLM override block that is cheaper or dearer than the base."""
    defaults = dict(DEFAULT_LIMITS, block_size=BLOCK, max_num_batched_tokens=draw(st.sampled_from([32, 64, 256])))
    cost = CostModel(draw(st.sampled_from([0.0, 0.002, 0.01])), draw(st.sampled_from([1e-5, 1e-4])),
                     draw(st.sampled_from([0.0, 1e-7])), 1e-4, 1e-7)
    override = draw(st.sampled_from([None, {"step_overhead_s": 0.0005, "prefill_token_s": 2e-6},
                                     {"step_overhead_s": 0.02, "attention_token2_s": 1e-6}]))
    extra = {} if override is None else {"lightllm": override}
    return Profile("fuzz", "", "", cost, defaults, extra=extra,
                   frontend_s=draw(st.sampled_from([0.0, 0.001])))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(work=workloads(), prof=profiles(), mode=st.sampled_from(["vllm", "lightllm"]),
       template=st.sampled_from([0, 1, 5, 12]), partial=st.sampled_from(["first", "ordered"]),
       replicas=st.sampled_from([None, 2, 3]), router=st.sampled_from(ROUTERS),
       gateway_cap=st.sampled_from([None, 1, 2]), chunk_cap=st.sampled_from([None, 24]),
       kv_blocks=st.sampled_from([None, 48]))
def test_no_policy_beats_the_bound_with_any_simulated_feature(work, prof, mode, template, partial, replicas, router,
                                                               gateway_cap, chunk_cap, kv_blocks):
    configs = {name: PolicyConfig(policy=name, partial_prefills=partial) for name in POLICIES}
    fleet = None if replicas is None else FleetConfig(
        replicas=replicas, router=router, gateway_policy=None if gateway_cap is None else "hrrn",
        max_inflight_per_replica=gateway_cap)
    comparison = compare_policies(lambda _seed: work, configs, profile=prof,
                                  mode=mode, template_tokens=template, fleet=fleet, kv_blocks=kv_blocks,
                                  long_prefill_token_threshold=chunk_cap)
    bound = comparison.bound
    rows = {**comparison.summaries, **comparison.achievable["schedules"]}  # the clairvoyant references too
    for label, summary in rows.items():
        for key in STATS:
            if bound[key] is not None:
                assert bound[key] <= summary[key], (label, key, bound[key], summary[key])

