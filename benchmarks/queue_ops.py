"""Cost of one scheduling step (peek + pop + add, counter advancing) at queue depths 128..100K, every policy.

Next to each policy's queue, the same step done the way re-ranking engines do it: re-derive the order
of the whole waiting list every step (a float-key sort for HRRN, as LightLLM and SGLang do; a sort on
(due, deadline or remaining prefill) for ``auto``; a linear scan for promote_shortest; lane scans for
short_request_first; a sort of an already sorted list for FCFS). Each figure is the median of
``--repeats`` timings, the queue and the re-ranking timed in alternation, so a noisy machine affects both
sides alike; the load average before and after is recorded.

Targets (issue "Speed"): for ``hrrn`` and ``auto``, >= 100x the per-step re-ranking at 10K waiting and
<= 20 us a step at 100K. Memory: what the queue holds per queued request beyond the request view itself
(tracemalloc, the queue filled to the largest depth), and the view's own size, stated for every policy.

    python benchmarks/queue_ops.py [--depths 128,1000,10000,100000] [--repeats 5] [--out benchmarks/out/queue_ops.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import time
import tracemalloc
from pathlib import Path

from prefillq import QueuedRequest, make_queue

POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
TARGETED = ("hrrn", "auto")
TARGET_SPEEDUP_AT_10K = 100.0
TARGET_US_AT_100K = 20.0
# auto's constants (policies/auto.py), for the re-ranking reference
AUTO_SLOWDOWN = 64
AUTO_GRACE_TOKENS = 8192


def prompt_length(rng: random.Random) -> int:
    return rng.choice([128, 128, 128, rng.randint(64, 512), rng.randint(4096, 16384)])


def new_queue(policy: str, clock):
    return make_queue({"policy": policy, "threshold": 256, "long_max_wait_ms": 2000, "stats_interval_s": 0},
                      clock=clock)


def fill_queue(queue, views: list[QueuedRequest], rng: random.Random) -> None:
    for number, view in enumerate(views):
        queue.add_request(view)
        if number % 64 == 0:
            queue.on_prefill_submitted(rng.randint(0, 4096))


def time_queue_steps(policy: str, depth: int, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    now = [0.0]
    queue = new_queue(policy, lambda: now[0])
    fill_queue(queue, [QueuedRequest(f"w{n}", prompt_length(rng)) for n in range(depth)], rng)
    arrivals = [QueuedRequest(f"n{i}", prompt_length(rng)) for i in range(steps)]
    started = time.perf_counter()
    for request in arrivals:
        queue.peek_request()
        popped = queue.pop_request()
        queue.add_request(request)
        queue.on_prefill_submitted(min(popped.prompt_tokens, 4096))
        now[0] += 0.001
    return (time.perf_counter() - started) / steps


def queue_bytes_per_request(policy: str, depth: int, seed: int) -> tuple[float, float]:
    """(bytes the queue allocates per queued request, bytes of one request view), by tracemalloc."""
    rng = random.Random(seed)
    queue = new_queue(policy, lambda: 0.0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    views = [QueuedRequest(f"w{n}", prompt_length(rng)) for n in range(depth)]
    made = tracemalloc.get_traced_memory()[0]
    fill_queue(queue, views, rng)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - made) / depth, (made - before) / depth


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
    if policy == "auto":
        def key(item: NaiveItem) -> tuple[bool, int, int]:
            deadline = item.p_arrival + AUTO_SLOWDOWN * item.cost + AUTO_GRACE_TOKENS
            due = deadline <= counter
            return (not due, deadline if due else item.prompt, item.arrival)

        waiting.sort(key=key)
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


def measure(policy: str, depth: int, repeats: int, seed: int) -> dict:
    ours, naive = [], []
    naive_steps = max(5, min(2000, 2_000_000 // depth))
    for _ in range(repeats):  # alternate, so drifting load falls on both
        ours.append(time_queue_steps(policy, depth, steps=3000, seed=seed))
        naive.append(time_naive_steps(policy, depth, steps=naive_steps, seed=seed))
    ours_us, naive_us = statistics.median(ours) * 1e6, statistics.median(naive) * 1e6
    ratios = sorted(b / a for a, b in zip(ours, naive, strict=True))
    return {"policy": policy, "depth": depth, "prefillq_us_per_step": ours_us, "rerank_us_per_step": naive_us,
            "speedup": naive_us / ours_us, "speedup_min": ratios[0], "speedup_max": ratios[-1],
            "prefillq_us_min": min(ours) * 1e6, "prefillq_us_max": max(ours) * 1e6,
            "repeats": repeats, "rerank_steps": naive_steps}


def targets(rows: list[dict]) -> list[dict]:
    out = []
    for policy in TARGETED:
        by_depth = {r["depth"]: r for r in rows if r["policy"] == policy}
        if 10000 in by_depth:
            value = by_depth[10000]["speedup"]
            out.append({"policy": policy, "what": "speed-up over per-step re-ranking at 10K", "target": ">= 100x",
                        "figure": value, "met": value >= TARGET_SPEEDUP_AT_10K})
        if 100000 in by_depth:
            value = by_depth[100000]["prefillq_us_per_step"]
            out.append({"policy": policy, "what": "us per step at 100K", "target": "<= 20 us",
                        "figure": value, "met": value <= TARGET_US_AT_100K})
    return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="128,1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-depth", type=int, default=100_000)
    parser.add_argument("--out", default="benchmarks/out/queue_ops.json")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("prefillq").setLevel(logging.ERROR)  # the bench's traffic trips SRF's warning
    depths = [int(d) for d in args.depths.split(",")]
    load_before = load_average()
    print(f"load average before: {load_before}")
    rows = []
    print(f"{'policy':<20} {'depth':>7} {'prefillq us/step':>17} {'per-step re-rank us':>20} {'speed-up':>9}"
          f" {'(min-max)':>15} {'target':>22}")
    for policy in POLICIES:
        for depth in depths:
            row = measure(policy, depth, args.repeats, args.seed)
            rows.append(row)
            target = ""
            if policy in TARGETED and depth == 10000:
                target = f">=100x: {'met' if row['speedup'] >= TARGET_SPEEDUP_AT_10K else 'MISSED'}"
            elif policy in TARGETED and depth == 100000:
                target = f"<=20 us: {'met' if row['prefillq_us_per_step'] <= TARGET_US_AT_100K else 'MISSED'}"
            spread = f"({row['speedup_min']:.0f}-{row['speedup_max']:.0f}x)"
            print(f"{policy:<20} {depth:>7} {row['prefillq_us_per_step']:>17.2f} {row['rerank_us_per_step']:>20.1f}"
                  f" {row['speedup']:>8.1f}x {spread:>15} {target:>22}", flush=True)
    memory = []
    print(f"\nmemory per queued request ({args.memory_depth} queued, tracemalloc)")
    for policy in POLICIES:
        queue_bytes, view_bytes = queue_bytes_per_request(policy, args.memory_depth, args.seed)
        memory.append({"policy": policy, "depth": args.memory_depth, "queue_bytes_per_request": queue_bytes,
                       "view_bytes_per_request": view_bytes})
        print(f"{policy:<20} queue {queue_bytes:>6.0f} B/request (+ the request view itself, {view_bytes:.0f} B)")
    load_after = load_average()
    checks = targets(rows)
    print(f"\nload average after: {load_after}")
    for check in checks:
        print(f"target {check['policy']}: {check['what']} {check['target']}: {check['figure']:.1f} "
              f"{'met' if check['met'] else 'MISSED'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "queue_ops", "python": platform.python_version(),
                               "load_before": load_before, "load_after": load_after, "rows": rows,
                               "memory": memory, "targets": checks}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
