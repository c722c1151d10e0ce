"""vLLM-style prefix caching in the simulator (sim/prefix_cache.py, VllmNode): hits at admission, LRU
eviction of unreferenced cached blocks, HRRN costing by uncached tokens, traces with hash_ids."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefillq.sim import simulate
from prefillq.sim.prefix_cache import PrefixCache, PrefixState
from prefillq.workload import RequestSpec, Workload, WorkloadError, load_trace, scenario
from tests.test_compare_cli import _app

BLOCK = 16  # the default profile's block size


def hashed(*rows: tuple[str, float, int, int, tuple[int, ...] | None]) -> Workload:
    """A workload of (id, arrival, prompt, output, hashes) whose hashes are one per engine block."""
    requests = [RequestSpec(rid, at, prompt, output, "short", hash_ids=hashes) for rid, at, prompt, output, hashes
                in rows]
    return Workload("hand", requests, {"prefix_hash_block_tokens": BLOCK})


def ids(base: int, count: int) -> tuple[int, ...]:
    return tuple(range(base, base + count))


# --- the cache alone, by hand -------------------------------------------------------------------------


def test_freed_blocks_stay_cached_and_the_tail_is_evicted_first():
    cache = PrefixCache(num_blocks=4, block_size=2, hash_block_tokens=2)
    keys = cache.block_keys([1, 2, 3], 6)
    assert keys == [(1, 0), (2, 1), (3, 2)]
    a = PrefixState(keys)
    cache.allocate(3)
    cache.cache_full(keys, 3, a)
    assert cache.free == 1 and cache.lookup(keys, 3) == 3
    assert cache.release(0, a) == 3  # free but cached: the free count has them back
    assert cache.free == 4 and cache.lookup(keys, 3) == 3
    cache.allocate(2)    # the one uncached block first, then the LRU cached one: A's tail (block 2)
    assert cache.evictions == 1
    assert cache.lookup(keys, 3) == 2
    b = PrefixState(keys)
    assert cache.evictable_among(keys, 2) == 2
    cache.take_hit(keys, 2, b)  # a hit takes the free cached blocks out of the free queue
    assert cache.free == 0 and cache.refs[(1, 0)] == 1
    c = PrefixState(keys)
    cache.take_hit(keys, 1, c)  # a block two requests reference ...
    assert cache.release(0, b) == 1 and cache.free == 1  # ... is not free until both let go
    assert cache.release(0, c) == 1 and list(cache.evictable) == [(2, 1), (1, 0)]


def test_a_block_is_identified_by_the_trace_block_holding_its_last_token():
    cache = PrefixCache(num_blocks=8, block_size=16, hash_block_tokens=512)
    keys = cache.block_keys([7, 8], 600)
    assert len(keys) == 37  # 600 tokens: 37 full blocks
    assert keys[0] == (7, 0) and keys[31] == (7, 31) and keys[32] == (8, 32)
    assert len(cache.block_keys([7], 600)) == 32  # the hashes cover 512 tokens


# --- the engine, by hand --------------------------------------------------------------------------------


def test_a_repeated_prompt_hits_all_but_its_last_block():
    w = hashed(("a", 0.0, 64, 1, ids(0, 4)), ("b", 1.0, 64, 1, ids(0, 4)))
    result = simulate(w, "default", record_steps=True)
    # b finds 4 blocks cached but recomputes its last token, so only 3 blocks (48 tokens) hit
    assert result.prefix_cache["hit_tokens"] == 48
    assert result.prefix_cache["queried_tokens"] == 128
    assert result.prefix_cache["prefill_tokens"] == 64 + 16
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx(48 / 128)
    chunks = [chunk for step in result.node.steps for chunk in step.prefill_chunks]
    assert chunks == [("a", 64), ("b", 16)]


def test_lru_eviction_on_a_tiny_pool():
    # 8 blocks. a (4 blocks) finishes: its blocks are free but cached. b (6 new blocks) takes the 4
    # never-used blocks, then evicts the 2 least recently freed: a's tail (a3, then a2). c repeats a:
    # a0 and a1 hit, and its 2 new blocks evict b's tail.
    w = hashed(("a", 0.0, 64, 1, ids(0, 4)), ("b", 1.0, 96, 1, ids(100, 6)), ("c", 2.0, 64, 1, ids(0, 4)))
    result = simulate(w, "default", kv_blocks=8, record_steps=True)
    hits = {r.request_id: r.prefix.hit_tokens for r in result.node.finished}
    assert hits == {"a": 0, "b": 0, "c": 32}
    assert result.prefix_cache["evicted_blocks"] == 4
    node = result.node
    assert node.free_blocks == node.prefix.free == 8
    assert sorted(node.prefix.evictable) == sorted([(0, 0), (1, 1), (2, 2), (3, 3), (100, 0), (101, 1),
                                                    (102, 2), (103, 3)])


def test_computed_plus_cached_is_the_prompt_for_every_request():
    w = scenario("multi-turn", duration_s=3.0)
    result = simulate(w, "hrrn", record_steps=True)
    assert result.preemptions == 0
    computed: Counter[str] = Counter()
    for step in result.node.steps:
        for rid, chunk in step.prefill_chunks:
            computed[rid] += chunk
    finished = result.node.finished
    assert len(finished) == len(w.requests)
    for r in finished:
        assert computed[r.request_id] + r.prefix.hit_tokens == r.prompt_tokens
    stats = result.prefix_cache
    assert stats["prefill_tokens"] + stats["hit_tokens"] == stats["queried_tokens"] == sum(
        r.prompt_tokens for r in w.requests)
    assert result.node.free_blocks == result.node.prefix.free
    assert all(count == 0 for count in result.node.prefix.refs.values())


def test_hrrn_costs_a_request_by_its_uncached_tokens():
    # "warm" leaves 4 cached blocks. While "blocker" holds the whole budget, y (112 tokens, no hashes)
    # and x (160 tokens, its first 64 those of warm) arrive together. HRRN runs the cheaper first:
    # y (112 < 160) without the cache, x (160 - 64 = 96 < 112) with it.
    w = hashed(("warm", 0.0, 64, 1, ids(0, 4)), ("blocker", 1.0, 640, 1, None),
               ("y", 1.001, 112, 1, None), ("x", 1.001, 160, 1, ids(0, 10)))

    def first_scheduled(prefix_cache: bool) -> dict[str, float]:
        result = simulate(w, "hrrn", budget=64, prefix_cache=prefix_cache)
        return {r.request_id: result.records.first_scheduled_s[i] for i, r in enumerate(w.requests)}

    cached = first_scheduled(True)
    plain = first_scheduled(False)
    assert cached["x"] < cached["y"]
    assert plain["y"] < plain["x"]


# --- workloads ------------------------------------------------------------------------------------------


def test_multi_turn_hits_and_prefills_less():
    w = scenario("multi-turn")
    assert w.params["prefix_hash_block_tokens"] == 16
    turns = [r for r in w.requests if r.session == "session-0"]
    assert len(turns) == 4
    for earlier, later in itertools.pairwise(turns):  # each turn extends the one before
        assert later.prompt_tokens > earlier.prompt_tokens
        assert later.hash_ids[:len(earlier.hash_ids) - 1] == earlier.hash_ids[:-1]
    cached = simulate(w, "default")
    plain = simulate(w, "default", prefix_cache=False)
    assert cached.prefix_cache["hit_rate"] > 0.5
    assert cached.prefix_cache["prefill_tokens"] < sum(r.prompt_tokens for r in w.requests)
    assert plain.prefix_cache == {} and "prefix_cache_hit_rate" not in plain.summary
    assert cached.summary["short_ttft_p50_ms"] < plain.summary["short_ttft_p50_ms"]


def test_no_prefix_cache_gives_the_numbers_of_the_workload_without_hashes():
    w = scenario("multi-turn", duration_s=3.0)
    stripped = Workload(w.name, [RequestSpec(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.klass,
                                             session=r.session) for r in w.requests], {})
    off = simulate(w, "hrrn", prefix_cache=False)
    assert off.summary == simulate(stripped, "hrrn").summary
    assert off.steps == simulate(stripped, "hrrn").steps


def test_mooncake_hash_ids_feed_the_cache(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [7, 8, 9]}\n'
        '{"timestamp": 30, "input_length": 40, "output_length": 2}\n'
        '{"timestamp": 1000, "input_length": 1500, "output_length": 2, "hash_ids": [7, 8, 10]}\n')
    w = load_trace(path)
    assert [r.hash_ids for r in w.requests] == [(7, 8, 9), None, (7, 8, 10)]
    assert w.params["prefix_hash_block_tokens"] == 512
    result = simulate(w, "default")
    assert result.prefix_cache["hit_tokens"] == 1024  # hashes 7 and 8: 2 x 512 tokens
    assert load_trace(path, limit=2).requests[1].hash_ids is None


def test_a_trace_without_hashes_has_no_prefix_cache(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 2}\n')
    w = load_trace(path)
    assert "prefix_hash_block_tokens" not in w.params
    assert simulate(w, "default").prefix_cache == {}
    with pytest.raises(ValueError, match="carry block hashes"):
        simulate(w, "default", prefix_cache=True)


def test_bad_hash_ids_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1, "x"]}\n')
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:1: hash_ids must be a list of 64-bit integers"):
        load_trace(path)


def test_lightllm_ignores_hashes_and_refuses_prefix_cache():
    w = scenario("multi-turn", duration_s=1.0)
    assert simulate(w, "default", mode="lightllm").prefix_cache == {}
    with pytest.raises(ValueError, match="vllm mode on the mixed topology only"):
        simulate(w, "default", mode="lightllm", prefix_cache=True)
    with pytest.raises(ValueError, match="vllm mode on the mixed topology only"):
        simulate(w, "default", topology="1p1d", pd={}, prefix_cache=True)


# --- compare --------------------------------------------------------------------------------------------


def test_compare_reports_the_hit_rate(tmp_path):
    runner = CliRunner()
    out = tmp_path / "s.json"
    args = ["compare", "--scenario", "multi-turn", "--set", "duration_s=2", "--policies", "default,hrrn"]
    result = runner.invoke(_app(), [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "prefix cache hit rate" in result.output
    data = json.loads(out.read_text())
    rates = {label: row["prefix_cache_hit_rate"] for label, row in data["policies"].items()}
    assert set(rates) == {"default", "hrrn"} and all(rate > 0 for rate in rates.values())
    assert data["prefix_cache"]["hrrn"]["hit_tokens"] > 0
    off = runner.invoke(_app(), [*args, "--no-prefix-cache", "--json", str(out)])
    assert off.exit_code == 0 and "prefix cache hit rate" not in off.output
    assert "prefix_cache_hit_rate" not in json.loads(out.read_text())["policies"]["hrrn"]


def test_compare_lightllm_warns_and_refuses_prefix_cache():
    runner = CliRunner()
    args = ["compare", "--scenario", "multi-turn", "--set", "duration_s=1", "--policies", "default", "--mode",
            "lightllm"]
    result = runner.invoke(_app(), args)
    assert result.exit_code == 0, result.output
    assert "lightllm mode does not model prefix caching" in " ".join(result.output.split())
    refused = runner.invoke(_app(), [*args, "--prefix-cache"])
    assert refused.exit_code == 2
    assert "Traceback" not in refused.output and "drop --prefix-cache" in " ".join(refused.output.split())
    no_hashes = runner.invoke(_app(), ["compare", "--scenario", "low-load", "--prefix-cache"])
    assert no_hashes.exit_code == 2 and "carry block hashes" in " ".join(no_hashes.output.split())


# --- against a naive reference model --------------------------------------------------------------------


class NaiveCache:
    """The free queue as a plain list (front first), refcounts in a dict."""

    def __init__(self, blocks: int) -> None:
        self.queue: list[object] = ["plain"] * blocks
        self.refs: dict[tuple[int, int], int] = {}
        self.evictions = 0

    def lookup(self, keys: list[tuple[int, int]]) -> int:
        hit = 0
        while hit < len(keys) and keys[hit] in self.refs:
            hit += 1
        return hit

    def allocate(self, count: int) -> None:
        for _ in range(count):
            block = self.queue.pop(0)
            if block != "plain":
                del self.refs[block]  # type: ignore[arg-type]
                self.evictions += 1

    def admit(self, keys: list[tuple[int, int]], hit: int, new: int, full: int) -> list[tuple[int, int]]:
        held = []
        for key in keys[:hit]:
            if self.refs[key] == 0:
                self.queue.remove(key)
            self.refs[key] += 1
            held.append(key)
        self.allocate(new)
        for key in keys[hit:full]:
            if key not in self.refs:
                self.refs[key] = 1
                held.append(key)
        return held

    def release(self, total: int, held: list[tuple[int, int]]) -> int:
        self.queue[:0] = ["plain"] * (total - len(held))
        for key in reversed(held):
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.queue.append(key)
        return len(self.queue)


operations = st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 3), min_size=1, max_size=5),
                                st.integers(0, 3), st.integers(0, 7)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(blocks=st.integers(1, 10), ops=operations)
def test_the_cache_matches_a_naive_model(blocks, ops):
    cache = PrefixCache(blocks, block_size=1, hash_block_tokens=1)
    naive = NaiveCache(blocks)
    running: list[tuple[PrefixState, int, list[tuple[int, int]]]] = []  # (state, blocks held, naive's keys)
    for admit, hashes, extra, pick in ops:
        if not admit:  # free one running request
            if running:
                state, total, held = running.pop(pick % len(running))
                free_before = len(naive.queue)
                assert cache.release(total - len(state.keys), state) == naive.release(total, held) - free_before
        else:
            keys = [(h, b) for b, h in enumerate(hashes)]
            assert cache.block_keys(hashes, len(hashes)) == keys
            hit = cache.lookup(keys, len(keys))
            assert hit == naive.lookup(keys)
            taken = cache.evictable_among(keys, hit)
            new = len(hashes) - hit + extra  # the prompt's blocks and some uncached ones (output)
            if new + taken <= cache.free:
                state = PrefixState(keys)
                cache.take_hit(keys, hit, state)
                cache.allocate(new)
                cache.cache_full(keys, len(keys), state)
                held = naive.admit(keys, hit, new, len(hashes))
                assert state.keys == held
                running.append((state, len(hashes) + extra, held))
        assert cache.free == len(naive.queue)
        assert list(cache.evictable) == [b for b in naive.queue if b != "plain"]
        assert cache.refs == naive.refs
        assert cache.evictions == naive.evictions


def test_bench_records_may_carry_hash_ids_and_the_block_size_is_a_setting(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(
        '{"request_id": "a", "klass": "short", "scheduled_at": 0, "prompt_tokens": 64, "output_tokens": 2, '
        '"hash_ids": [1, 2]}\n'
        '{"request_id": "b", "klass": "short", "scheduled_at": 1, "prompt_tokens": 64, "output_tokens": 2, '
        '"hash_ids": [1, 3]}\n')
    w = load_trace(path, hash_block_tokens=32)
    assert [r.hash_ids for r in w.requests] == [(1, 2), (1, 3)]
    assert simulate(w, "default").prefix_cache["hit_tokens"] == 32  # b shares a's first 32 tokens
    with pytest.raises(WorkloadError, match="hash_block_tokens must be an integer >= 1"):
        load_trace(path, hash_block_tokens=0)
    runner = CliRunner()
    bad = runner.invoke(_app(), ["compare", "--trace", str(path), "--hash-block-tokens", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_compare_1p1d_notes_that_hashes_are_ignored():
    result = CliRunner().invoke(_app(), ["compare", "--scenario", "multi-turn", "--set", "duration_s=1",
                                         "--policies", "default", "--topology", "1p1d"])
    assert result.exit_code == 0, result.output
    assert "1p1d topology does not model prefix caching" in " ".join(result.output.split())


@pytest.mark.parametrize(("policy", "kv_blocks"), [
    ({"policy": "hrrn", "partial_prefills": "ordered"}, None),  # the plan predicts admissions after hits
    ("hrrn", 600),                                               # a small pool: preemptions and evictions
])
def test_the_pool_adds_up_under_partial_prefills_and_preemption(policy, kv_blocks):
    w = scenario("multi-turn", rate=20.0, duration_s=4.0)
    result = simulate(w, policy, long_prefill_token_threshold=256, kv_blocks=kv_blocks, record_steps=True)
    node = result.node
    assert len(node.finished) == len(w.requests)
    assert node.free_blocks == node.prefix.free == node.limits.kv_blocks
    assert all(count == 0 for count in node.prefix.refs.values())
    for step in node.steps:
        assert 0 <= step.used_blocks <= node.limits.kv_blocks
    stats = result.prefix_cache
    assert 0 < stats["hit_tokens"] < stats["queried_tokens"]
    # as vLLM 0.32 counts (PrefixCacheStats.record): each request's first admission in the hit rate, a
    # preempted request's re-admissions in the preempted_* counters only
    assert stats["queried_tokens"] == sum(r.prompt_tokens for r in w.requests)
    assert stats["hit_rate"] == stats["hit_tokens"] / stats["queried_tokens"]
    assert stats["preempted_requests"] == result.preemptions
    if kv_blocks is not None:
        assert result.preemptions > 0 and stats["evicted_blocks"] > 0
        # a preempted request is looked up again (prompt plus the output it had), and recomputes what it lost
        assert stats["preempted_queried_tokens"] > 0
        assert stats["prefill_tokens"] + stats["hit_tokens"] + stats["preempted_hit_tokens"] > stats["queried_tokens"]
    else:
        assert stats["preempted_queried_tokens"] == stats["preempted_hit_tokens"] == 0
        assert stats["prefill_tokens"] + stats["hit_tokens"] == stats["queried_tokens"]


def test_a_preempted_re_admission_stays_out_of_the_hit_rate():
    # vLLM 0.32 (KVCacheManager.record_prefix_cache_stats -> PrefixCacheStats.record) keeps a preempted
    # request's lookups in preempted_* counters, so the hit rate is that of the requests' first admissions.
    w = scenario("multi-turn", rate=20.0, duration_s=4.0)
    tight = simulate(w, "hrrn", long_prefill_token_threshold=256, kv_blocks=600)
    assert tight.preemptions > 0
    stats = tight.prefix_cache
    prompts = sum(spec.prompt_tokens for spec in w.requests)  # each request looked up once, when first admitted
    assert stats["queried_tokens"] == prompts
    assert tight.summary["prefix_cache_hit_rate"] == pytest.approx(stats["hit_tokens"] / prompts)
    assert stats["preempted_requests"] == tight.preemptions and stats["preempted_hit_tokens"] > 0
    merged = simulate(w, "hrrn", long_prefill_token_threshold=256, kv_blocks=600, fleet={"replicas": 2})
    assert merged.prefix_cache["queried_tokens"] == prompts
    assert merged.prefix_cache["preempted_requests"] == merged.preemptions
