"""`prefillq serve` end to end: vLLM's OpenAI server (multiprocess engine) with our scheduler class
loaded inside its EngineCore process, driven by a streaming client over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_helpers import ServerProcess, free_port, prompt_ids

pytestmark = pytest.mark.vllm

SERVER_ARGS = ["--max-num-batched-tokens", "512", "--max-model-len", "4096", "--enforce-eager",
               "--disable-log-stats"]
LONG_TOKENS, SHORT_TOKENS, OUTPUT_TOKENS = 3000, 64, 8
# (send offset s, prompt tokens): four long prompts first, then eight short ones while they prefill
BURST = [(0.005 * i, LONG_TOKENS) for i in range(4)] + [(0.05 + 0.01 * i, SHORT_TOKENS) for i in range(8)]


def server_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the real deployment path: engine in its own process
    env["TMPDIR"] = str(root / "tmp")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def serve_argv(model: str, port: int, *policy_args: str) -> list[str]:
    return [sys.executable, "-m", "prefillq.cli", "serve", model, *policy_args, "--port", str(port),
            "--", *SERVER_ARGS]


async def stream_one(client: Any, url: str, model: str, prompt: list[int], delay_s: float,
                     start: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, start + delay_s - time.perf_counter()))
    sent = time.perf_counter()
    first = None
    output_tokens = 0
    body = {"model": model, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("usage"):
                # tokens, not chunks: a server that falls behind its client sends several tokens in a chunk
                output_tokens = event["usage"]["completion_tokens"]
            if event.get("choices") and first is None:
                first = time.perf_counter()
    assert first is not None
    return {"prompt_tokens": len(prompt), "ttft_s": first - sent, "output_tokens": output_tokens}


async def run_burst(url: str, model: str) -> list[dict[str, Any]]:
    import httpx

    async with httpx.AsyncClient(timeout=120.0) as client:
        # warm-up: the first request of a fresh server pays one-off costs
        await stream_one(client, url, model, prompt_ids(32, seed=90_000), 0.0, time.perf_counter())
        start = time.perf_counter()
        tasks = [stream_one(client, url, model, prompt_ids(n, seed=91_000 + i), delay, start)
                 for i, (delay, n) in enumerate(BURST)]
        return await asyncio.gather(*tasks)


def measure_policy(model: str, root: Path, label: str, *policy_args: str) -> tuple[list[dict[str, Any]], str]:
    port = free_port()
    server = ServerProcess(serve_argv(model, port, *policy_args), server_env(root), root / f"server-{label}.log")
    try:
        server.wait_ready(f"http://127.0.0.1:{port}")
        results = asyncio.run(run_burst(f"http://127.0.0.1:{port}", model))
    finally:
        server.stop()
    return results, server.output()


def test_short_request_first_cuts_short_ttft_in_a_real_server(tiny_model: str, vllm_env_root: Path) -> None:
    # Statistics every 50 ms: a quiet machine runs the whole burst in about a second, so a 1 s interval
    # could pass without a single queue operation after it (the line is written lazily, SPEC §3.4).
    srf_config = json.dumps({"policy": "short_request_first", "threshold": 256, "stats_interval_s": 0.05})
    default, _ = measure_policy(tiny_model, vllm_env_root, "default", "--policy", "default")
    srf, srf_log = measure_policy(tiny_model, vllm_env_root, "srf", "--config", srf_config)

    def short_ttfts(results: list[dict[str, Any]]) -> list[float]:
        return [r["ttft_s"] for r in results if r["prompt_tokens"] == SHORT_TOKENS]

    rows = []
    for label, results in (("default", default), ("short_request_first", srf)):
        shorts = short_ttfts(results)
        longs = [r["ttft_s"] for r in results if r["prompt_tokens"] == LONG_TOKENS]
        assert all(r["output_tokens"] == OUTPUT_TOKENS for r in results)  # every request streamed all its tokens
        rows.append((label, statistics.mean(shorts), statistics.median(shorts), max(shorts), statistics.mean(longs)))
    print("\nvLLM server, tiny model on CPU: 4 x 3000-token then 8 x 64-token streaming requests")
    print(f"{'policy':<22}{'short TTFT mean':>17}{'median':>9}{'max':>9}{'long TTFT mean':>17}")
    for label, mean, median, worst, long_mean in rows:
        print(f"{label:<22}{mean * 1000:>14.0f} ms{median * 1000:>6.0f} ms{worst * 1000:>6.0f} ms"
              f"{long_mean * 1000:>14.0f} ms")
    change = rows[1][1] / rows[0][1] - 1.0
    print(f"short-request mean TTFT change with short_request_first: {change:+.1%}")

    # Under FCFS the short prompts wait behind all four long prefills; with the policy they go next.
    assert statistics.mean(short_ttfts(srf)) < 0.6 * statistics.mean(short_ttfts(default))
    assert statistics.median(short_ttfts(srf)) < 0.6 * statistics.median(short_ttfts(default))
    # The policy ran inside the engine process and its log lines reached vLLM's log.
    assert "prefillq: waiting queue policy short_request_first" in srf_log
    assert "prefillq stats policy=short_request_first" in srf_log


def test_prefillq_serve_refuses_a_bad_deployment_in_one_line(tiny_model: str, vllm_env_root: Path) -> None:
    kv_consumer = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"})
    argv = [*serve_argv(tiny_model, free_port(), "--policy", "srf"), "--kv-transfer-config", kv_consumer]
    done = subprocess.run(argv, env=server_env(vllm_env_root), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "error: short_request_first cannot run on a decode-only node" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_engine_refusal_is_clear_in_the_vllm_server_output(tiny_model: str, vllm_env_root: Path) -> None:
    """Someone launching vLLM directly with our scheduler and a configuration the plug-in refuses (a peer
    emulation, which only the simulator runs): the server exits and its output carries our reason (as an
    ERROR line and as the final exception)."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model,
            "--scheduler-cls", "prefillq.integrations.vllm.Scheduler",
            "--additional-config", json.dumps({"prefillq": {"policy": "sglang_hrrn"}}),
            "--port", str(port), "--host", "127.0.0.1", *SERVER_ARGS]
    server = ServerProcess(argv, server_env(vllm_env_root), vllm_env_root / "server-refused.log")
    try:
        code = server.process.wait(240)
    finally:
        server.stop()
    output = server.output()
    assert code != 0
    reason = "'sglang_hrrn' is prefillq's emulation of another engine's queue option"
    error_lines = [line for line in output.splitlines() if "prefillq refuses to start the engine" in line]
    assert any("ERROR" in line and reason in line for line in error_lines), output[-3000:]
    assert any(line.startswith("prefillq.config.ConfigError: prefillq refuses") for line in output.splitlines())
