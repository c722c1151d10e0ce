"""Real vLLM on CPU: short and long TTFT with ``partial_prefills`` "first" vs "ordered" (SPEC §3.6).

    PYTHONPATH=src python benchmarks/partial_prefills_cpu.py [--policies short_request_first,hrrn]

The tiny random-weight Llama (``prefillq.integrations.tiny_model``), one in-process engine at a time,
float32 (greedy outputs are compared across runs), budget 512 tokens per step. The burst: LONGS long
prompts arrive together; after their first step, one short prompt arrives per step (SHORTS of them),
so every short one arrives while long prompts are mid-prefill. Arrivals are tied to step numbers, so
every run sees the same arrival pattern; TTFT is wall time from ``add_request`` to the step that
returned the first token, and also counted in engine steps (deterministic: the same for every run of
the same code, whatever else loads the machine). Prints one line per run and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

BUDGET = 512
LONGS, LONG_TOKENS = 4, 2000
SHORTS, SHORT_TOKENS = 16, 60
OUTPUT_TOKENS = 8


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2048) for _ in range(length)]


def burst(engine: Any, params: Any, seed: int) -> dict[str, Any]:
    """One burst on a running engine; TTFT per request in seconds and in steps, and the outputs."""
    added: dict[str, tuple[float, int]] = {}
    first_token: dict[str, tuple[float, int]] = {}
    outputs: dict[str, list[int]] = {}
    step = 0

    def add(request_id: str, ids: list[int]) -> None:
        added[request_id] = (time.monotonic(), step)
        engine.add_request(request_id, {"prompt_token_ids": ids}, params)

    for i in range(LONGS):
        add(f"long-{i}", prompt(LONG_TOKENS, 1000 * seed + 10 + i))
    while engine.has_unfinished_requests() or step <= SHORTS:
        if 1 <= step <= SHORTS:
            add(f"short-{step - 1}", prompt(SHORT_TOKENS, 1000 * seed + 100 + step))
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids and out.request_id not in first_token:
                first_token[out.request_id] = (time.monotonic(), step + 1)
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        step += 1

    def mean(klass: str, part: int) -> float:
        return statistics.mean(first_token[rid][part] - at[part] for rid, at in added.items() if rid.startswith(klass))

    return {"short_s": mean("short", 0), "long_s": mean("long", 0), "short_steps": mean("short", 1),
            "long_steps": mean("long", 1), "outputs": outputs}


def run(model: str, policy: str, partial_prefills: str, repeats: int) -> dict[str, Any]:
    """One engine; a warm-up burst, then ``repeats`` bursts of new prompts; medians of their means."""
    from vllm import LLM, SamplingParams

    config = {"prefillq": {"policy": policy, "partial_prefills": partial_prefills, "stats_interval_s": 0}}
    llm = LLM(model=model, scheduler_cls="prefillq.integrations.vllm.Scheduler", enforce_eager=True,
              max_num_batched_tokens=BUDGET, max_model_len=4096, max_num_seqs=64, dtype="float32", seed=0,
              additional_config=config)
    try:
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
        runs = [burst(llm.llm_engine, params, seed) for seed in range(repeats + 1)][1:]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return {"policy": policy, "partial_prefills": partial_prefills, "repeats": repeats,
            "short_ttft_mean_ms": 1000 * statistics.median(r["short_s"] for r in runs),
            "long_ttft_mean_ms": 1000 * statistics.median(r["long_s"] for r in runs),
            "short_ttft_mean_steps": statistics.median(r["short_steps"] for r in runs),
            "long_ttft_mean_steps": statistics.median(r["long_steps"] for r in runs),
            "outputs": [r["outputs"] for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="short_request_first,hrrn")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for key, value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": "127.0.0.1",
                       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                       "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(key, value)
    from prefillq.integrations.tiny_model import make_tiny_model

    model = str(make_tiny_model(Path(tempfile.mkdtemp(prefix="prefillq-pp-")) / "tiny-llama"))
    for policy in args.policies.split(","):
        first = run(model, policy, "first", args.repeats)
        ordered = run(model, policy, "ordered", args.repeats)
        for result in (first, ordered):
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()
                              if k != "outputs"}))
        print(json.dumps({
            "policy": policy,
            "short_ttft_ratio": round(ordered["short_ttft_mean_ms"] / first["short_ttft_mean_ms"], 3),
            "long_ttft_change": round(ordered["long_ttft_mean_ms"] / first["long_ttft_mean_ms"] - 1, 3),
            "short_ttft_ratio_steps": round(ordered["short_ttft_mean_steps"] / first["short_ttft_mean_steps"], 3),
            "long_ttft_change_steps": round(ordered["long_ttft_mean_steps"] / first["long_ttft_mean_steps"] - 1, 3),
            "identical_outputs": ordered["outputs"] == first["outputs"]
            and all(len(o) == LONGS + SHORTS for o in first["outputs"]),
        }), flush=True)


if __name__ == "__main__":
    main()
