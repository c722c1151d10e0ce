"""The ``metrics_port`` endpoint of a real vLLM server: the EngineCore process running prefillq's scheduler
serves Prometheus metrics, and its dispatch counters match the requests the server was sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.integration.engine_helpers import ServerProcess, free_port, prompt_ids
from tests.integration.test_vllm_server import serve_argv, server_env

pytestmark = pytest.mark.vllm

SHORT, LONG = 48, 700  # prompt tokens; threshold 256 puts them in the short and long lanes
PROMPTS = [SHORT, LONG, SHORT, LONG, SHORT]


def scrape(url: str) -> tuple[str, dict[str, dict[str, float]]]:
    """The endpoint's text and, per metric family, its samples keyed by their lane label ('' if none)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{url}/metrics", timeout=10.0)
    assert response.status_code == 200
    found = {family.name: {sample.labels.get("lane", sample.labels.get("policy", "")): sample.value
                           for sample in family.samples}
             for family in text_string_to_metric_families(response.text)}
    return response.text, found


async def send_all(url: str, model: str) -> None:
    import httpx

    async def one(client: httpx.AsyncClient, i: int, tokens: int) -> None:
        body = {"model": model, "prompt": prompt_ids(tokens, seed=70_000 + i), "max_tokens": 4,
                "ignore_eos": True, "temperature": 0.0}
        response = await client.post(f"{url}/v1/completions", json=body)
        assert response.status_code == 200, response.text

    async with httpx.AsyncClient(timeout=120.0) as client:
        await asyncio.gather(*(one(client, i, tokens) for i, tokens in enumerate(PROMPTS)))


def test_metrics_endpoint_counts_what_the_engine_dispatched(tiny_model: str, vllm_env_root: Path) -> None:
    port, metrics_port = free_port(), free_port()
    config = json.dumps({"policy": "short_request_first", "threshold": 256, "metrics_port": metrics_port})
    server = ServerProcess(serve_argv(tiny_model, port, "--config", config), server_env(vllm_env_root),
                           vllm_env_root / "server-metrics.log")
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    try:
        server.wait_ready(f"http://127.0.0.1:{port}")
        _, before = scrape(metrics_url)
        asyncio.run(send_all(f"http://127.0.0.1:{port}", tiny_model))
        text, after = scrape(metrics_url)
    finally:
        server.stop()
    print(f"\n{text}")

    assert before["prefillq_policy_info"] == {"short_request_first": 1.0}
    assert before["prefillq_dispatched_requests"] == {}
    assert after["prefillq_dispatched_requests"] == {"short": PROMPTS.count(SHORT), "long": PROMPTS.count(LONG)}
    assert after["prefillq_waiting_requests"] == {"immediate": 0, "short": 0, "long": 0}
    assert after["prefillq_prefill_tokens"][""] == sum(PROMPTS)  # no prefix shared, nothing preempted
    assert after["prefillq_scheduler_steps"][""] >= 2
    for name in ("prefillq_aged_long_promotions", "prefillq_degradation_warnings",
                 "prefillq_partial_prefills_deferred", "prefillq_partial_prefill_tokens_yielded"):
        assert after[name] == {"": 0.0}, name
    assert f"Prometheus metrics on http://0.0.0.0:{metrics_port}/metrics" in server.output()


def test_engine_hook_offsets_the_port_by_data_parallel_rank_and_refuses_a_taken_one() -> None:
    """No engine needed: the hook the scheduler's __init__ calls, with a stand-in vLLM config."""
    import socket
    from types import SimpleNamespace

    from prefillq import make_queue
    from prefillq.config import ConfigError, PolicyConfig
    from prefillq.integrations.metrics import PartialPrefillCounters
    from prefillq.integrations.vllm import _start_metrics

    base = free_port()
    config = PolicyConfig(policy="hrrn", metrics_port=base, stats_interval_s=0)
    queue, counters = make_queue(config), PartialPrefillCounters()
    rank_one = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_rank_local=1))
    assert _start_metrics(SimpleNamespace(parallel_config=SimpleNamespace()), config.with_(metrics_port=0),
                          queue, counters) is None
    exporter = _start_metrics(rank_one, config, queue, counters)
    try:
        assert exporter is not None and exporter.port == base + 1
        counters.record(1, 64)
        _, found = scrape(f"http://127.0.0.1:{base + 1}")
        assert found["prefillq_partial_prefill_tokens_yielded"] == {"": 64.0}
    finally:
        exporter.close()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", base))
        taken.listen()
        with pytest.raises(ConfigError, match=rf"^prefillq refuses to start the engine: metrics_port {base} cannot "
                                              r"be used \(Address already in use\).*each engine needs its own port"):
            _start_metrics(SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_rank_local=0)), config,
                           queue, counters)
