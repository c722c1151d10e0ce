"""Cost of one vLLM ``schedule()`` call: vLLM's own scheduler against prefillq's, on CPU, with no model.

Each scheduler is built in this process from vLLM's config objects and a hand-made KV cache config (one
full-attention group, enough blocks for every running request); a fake model runner answers each step
(one sampled token for each request whose prefill is done, none for a partial prefill), so requests
prefill in chunks, decode and finish, and their seats go to waiting requests. Before each step the
waiting queue is topped up to its target depth (outside the timed call), so it stays at 1K or 10K.

Prompts: 80% short (32-256 tokens), 20% long (1-4K); outputs 16-64 tokens; ``max_num_seqs`` is the
running target and ``max_num_batched_tokens`` (``--budget``) 8192, so the running requests stay at
the target under every policy (rows compare like with like) and each step admits a few requests. A
smaller budget makes long prompts prefill in chunks across steps, but then the running count depends
on the policy (FCFS stays below the target, short-first policies fill it), and rows stop comparing.
Schedulers compared: vLLM's own; prefillq with ``default`` (FCFS: the same decisions as vLLM's, so the
difference is pure overhead), with ``hrrn`` (token-aged, so it admits long and short prompts in its
own order) and with ``short_request_first`` (threshold 256, no aging: with the queue kept full only
short prompts are admitted, so its batches are smaller), each with ``partial_prefills`` "first" and,
when this prefillq has the option, "ordered" ("n/a" otherwise).

All schedulers of a row are stepped in turn, so the noise of a shared machine falls on each alike. The
figure compared is the thread's CPU time per call, the median first: a garbage-collector pass lands in
whichever call allocates at the time, whatever the scheduler (the heap is frozen after the warm-up to
keep such passes short). The periodic statistics line is off (``stats_interval_s`` 0); it costs one
pass over the waiting queue every 5 s (about 3.5 ms at 10K waiting).

    python benchmarks/scheduler_overhead.py [--waiting 1000,10000] [--running 64,256] [--steps 300]
        [--warmup 50] [--budget 8192] [--model DIR] [--json benchmarks/out/scheduler_overhead.json] [--quick]

Needs vLLM (the CPU build is enough). vLLM's model config needs a model folder: by default a fresh tiny
test model in a temporary folder (its weights are never loaded).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

BUDGET = 8192
BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192
VOCAB = 2048
STOCK = "vllm"


def variants() -> list[tuple[str, dict[str, Any] | None]]:
    """(label, prefillq configuration; None for vLLM's own scheduler or for an option prefillq lacks)."""
    from prefillq.config import PolicyConfig

    has_option = "partial_prefills" in {f.name for f in fields(PolicyConfig)}
    out: list[tuple[str, dict[str, Any] | None]] = [(STOCK, None)]
    for name, policy in (("fcfs", {"policy": "default"}), ("hrrn", {"policy": "hrrn"}),
                         ("srf", {"policy": "short_request_first", "threshold": 256, "long_max_wait_ms": 0})):
        out.append((f"prefillq {name} first", {**policy, **({"partial_prefills": "first"} if has_option else {})}))
        out.append((f"prefillq {name} ordered", {**policy, "partial_prefills": "ordered"} if has_option else None))
    return out


@functools.cache
def model_config(model: str) -> Any:
    """vLLM's model configuration, built once (it inspects the model's architecture in a subprocess)."""
    from vllm.config import ModelConfig

    return ModelConfig(model=model, max_model_len=MAX_MODEL_LEN, seed=0, dtype="float32")


def build_scheduler(model: str, running: int, budget: int, prefillq: dict[str, Any] | None) -> Any:
    import torch
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_config = SchedulerConfig(max_num_seqs=running, max_num_batched_tokens=budget,
                                       max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                       is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    blocks = running * (MAX_MODEL_LEN // BLOCK_SIZE) + 1
    cache_config.num_gpu_blocks = blocks
    vllm_config = VllmConfig(model_config=copy.deepcopy(model_config(model)), scheduler_config=scheduler_config,
                             cache_config=cache_config,
                             additional_config={"prefillq": {**prefillq, "stats_interval_s": 0}} if prefillq else {})
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    if prefillq is None:
        cls = VllmScheduler
    else:
        from prefillq.integrations.vllm import Scheduler as cls
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK_SIZE)


class Workload:
    """Seeded requests: prompt and output lengths, ids in arrival order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.count = 0

    def request(self) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        rng = self.rng
        prompt = rng.randint(32, 256) if rng.random() < 0.8 else rng.randint(1024, 4096)
        params = SamplingParams(max_tokens=rng.randint(16, 64), ignore_eos=True, temperature=0.0)
        self.count += 1
        return Request(f"r{self.count}", [rng.randrange(3, VOCAB) for _ in range(prompt)], params, None,
                       arrival_time=float(self.count))


def fake_model_output(scheduler: Any, output: Any) -> Any:
    """What a model runner would return: one token for each request whose prefill is complete."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        request = scheduler.requests[rid]
        sampled.append([7] if request.num_computed_tokens >= request.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                             sampled_token_ids=sampled)


class Engine:
    """One scheduler, its own copy of the workload, and the times of its schedule() calls.

    Each call is timed twice: the thread's CPU time (what the call cost; other processes on a shared
    machine do not inflate it) and wall-clock time.
    """

    def __init__(self, model: str, waiting: int, running: int, budget: int, config: dict[str, Any] | None,
                 seed: int) -> None:
        self.scheduler = build_scheduler(model, running, budget, config)
        logging.getLogger("prefillq").setLevel(logging.ERROR)  # the scheduler set it to INFO
        self.workload = Workload(seed)
        self.waiting = waiting
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.admitted = 0
        self.tokens = 0
        self.counters = getattr(self.scheduler, "partial_prefill_counters", None)  # prefillq's, if it has them
        self.counted_from = (0, 0)

    def step(self, timed: bool) -> None:
        scheduler = self.scheduler
        while len(scheduler.waiting) < self.waiting:
            scheduler.add_request(self.workload.request())
        wall, cpu = time.perf_counter(), time.thread_time()
        output = scheduler.schedule()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        if timed:
            if not self.cpu and self.counters is not None:
                self.counted_from = (self.counters.deferred, self.counters.tokens_yielded)
            self.cpu.append(cpu)
            self.wall.append(wall)
            self.admitted += len(output.scheduled_new_reqs)
            self.tokens += output.total_num_scheduled_tokens
        scheduler.update_from_output(output, fake_model_output(scheduler, output))

    def summary(self) -> dict[str, Any]:
        steps = len(self.cpu)
        return {"cpu_mean_us": statistics.fmean(self.cpu) * 1e6, "cpu_median_us": statistics.median(self.cpu) * 1e6,
                "wall_mean_us": statistics.fmean(self.wall) * 1e6,
                "wall_median_us": statistics.median(self.wall) * 1e6, "steps": steps,
                "admitted_per_step": self.admitted / steps, "tokens_per_step": self.tokens / steps,
                **self._deferrals(steps),
                "running_end": len(self.scheduler.running), "waiting_end": len(self.scheduler.waiting)}


    def _deferrals(self, steps: int) -> dict[str, float | None]:
        """Partial prefills deferred and tokens they yielded per step (partial_prefills="ordered"); None for vLLM."""
        if self.counters is None:
            return {"deferred_per_step": None, "yielded_tokens_per_step": None}
        return {"deferred_per_step": (self.counters.deferred - self.counted_from[0]) / steps,
                "yielded_tokens_per_step": (self.counters.tokens_yielded - self.counted_from[1]) / steps}


def measure_cell(args: argparse.Namespace, model: str, waiting: int, running: int,
                 configs: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Step every scheduler in turn (the order rotating), so that the machine's noise falls on all alike."""
    engines = [Engine(model, waiting, running, args.budget, config, args.seed) for config in configs]
    warmup = args.warmup
    for step in range(warmup + args.steps):
        if step == warmup:  # the engines share this process's heap: keep what exists out of GC passes
            gc.collect()
            gc.freeze()
        shift = step % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            engine.step(timed=step >= warmup)
    summaries = [engine.summary() for engine in engines]
    del engines
    gc.unfreeze()
    gc.collect()
    return summaries


def run(args: argparse.Namespace, model: str) -> dict[str, Any]:
    present = [(label, config) for label, config in variants() if config is not None or label == STOCK]
    rows = []
    for waiting in args.waiting:
        for running in args.running:
            cells = measure_cell(args, model, waiting, running, [config for _, config in present])
            measured = dict(zip([label for label, _ in present], cells, strict=True))
            rows.append({"waiting": waiting, "running": running,
                         **{label: measured.get(label) for label, _ in variants()}})
    return {"benchmark": "scheduler_overhead", "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
            "max_num_batched_tokens": args.budget, "variants": [label for label, _ in variants()],
            "configs": {label: config for label, config in variants()}, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """The table: CPU time per schedule() call, its change against vLLM's own, the batches it built."""
    lines = [f"{'waiting':>7}{'running':>8}  {'scheduler':<22}{'cpu mean':>9}{'median':>8}{'vs vllm':>9}"
             f"{'(median)':>9}{'wall median':>12}{'admitted':>9}{'tokens':>7}{'deferred':>9}{'yielded':>8}"]
    for row in result["rows"]:
        stock = row[STOCK]
        for label in result["variants"]:
            cell = row[label]
            lead = f"{row['waiting']:>7}{row['running']:>8}  {label:<22}"
            if cell is None:
                lines.append(lead + "  n/a (option not in this prefillq)")
                continue
            change = median_change = ""
            if label != STOCK:
                change = f"{cell['cpu_mean_us'] / stock['cpu_mean_us'] - 1:+.1%}"
                median_change = f"{cell['cpu_median_us'] / stock['cpu_median_us'] - 1:+.1%}"
            lines.append(lead + f"{cell['cpu_mean_us']:>9.0f}{cell['cpu_median_us']:>8.0f}{change:>9}"
                         f"{median_change:>9}{cell['wall_median_us']:>12.0f}{cell['admitted_per_step']:>9.1f}"
                         f"{cell['tokens_per_step']:>7.0f}{_per_step(cell['deferred_per_step'], 9, 2)}"
                         f"{_per_step(cell['yielded_tokens_per_step'], 8, 0)}")
    lines.append("times in us per schedule() call; per step: requests admitted, tokens scheduled, partial "
                 "prefills deferred and the tokens they yielded (prefillq's counters; - where absent)")
    return "\n".join(lines)


def _per_step(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiting", default="1000,10000", help="waiting-queue depths, comma-separated")
    parser.add_argument("--running", default="64,256", help="running-request targets (max_num_seqs)")
    parser.add_argument("--budget", type=int, default=BUDGET, help="max_num_batched_tokens (tokens per step)")
    parser.add_argument("--steps", type=int, default=300, help="timed schedule() calls per cell")
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps first (fills the running set)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="model folder for vLLM's model config (default: a fresh tiny test model)")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run: 50 waiting, 8 running)")
    args = parser.parse_args(argv)
    if args.quick:
        args.waiting, args.running, args.steps, args.warmup = "50", "8", 10, 5
    try:
        args.waiting = [int(x) for x in str(args.waiting).split(",")]
        args.running = [int(x) for x in str(args.running).split(",")]
    except ValueError:
        parser.error("--waiting and --running take comma-separated integers")
    if min(args.waiting + args.running) < 1 or args.steps < 1 or args.warmup < 0 or args.budget < 1:
        parser.error("sizes, --budget and --steps must be positive, --warmup non-negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from prefillq.integrations.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(make_tiny_model(Path(tmp) / "tiny-llama"))
        result = run(args, model)
    print(render(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
