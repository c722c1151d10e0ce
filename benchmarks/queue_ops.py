"""Cost of one scheduling step (peek + pop + add, counter advancing) at queue depths 128..100K.

Next to each policy's queue, the same step done the way re-ranking engines do it: re-derive the order
of the whole waiting list every step (a float-key sort for HRRN, as LightLLM and SGLang do; a linear
scan for promote_shortest; lane scans for short_request_first; a sort of an already sorted list for
FCFS). Prints a table and writes JSON. Ratios are measured in the same run, so a noisy machine affects
both sides alike.

    python benchmarks/queue_ops.py [--depths 128,1000,10000,100000] [--out benchmarks/out/queue_ops.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

from prefillq import QueuedRequest, make_queue

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first")


def prompt_length(rng: random.Random) -> int:
    return rng.choice([128, 128, 128, rng.randint(64, 512), rng.randint(4096, 16384)])


def fill_queue(policy: str, depth: int, rng: random.Random, clock):
    queue = make_queue({"policy": policy, "threshold": 256, "long_max_wait_ms": 2000, "stats_interval_s": 0},
                       clock=clock)
    for number in range(depth):
        queue.add_request(QueuedRequest(f"w{number}", prompt_length(rng)))
        if number % 64 == 0:
            queue.on_prefill_submitted(rng.randint(0, 4096))
    return queue


def time_queue_steps(policy: str, depth: int, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    now = [0.0]
    queue = fill_queue(policy, depth, rng, lambda: now[0])
    arrivals = [QueuedRequest(f"n{i}", prompt_length(rng)) for i in range(steps)]
    started = time.perf_counter()
    for request in arrivals:
        queue.peek_request()
        popped = queue.pop_request()
        queue.add_request(request)
        queue.on_prefill_submitted(min(popped.prompt_tokens, 4096))
        now[0] += 0.001
    return (time.perf_counter() - started) / steps


class NaiveItem:
    __slots__ = ("arrival", "cost", "enqueued_at", "p_arrival", "prompt")

    def __init__(self, prompt: int, arrival: int, p_arrival: int, enqueued_at: float) -> None:
        self.prompt, self.arrival, self.p_arrival, self.enqueued_at = prompt, arrival, p_arrival, enqueued_at
        self.cost = max(1, prompt)


def naive_pick(policy: str, waiting: list, counter: int, now: float) -> int:
    """Index of the next request, re-deriving the whole order as a per-step re-ranking engine does."""
    if policy == "default":
        waiting.sort(key=lambda item: item.arrival)
        return 0
    if policy == "promote_shortest":
        return min(range(len(waiting)), key=lambda i: (waiting[i].prompt, waiting[i].arrival))
    if policy == "hrrn":
        waiting.sort(key=lambda item: (-(counter - item.p_arrival) / item.cost, item.arrival))
        return 0
    short = [i for i, item in enumerate(waiting) if item.prompt <= 256]
    long = [i for i, item in enumerate(waiting) if item.prompt > 256]
    if long and short and now - waiting[long[0]].enqueued_at >= 2.0:
        return long[0]
    return short[0] if short else long[0]


def time_naive_steps(policy: str, depth: int, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    counter = 0
    waiting = []
    for number in range(depth):
        waiting.append(NaiveItem(prompt_length(rng), number, counter, 0.0))
        if number % 64 == 0:
            counter += rng.randint(0, 4096)
    now = 0.0
    started = time.perf_counter()
    for step in range(steps):
        popped = waiting.pop(naive_pick(policy, waiting, counter, now))
        waiting.append(NaiveItem(prompt_length(rng), depth + step, counter, now))
        counter += min(popped.prompt, 4096)
        now += 0.001
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="128,1000,10000,100000")
    parser.add_argument("--out", default="benchmarks/out/queue_ops.json")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("prefillq").setLevel(logging.ERROR)  # the bench's traffic trips SRF's warning
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    print(f"{'policy':<20} {'depth':>7} {'prefillq us/step':>17} {'per-step re-rank us':>20} {'speed-up':>9}")
    for policy in POLICIES:
        for depth in depths:
            ours = time_queue_steps(policy, depth, steps=3000, seed=args.seed)
            naive_steps = max(5, min(2000, 2_000_000 // depth))
            naive = time_naive_steps(policy, depth, steps=naive_steps, seed=args.seed)
            row = {"policy": policy, "depth": depth, "prefillq_us_per_step": ours * 1e6,
                   "rerank_us_per_step": naive * 1e6, "speedup": naive / ours}
            rows.append(row)
            print(f"{policy:<20} {depth:>7} {row['prefillq_us_per_step']:>17.2f} "
                  f"{row['rerank_us_per_step']:>20.1f} {row['speedup']:>8.1f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    hrrn = {r["depth"]: r for r in rows if r["policy"] == "hrrn"}
    targets = {
        "hrrn_10k_speedup_at_least_100x": hrrn.get(10000, {}).get("speedup"),
        "hrrn_100k_us_per_step_under_20": hrrn.get(100000, {}).get("prefillq_us_per_step"),
    }
    out.write_text(json.dumps({"rows": rows, "targets": targets}, indent=2))
    print(f"targets: HRRN 10K speed-up {targets['hrrn_10k_speedup_at_least_100x']}, "
          f"HRRN 100K {targets['hrrn_100k_us_per_step_under_20']} us/step; wrote {out}")


if __name__ == "__main__":
    main()
