"""Real vLLM on CPU: short and long TTFT with ``partial_prefills`` "first" vs "ordered" (SPEC §3.6).

    PYTHONPATH=src python benchmarks/partial_prefills_cpu.py [--policies short_request_first,hrrn]

The tiny random-weight Llama (``prefillq.integrations.tiny_model``), one in-process engine at a time,
float32 (greedy outputs are compared across runs), budget 512 tokens per step. The burst: LONGS long
prompts arrive together; after their first step, one short prompt arrives per step (SHORTS of them),
so every short one arrives while long prompts are mid-prefill. Arrivals are tied to step numbers, so
every run sees the same arrival pattern; TTFT is wall time from ``add_request`` to the step that
returned the first token. Prints one line per run and the ratios. Timing is noisy on a shared machine.
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


def run(model: str, policy: str, partial_prefills: str) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    config = {"prefillq": {"policy": policy, "partial_prefills": partial_prefills, "stats_interval_s": 0}}
    llm = LLM(model=model, scheduler_cls="prefillq.integrations.vllm.Scheduler", enforce_eager=True,
              max_num_batched_tokens=BUDGET, max_model_len=4096, max_num_seqs=64, dtype="float32", seed=0,
              additional_config=config)
    try:
        engine = llm.llm_engine
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, temperature=0.0)
        added: dict[str, float] = {}
        first_token: dict[str, float] = {}
        outputs: dict[str, list[int]] = {}

        def add(request_id: str, ids: list[int]) -> None:
            added[request_id] = time.monotonic()
            engine.add_request(request_id, {"prompt_token_ids": ids}, params)

        for i in range(LONGS):
            add(f"long-{i}", prompt(LONG_TOKENS, 10 + i))
        step = 0
        while engine.has_unfinished_requests() or step <= SHORTS:
            if 1 <= step <= SHORTS:
                add(f"short-{step - 1}", prompt(SHORT_TOKENS, 100 + step))
            for out in engine.step():
                now = time.monotonic()
                if out.outputs and out.outputs[0].token_ids and out.request_id not in first_token:
                    first_token[out.request_id] = now
                if out.finished:
                    outputs[out.request_id] = list(out.outputs[0].token_ids)
            step += 1
    finally:
        engine.engine_core.shutdown()
        del llm
        gc.collect()
    ttft = {rid: first_token[rid] - added[rid] for rid in added}
    short = [v for k, v in ttft.items() if k.startswith("short")]
    long = [v for k, v in ttft.items() if k.startswith("long")]
    return {"policy": policy, "partial_prefills": partial_prefills, "steps": step,
            "short_ttft_mean_ms": 1000 * statistics.mean(short), "long_ttft_mean_ms": 1000 * statistics.mean(long),
            "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="short_request_first,hrrn")
    args = parser.parse_args()
    for key, value in {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": "127.0.0.1",
                       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                       "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(key, value)
    from prefillq.integrations.tiny_model import make_tiny_model

    model = str(make_tiny_model(Path(tempfile.mkdtemp(prefix="prefillq-pp-")) / "tiny-llama"))
    for policy in args.policies.split(","):
        first = run(model, policy, "first")
        ordered = run(model, policy, "ordered")
        for result in (first, ordered):
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()
                              if k != "outputs"}))
        print(json.dumps({
            "policy": policy,
            "short_ttft_ratio": round(ordered["short_ttft_mean_ms"] / first["short_ttft_mean_ms"], 3),
            "long_ttft_change": round(ordered["long_ttft_mean_ms"] / first["long_ttft_mean_ms"] - 1, 3),
            "identical_outputs": ordered["outputs"] == first["outputs"] and len(first["outputs"]) == LONGS + SHORTS,
        }), flush=True)


if __name__ == "__main__":
    main()
