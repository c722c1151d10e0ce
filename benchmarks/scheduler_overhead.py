"""Cost of one vLLM engine step's scheduling: stock vLLM's scheduler against prefillq's, on CPU, no model.

What is timed: ``schedule()`` plus ``update_from_output()`` of one step (thread CPU time, so other
processes on a shared machine do not inflate it; wall time is kept too). Every prefillq policy
(``default``, ``promote_shortest``, ``hrrn``, ``short_request_first``, ``auto``) with
``partial_prefills`` ``first`` and ``ordered`` is stepped beside stock vLLM's scheduler, with synchronous
and asynchronous scheduling (vLLM's ``AsyncScheduler`` underneath; the driver keeps two steps in
flight, as the engine does), in two cells:

* ``1K``: 256 running decodes, 1,000 waiting, no prefix caching;
* ``10K``: 256 running, 10,000 waiting, prefix caching on (half the prompts start with one of 16 shared
  prefixes). On a vLLM with ``cache_aware_admission_window`` (0.34) the cell also has stock vLLM with the
  window (``--window``, default the whole queue; threshold 0 so it engages every step) and prefillq
  ``default`` with the same window, compared with each other: ``default`` is the only policy that
  accepts the window. Every policy (``default`` too) is also compared with stock vLLM without it.

Each scheduler is built from vLLM's config objects and a hand-made KV cache config (one full-attention
group, enough blocks for every running request); a fake model runner answers each step (a token for
each request whose step samples), so requests prefill, decode, finish, and seats go to waiting requests.
Before each step the waiting queue is topped up to its depth (outside the timed call). Prompts: 80%
short (32-256 tokens), 20% long (1-4K); outputs 16-64 tokens; ``max_num_batched_tokens`` 8192.

All schedulers of a cell are stepped in turn, the order rotating each step, so the noise of a shared
machine falls on each alike. The timed steps are cut into rounds; in each round a scheduler's figure is
its median step cost, and its ratio is that over its baseline's median in the same round. The table
shows the median of the round ratios with a distribution-free ~95% interval for that median (order
statistics of the rounds), beside the target (ratio <= 1.10, i.e. at most +10%).

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src:scripts/upstream .venv-upstream/vllm-0.34.0/bin/python \\
        benchmarks/scheduler_overhead.py [--cells 1K,10K] [--modes sync,async] [--rounds 12]
        [--steps-per-round 25] [--warmup 60] [--window N] [--only LABEL,...] [--json FILE]
        [--profile LABEL --profile-cell 10K --profile-mode sync] [--quick]

``--profile LABEL`` runs only that scheduler in one cell and mode under cProfile and prints the
functions where its steps spend their time (own time and cumulative), instead of the table.

Needs vLLM (the CPU build is enough; on 0.34 import ``upstream_env`` first, which this script does when
it is on the path). vLLM's model config needs a model folder: a fresh tiny test model in a temporary
folder (its weights are never loaded).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import cProfile
import dataclasses
import functools
import gc
import io
import json
import logging
import math
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BUDGET = 8192
BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192
TOKEN_IDS = 250  # token ids below 256: Python's cached small ints, so 100K prompts share their objects
STOCK = "vllm"
STOCK_WINDOW = "vllm +window"
TARGET_RATIO = 1.10
POLICIES = (("default", {"policy": "default"}), ("promote_shortest", {"policy": "promote_shortest"}),
            ("hrrn", {"policy": "hrrn"}),
            ("short_request_first", {"policy": "short_request_first", "threshold": 256, "long_max_wait_ms": 0}),
            ("auto", {"policy": "auto"}))
MODES = ("first", "ordered")


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    waiting: int
    running: int
    prefix_caching: bool
    window: int  # vLLM's cache_aware_admission_window for the rows that take it; 0 = none


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    prefillq: dict[str, Any] | None  # None: stock vLLM
    window: bool
    baseline: str | None  # the label this one is compared with


def has_window_option() -> bool:
    from vllm.config import SchedulerConfig

    return any(f.name == "cache_aware_admission_window" for f in dataclasses.fields(SchedulerConfig))


def variants(cell: Cell) -> list[Variant]:
    out = [Variant(STOCK, None, False, None)]
    if cell.window:
        out.append(Variant(STOCK_WINDOW, None, True, None))
    for name, policy in POLICIES:
        for mode in MODES:
            config = {**policy, "partial_prefills": mode}
            out.append(Variant(f"{name} {mode}", config, False, STOCK))
            if cell.window and name == "default":
                out.append(Variant(f"{name} {mode} +window", config, True, STOCK_WINDOW))
    return out


@functools.cache
def model_config(model: str) -> Any:
    """vLLM's model configuration, built once (it inspects the model's architecture in a subprocess)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=model, max_model_len=MAX_MODEL_LEN, seed=0, dtype="float32")


def build_scheduler(model: str, cell: Cell, variant: Variant, async_scheduling: bool) -> Any:
    import torch
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    window = {"cache_aware_admission_window": cell.window, "cache_aware_admission_threshold": 0.0} \
        if variant.window else {}
    scheduler_config = SchedulerConfig(max_num_seqs=cell.running, max_num_batched_tokens=BUDGET,
                                       max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                       is_encoder_decoder=False, async_scheduling=async_scheduling, **window)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=cell.prefix_caching)
    blocks = cell.running * (MAX_MODEL_LEN // BLOCK_SIZE) + 1
    cache_config.num_gpu_blocks = blocks
    additional = {"prefillq": {**variant.prefillq, "stats_interval_s": 0}} if variant.prefillq else {}
    vllm_config = VllmConfig(model_config=copy.deepcopy(model_config(model)), scheduler_config=scheduler_config,
                             cache_config=cache_config, additional_config=additional)
    vllm_config.scheduler_config.async_scheduling = async_scheduling  # CPU builds turn it off
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    if variant.prefillq is None:
        cls = VllmAsyncScheduler if async_scheduling else VllmScheduler
    else:
        from prefillq.integrations.vllm import Scheduler as cls
    scheduler = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                    structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK_SIZE,
                    log_stats=False)
    if variant.window and getattr(scheduler, "cache_aware_window", 0) != cell.window:
        raise RuntimeError(f"{variant.label}: vLLM did not turn the admission window on")
    return scheduler


class Workload:
    """Seeded request specs (prompt tokens, output length), made once and shared by every scheduler."""

    def __init__(self, seed: int, shared_prefixes: bool) -> None:
        self.rng = random.Random(seed)
        self.prefixes = ([[self.rng.randrange(3, TOKEN_IDS) for _ in range(self.rng.randint(256, 1024))]
                          for _ in range(16)] if shared_prefixes else [])
        self.specs: list[tuple[list[int], int]] = []

    def spec(self, number: int) -> tuple[list[int], int]:
        rng = self.rng
        while len(self.specs) <= number:
            length = rng.randint(32, 256) if rng.random() < 0.8 else rng.randint(1024, 4096)
            prefix = rng.choice(self.prefixes) if self.prefixes and rng.random() < 0.5 else []
            prompt = prefix + [rng.randrange(3, TOKEN_IDS) for _ in range(length)]
            self.specs.append((prompt, rng.randint(16, 64)))
        return self.specs[number]


class Engine:
    """One scheduler driven like vLLM's engine core, and the cost of each of its steps."""

    def __init__(self, model: str, cell: Cell, variant: Variant, async_scheduling: bool, workload: Workload,
                 hasher: Any) -> None:
        self.variant = variant
        self.scheduler = build_scheduler(model, cell, variant, async_scheduling)
        logging.getLogger("prefillq").setLevel(logging.ERROR)  # the scheduler set it to INFO
        self.cell, self.workload, self.hasher = cell, workload, hasher
        self.depth = 2 if async_scheduling else 1
        self.in_flight: collections.deque = collections.deque()
        self.added = 0
        self.schedule_cpu: list[float] = []
        self.update_cpu: list[float] = []
        self.wall: list[float] = []
        self.admitted = 0
        self.tokens = 0
        from vllm.v1.outputs import ModelRunnerOutput

        self.index_field = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}  # < 0.34

    def _request(self) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        prompt, max_tokens = self.workload.spec(self.added)
        self.added += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        return Request(f"r{self.added}", prompt, params, None, arrival_time=float(self.added),
                       block_hasher=self.hasher)

    def step(self, timed: bool) -> None:
        scheduler = self.scheduler
        while len(scheduler.waiting) < self.cell.waiting:
            scheduler.add_request(self._request())
        before = ({r.request_id: r.num_output_placeholders for r in scheduler.running if r.num_output_placeholders}
                  if self.depth > 1 else None)
        wall, cpu = time.perf_counter(), time.thread_time()
        output = scheduler.schedule()
        schedule_cpu, schedule_wall = time.thread_time() - cpu, time.perf_counter() - wall
        self.in_flight.append((output, self._model_output(output, before)))
        update_cpu = update_wall = 0.0
        if len(self.in_flight) >= self.depth:
            done = self.in_flight.popleft()
            wall, cpu = time.perf_counter(), time.thread_time()
            scheduler.update_from_output(*done)
            update_cpu, update_wall = time.thread_time() - cpu, time.perf_counter() - wall
        if timed:
            self.schedule_cpu.append(schedule_cpu)
            self.update_cpu.append(update_cpu)
            self.wall.append(schedule_wall + update_wall)
            self.admitted += len(output.scheduled_new_reqs)
            self.tokens += output.total_num_scheduled_tokens

    def _model_output(self, output: Any, before: dict[str, int] | None) -> Any:
        """The made-up model's answer: a token for each request that samples in this step (all its known
        tokens computed; under async scheduling, vLLM gave it one more output placeholder)."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(output.num_scheduled_tokens)
        requests = self.scheduler.requests
        sampled = []
        for request_id in ids:
            request = requests[request_id]
            if before is not None and (request.num_output_placeholders or request_id in before):
                samples = request.num_output_placeholders > before.get(request_id, 0)
            else:
                samples = request.num_computed_tokens >= request.num_tokens
            sampled.append([7] if samples else [])
        extra = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if self.index_field else {}
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **extra)

    def step_costs(self) -> list[float]:
        return [a + b for a, b in zip(self.schedule_cpu, self.update_cpu, strict=True)]


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """Median and a distribution-free interval for it (order statistics, >= ~95% when there are >= 6 values)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 0  # the largest k with P(Binomial(n, 1/2) < k) <= 2.5%
    while k + 1 <= n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n <= 0.025:
        k += 1
    low, high = (ordered[k - 1], ordered[n - k]) if k else (ordered[0], ordered[-1])
    return statistics.median(ordered), low, high


def measure(args: argparse.Namespace, model: str, cell: Cell, async_scheduling: bool,
            chosen: list[Variant]) -> list[dict[str, Any]]:
    """Step every scheduler of the cell in turn (order rotating); per-variant figures and round ratios."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256) if cell.prefix_caching else None
    workload = Workload(args.seed, cell.prefix_caching)
    engines = [Engine(model, cell, variant, async_scheduling, workload, hasher) for variant in chosen]
    total = args.warmup + args.rounds * args.steps_per_round
    for step in range(total):
        if step == args.warmup:  # the engines share this process's heap: keep what exists out of GC passes
            gc.collect()
            gc.freeze()
        shift = step % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            engine.step(timed=step >= args.warmup)
    gc.unfreeze()
    by_label = {engine.variant.label: engine for engine in engines}
    rows = []
    for engine in engines:
        costs = engine.step_costs()
        row: dict[str, Any] = {
            "cell": cell.name, "waiting": cell.waiting, "running": cell.running,
            "prefix_caching": cell.prefix_caching, "window": cell.window if engine.variant.window else 0,
            "mode": "async" if async_scheduling else "sync", "label": engine.variant.label,
            "prefillq": engine.variant.prefillq, "baseline": engine.variant.baseline,
            "step_cpu_median_us": statistics.median(costs) * 1e6,
            "step_cpu_mean_us": statistics.fmean(costs) * 1e6,
            "schedule_cpu_median_us": statistics.median(engine.schedule_cpu) * 1e6,
            "update_cpu_median_us": statistics.median(engine.update_cpu) * 1e6,
            "step_wall_median_us": statistics.median(engine.wall) * 1e6,
            "steps": len(costs), "admitted_per_step": engine.admitted / len(costs),
            "tokens_per_step": engine.tokens / len(costs),
            "running_end": len(engine.scheduler.running), "waiting_end": len(engine.scheduler.waiting)}
        baseline = by_label.get(engine.variant.baseline or "")
        if baseline is not None:
            ratios = round_ratios(baseline.step_costs(), costs, args.steps_per_round)
            median, low, high = median_interval(ratios)
            row.update({"ratio_median": median, "ratio_low": low, "ratio_high": high, "round_ratios": ratios,
                        "target_ratio": TARGET_RATIO, "met": high <= TARGET_RATIO,
                        "met_median": median <= TARGET_RATIO})
        rows.append(row)
    del engines, by_label
    gc.collect()
    return rows


def round_ratios(baseline: list[float], treatment: list[float], per_round: int) -> list[float]:
    out = []
    for start in range(0, len(baseline), per_round):
        a, b = baseline[start:start + per_round], treatment[start:start + per_round]
        out.append(statistics.median(b) / statistics.median(a))
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"vLLM {result['vllm']}, {result['rounds']} rounds x {result['steps_per_round']} steps, "
             f"load average {result['load_before']} before, {result['load_after']} after",
             f"{'cell':<5}{'mode':<6}{'scheduler':<29}{'step us':>8}{'sched':>7}{'update':>7}"
             f"{'vs stock':>9}{'~95% interval':>18}{'target':>8}{'met':>5}{'admit':>6}{'tokens':>7}"]
    for row in result["rows"]:
        lead = (f"{row['cell']:<5}{row['mode']:<6}{row['label']:<29}{row['step_cpu_median_us']:>8.0f}"
                f"{row['schedule_cpu_median_us']:>7.0f}{row['update_cpu_median_us']:>7.0f}")
        if "ratio_median" in row:
            interval = f"[{row['ratio_low'] - 1:+.1%}, {row['ratio_high'] - 1:+.1%}]"
            met = "yes" if row["met"] else ("~" if row["met_median"] else "NO")
            lead += (f"{row['ratio_median'] - 1:>+9.1%}{interval:>18}{f'<=+{TARGET_RATIO - 1:.0%}':>8}{met:>5}")
        else:
            lead += f"{'(baseline)':>9}{'':>18}{'':>8}{'':>5}"
        lines.append(lead + f"{row['admitted_per_step']:>6.1f}{row['tokens_per_step']:>7.0f}")
    lines.append("step us: median thread CPU of schedule() + update_from_output() per step (sched, update: "
                 "each alone); vs stock: median over rounds of the ratio of round medians against vLLM's own "
                 "(the +window rows against vLLM with the same window); met: yes = whole interval within "
                 "target, ~ = median within, NO = median over; admit/tokens: per step")
    return "\n".join(lines)


def profile(args: argparse.Namespace, model: str, cell: Cell, async_scheduling: bool, label: str) -> str:
    chosen = [v for v in variants(cell) if v.label == label]
    if not chosen:
        raise SystemExit(f"no scheduler {label!r} in cell {cell.name}; one of "
                         f"{', '.join(v.label for v in variants(cell))}")
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256) if cell.prefix_caching else None
    engine = Engine(model, cell, chosen[0], async_scheduling, Workload(args.seed, cell.prefix_caching), hasher)
    for _ in range(args.warmup):
        engine.step(timed=False)
    profiler = cProfile.Profile()
    scheduler = engine.scheduler
    schedule, update = scheduler.schedule, scheduler.update_from_output

    def profiled_schedule(*a: Any, **k: Any) -> Any:
        profiler.enable()
        try:
            return schedule(*a, **k)
        finally:
            profiler.disable()

    def profiled_update(*a: Any, **k: Any) -> Any:
        profiler.enable()
        try:
            return update(*a, **k)
        finally:
            profiler.disable()

    scheduler.schedule, scheduler.update_from_output = profiled_schedule, profiled_update
    steps = args.rounds * args.steps_per_round
    for _ in range(steps):
        engine.step(timed=True)
    out = io.StringIO()
    out.write(f"cProfile of {label!r}, cell {cell.name}, {'async' if async_scheduling else 'sync'}, "
              f"{steps} steps (median step {statistics.median(engine.step_costs()) * 1e6:.0f} us CPU, "
              f"profiler on)\n")
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(args.profile_top)
    stats.sort_stats("cumulative").print_stats(args.profile_top)
    return out.getvalue()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", default="1K,10K", help="1K (1,000 waiting) and/or 10K (10,000, prefix caching)")
    parser.add_argument("--modes", default="sync,async", help="sync and/or async scheduling")
    parser.add_argument("--running", type=int, default=256, help="running-request target (max_num_seqs)")
    parser.add_argument("--window", type=int, default=0,
                        help="cache_aware_admission_window in the 10K cell (default: the whole queue)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps-per-round", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=60, help="untimed steps first (fills the running set)")
    parser.add_argument("--only", help="comma-separated scheduler labels (stock vLLM rows are always kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    parser.add_argument("--profile", metavar="LABEL", help="profile this scheduler instead of the table")
    parser.add_argument("--profile-cell", default="10K")
    parser.add_argument("--profile-mode", default="sync")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 and 200 waiting, 8 running")
    args = parser.parse_args(argv)
    args.cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(args.cells) <= {"1K", "10K"} or not set(args.modes) <= {"sync", "async"}:
        parser.error("--cells takes 1K,10K and --modes sync,async")
    if min(args.rounds, args.steps_per_round, args.running) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps-per-round and --running must be positive")
    return args


def cell_table(args: argparse.Namespace) -> dict[str, Cell]:
    small, large = (50, 200) if args.quick else (1000, 10000)
    running = 8 if args.quick else args.running
    window = (args.window or large) if has_window_option() else 0
    return {"1K": Cell("1K", small, running, False, 0), "10K": Cell("10K", large, running, True, window)}


def cells(args: argparse.Namespace) -> list[Cell]:
    return [cell_table(args)[name] for name in args.cells]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.rounds, args.steps_per_round, args.warmup = 6, 3, 5
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with contextlib.suppress(ImportError):  # vLLM 0.34 on a CPU-only machine; on the path from scripts/upstream
        import upstream_env  # noqa: F401
    import vllm

    from prefillq.integrations.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(Path(tmp) / "tiny-llama"))
        if args.profile:
            cell = cell_table(args)[args.profile_cell]
            print(f"load average before {load_average()}")
            print(profile(args, model, cell, args.profile_mode == "async", args.profile))
            print(f"load average after {load_average()}")
            return 0
        only = {x.strip() for x in args.only.split(",")} if args.only else None
        load_before = load_average()
        rows = []
        for cell in cells(args):
            chosen = [v for v in variants(cell)
                      if only is None or v.prefillq is None or v.label in only]
            for mode in args.modes:
                rows += measure(args, model, cell, mode == "async", chosen)
                print(f"  measured {cell.name} {mode} (load {load_average()})", file=sys.stderr, flush=True)
        result = {"benchmark": "scheduler_overhead", "vllm": vllm.__version__, "python": platform.python_version(),
                  "cpus": os.cpu_count(), "rounds": args.rounds, "steps_per_round": args.steps_per_round,
                  "warmup": args.warmup, "seed": args.seed, "max_num_batched_tokens": BUDGET,
                  "target_ratio": TARGET_RATIO, "load_before": load_before, "load_after": load_average(),
                  "cells": [dataclasses.asdict(c) for c in cells(args)], "rows": rows}
    print(render(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
