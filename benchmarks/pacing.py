"""How precisely does ``prefillq bench`` send on schedule? Send-time lateness at 60, 500 and 5,000 req/s.

Lateness = actual send time - scheduled send time, per request, measured by the load generator
itself (the same numbers ``prefillq bench`` writes as ``sent_at - scheduled_at``). Each rate sends a
constant-spaced stream of small streaming requests (16 prompt tokens; 8 output tokens one every 2 ms,
and again with 1 output token) to the mock OpenAI server, while the client also parses every streamed
token and writes the per-request JSONL, as in a real benchmark. With 8 tokens the client handles nine
events per request, so at high rates it measures how much streaming work the client can absorb while
keeping time; with 1 token it is closer to pure pacing.

The mock server runs in its own process by default. That is the fair set-up: a real engine is a
separate process, and its work should not be charged to the client. Running the mock in a thread of
the client's process (``--in-process``) makes the two share one interpreter lock, so every request
the mock serves delays the client's sends; it shows how much headroom the client has, not how it
behaves against a real server. On this 2-core machine the subprocess gets the other core.

Usage: ``python benchmarks/pacing.py [--rates 60,500,5000] [--seconds S] [--json PATH] [--in-process]``
Target (issue 5): P99 lateness <= 2 ms at 500 req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefillq.bench.client import JsonlWriter, run_load
from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.payload import PayloadOptions, build_payload
from prefillq.metrics import percentile
from prefillq.workload import RequestSpec

TOKEN_INTERVAL_S = 0.002


def start_subprocess_server() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "prefillq.cli.mockserver", "--port", "0",
         "--token-interval-s", str(TOKEN_INTERVAL_S)],
        stdout=subprocess.PIPE, text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if "listening on" not in line:
        process.kill()
        raise SystemExit(f"mock server did not start: {line!r}")
    return process, line.strip().rsplit(" ", 1)[-1]


def measure(url: str, rate: float, seconds: float, output_tokens: int) -> dict[str, float | int]:
    count = max(1, int(rate * seconds))
    specs = [RequestSpec(f"pace-{i:06d}", i / rate, 16, output_tokens, "short") for i in range(count)]
    options = PayloadOptions(model="mock-model")
    payloads = [build_payload(spec, options, 0) for spec in specs]
    with tempfile.TemporaryDirectory() as folder, (Path(folder) / "requests.jsonl").open("w") as stream:
        writer = JsonlWriter(stream)
        started = time.perf_counter()
        result = asyncio.run(run_load(payloads, url, timeout_s=60, on_record=writer))
        wall = time.perf_counter() - started
    lateness = result.lateness_ms
    sends = sorted(r.sent_at for r in result.records)
    achieved = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 and sends[-1] > sends[0] else 0.0
    return {
        "rate_per_s": rate,
        "output_tokens": output_tokens,
        "requests": count,
        "failed": result.errors,
        "lateness_p50_ms": percentile(lateness, 50),
        "lateness_p99_ms": percentile(lateness, 99),
        "lateness_max_ms": max(lateness),
        "achieved_send_rate_per_s": achieved,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="60,500,5000")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each stream")
    parser.add_argument("--output-tokens", default="8,1", help="request shapes: output tokens per request")
    parser.add_argument("--json", type=Path, default=Path("results/benchmarks/pacing.json"))
    parser.add_argument("--in-process", action="store_true", help="run the mock in a thread of this process")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    shapes = [int(t) for t in args.output_tokens.split(",")]

    if args.in_process:
        server = MockServer(MockBehaviour(token_interval_s=TOKEN_INTERVAL_S)).start()
        url, stop = server.url, server.stop
    else:
        process, url = start_subprocess_server()

        def stop() -> None:
            process.terminate()
            process.wait(10)

    rows = []
    try:
        measure(url, 200, 0.5, 8)  # warm the interpreter and the server
        load_before = os.getloadavg()[0]
        for output_tokens in shapes:
            for rate in rates:
                rows.append(measure(url, rate, args.seconds, output_tokens))
        load_after = os.getloadavg()[0]
    finally:
        stop()

    print(f"send lateness, mock server {'in-process' if args.in_process else 'in a subprocess'}, "
          f"{args.seconds:g} s per rate ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    print(f"load average {load_before:.2f} before, {load_after:.2f} after")
    print(f"{'req/s':>7} {'tokens':>6} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'sent/s':>8}")
    for row in rows:
        print(f"{row['rate_per_s']:>7.0f} {row['output_tokens']:>6} {row['requests']:>9} {row['failed']:>7} "
              f"{row['lateness_p50_ms']:>8.3f} {row['lateness_p99_ms']:>8.3f} {row['lateness_max_ms']:>8.3f} "
              f"{row['achieved_send_rate_per_s']:>8.0f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "benchmark": "pacing", "server": "in-process" if args.in_process else "subprocess",
        "seconds_per_rate": args.seconds, "python": platform.python_version(), "cpus": os.cpu_count(),
        "load_average": [load_before, load_after],
        "rows": rows,
    }, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
