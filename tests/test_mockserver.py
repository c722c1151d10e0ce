"""The mock OpenAI-compatible server, checked with an independent HTTP client (httpx): the stream
format vLLM uses (one or several tokens per event), validation, the injected faults, and the simulated
engine that serves a policy."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from prefillq.bench.mockserver import MockBehaviour, MockServer
from prefillq.bench.simengine import EngineDriver
from prefillq.config import parse_policy_spec
from prefillq.sim.node import SimulationError
from prefillq.sim.simulator import simulate
from prefillq.workload import RequestSpec, Workload


def _events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_models_and_health():
    with MockServer(MockBehaviour(model="m1")) as server:
        assert httpx.get(f"{server.url}/health").status_code == 200
        listing = httpx.get(f"{server.url}/v1/models").json()
        assert [item["id"] for item in listing["data"]] == ["m1"]
        assert httpx.get(f"{server.url}/nothing").status_code == 404


def test_streams_one_event_per_token_then_usage_then_done():
    with MockServer() as server, httpx.stream(
        "POST", f"{server.url}/v1/completions",
        json={"model": "mock-model", "prompt": [1, 2, 3], "max_tokens": 4, "stream": True,
              "stream_options": {"include_usage": True}},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        events = _events(response)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    tokens = [p for p in parsed if p["choices"]]
    assert len(tokens) == 4
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert parsed[-1]["choices"] == []
    assert parsed[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_non_streaming_answer_and_keep_alive():
    with MockServer() as server, httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            body = client.post("/v1/completions", json={"model": "mock-model", "prompt": "a b c", "max_tokens": 2})
            assert body.json()["usage"]["prompt_tokens"] == 3  # one token per word
        assert server.app.connections == 1  # the three requests shared one keep-alive connection


@pytest.mark.parametrize("body, status", [
    ({"model": "other", "prompt": [1], "max_tokens": 1}, 404),
    ({"model": "mock-model", "prompt": [1, 10**6], "max_tokens": 1}, 400),  # id beyond the vocabulary
    ({"model": "mock-model", "prompt": [], "max_tokens": 1}, 400),
    ({"model": "mock-model", "prompt": [1], "max_tokens": 0}, 400),
])
def test_rejects_bad_requests(body, status):
    with MockServer(MockBehaviour(vocab_size=1000)) as server:
        assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == status


def test_injected_faults():
    faults = {"e500": "http500", "brk": "break:2", "cls": "close"}
    body = {"model": "mock-model", "prompt": [1, 2], "max_tokens": 5, "stream": True}
    with MockServer(MockBehaviour(faults=faults)) as server:
        response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"x-request-id": "e500"})
        assert response.status_code == 500
        with pytest.raises(httpx.HTTPError), httpx.stream(
            "POST", f"{server.url}/v1/completions", json=body, headers={"x-request-id": "brk"}
        ) as streamed:
            received = []
            for line in streamed.iter_lines():
                if line.startswith("data: "):
                    received.append(line)
        assert len(received) == 2  # two tokens, then the connection was dropped
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"{server.url}/v1/completions", json=body, headers={"x-request-id": "cls"})


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        MockBehaviour(faults={"x": "explode"})


def test_records_what_it_received():
    with MockServer() as server:
        httpx.post(f"{server.url}/v1/completions", json={"model": "mock-model", "prompt": [5], "max_tokens": 1},
                   headers={"x-request-id": "abc"})
        assert server.received[0].body["prompt"] == [5]
        assert server.received[0].headers["x-request-id"] == "abc"


def test_tokenize_counts_words():
    with MockServer() as server:
        answer = httpx.post(f"{server.url}/tokenize", json={"model": "mock-model", "prompt": "one two three"})
        assert answer.json()["count"] == 3


# --- multi-token chunks ------------------------------------------------------------------------------

def test_several_tokens_per_chunk_with_running_usage():
    """tokens_per_chunk=3: 7 tokens go out as 3+3+1; with continuous_usage_stats each event carries the
    running totals (as vLLM does), and the last usage event the whole count."""
    body = {"model": "mock-model", "prompt": [1, 2], "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with MockServer(MockBehaviour(tokens_per_chunk=3)) as server, \
            httpx.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        parsed = [json.loads(e) for e in _events(response)[:-1]]
    chunks = [p for p in parsed if p["choices"]]
    assert [c["choices"][0]["text"].count("tok") for c in chunks] == [3, 3, 1]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [3, 6, 7]
    assert parsed[-1]["usage"]["completion_tokens"] == 7


def test_tokens_per_chunk_must_be_positive():
    with pytest.raises(ValueError, match="tokens_per_chunk"):
        MockBehaviour(tokens_per_chunk=0)


# --- the simulated engine behind the mock ---------------------------------------------------------------

def _drive(driver: EngineDriver, specs: list[RequestSpec]) -> dict[str, tuple[float, float]]:
    """The simulator's event loop on a virtual clock: (first token, finish) time of every request."""
    progress, first, done = {}, {}, {}
    now, index = 0.0, 0
    while True:
        while index < len(specs) and specs[index].arrival_s <= now:
            spec = specs[index]
            progress[spec.request_id] = driver.submit(spec.prompt_tokens, spec.output_tokens, spec.arrival_s)[1]
            index += 1
        end = driver.step(now) if driver.busy() else None
        if end is not None:
            now = end
            driver.collect()
            for request_id, state in progress.items():
                if state.tokens and request_id not in first:
                    first[request_id] = now
                if state.finished and request_id not in done:
                    done[request_id] = now
        elif index < len(specs):
            now = specs[index].arrival_s
        else:
            return {request_id: (first[request_id], done[request_id]) for request_id in progress}


@pytest.mark.parametrize("policy", ["default", "hrrn", "short_request_first"])
def test_engine_driver_is_the_simulator_step_by_step(policy):
    """Fed on a virtual clock, the mock's engine gives every request the TTFT and E2E that simulate()
    gives it: the mock serves the simulator's engine model and the real policy queue, nothing else."""
    specs = [RequestSpec(f"r{i}", i * 0.004, 2000 if i % 5 == 0 else 40 + i, 3 + i % 4, "short") for i in range(40)]
    limits = {"max_num_batched_tokens": 256}
    times = _drive(EngineDriver(policy, limits=limits), specs)
    expected = simulate(Workload("w", specs), policy, budget=256).records
    assert len(expected) == len(specs)
    for record in expected:
        first, finish = times[record.request_id]
        assert first - record.sent_at == pytest.approx(record.ttft_s, abs=1e-9)
        assert finish - record.sent_at == pytest.approx(record.e2e_s, abs=1e-9)


def test_engine_driver_keeps_no_history_however_long_it_serves():
    """The mock's engine is a long-running server: it keeps no step end times or timeline, so its memory
    does not grow with every step it runs (it kept both before), and requests finish as before."""
    specs = [RequestSpec(f"r{i}", i * 0.001, 8, 2, "short") for i in range(500)]
    driver = EngineDriver("default", limits={"max_num_batched_tokens": 256})
    times = _drive(driver, specs)
    assert len(times) == 500 and all(first <= finish for first, finish in times.values())
    assert len(driver.node.timeline) == 0 and len(driver.node.step_end_s) == 0


@pytest.mark.parametrize("spec", ["hrrn:partial_prefills=ordered", "short_request_first:partial_prefills=ordered",
                                  "promote_shortest:partial_prefills=ordered"])
def test_engine_driver_takes_the_full_config_with_ordered_partial_prefills(spec):
    """`bench --launch mock --policy SPEC` hands the mock the whole config as JSON: the engine then runs
    the policy with partial_prefills="ordered" exactly as simulate() does, which is not what "first" does."""
    config = parse_policy_spec(spec)[1]
    specs = [RequestSpec(f"r{i}", i * 0.004, 2000 if i % 5 == 0 else 40 + i, 3 + i % 4, "short") for i in range(40)]
    limits = {"max_num_batched_tokens": 256}
    driver = EngineDriver(json.dumps(config.to_dict()), limits=limits)
    assert driver.partial_prefills == "ordered"
    assert driver.policy_name == f"{config.policy} (partial_prefills=ordered)"
    times = _drive(driver, specs)
    expected = simulate(Workload("w", specs), config, budget=256).records
    for record in expected:
        first, _ = times[record.request_id]
        assert first - record.sent_at == pytest.approx(record.ttft_s, abs=1e-9)
    first_times = _drive(EngineDriver(config.policy, limits=limits), specs)
    assert any(abs(times[r][0] - first_times[r][0]) > 1e-9 for r in times)


def test_engine_refuses_what_could_never_run_and_bad_policies():
    with pytest.raises(ValueError, match="unknown policy"):
        MockBehaviour(engine_policy="nonsense")
    with pytest.raises(ValueError, match="unknown engine limit"):
        MockBehaviour(engine_policy="default", engine_limits={"bogus": 1})
    behaviour = MockBehaviour(engine_policy="default", engine_limits={"kv_blocks": 4, "block_size": 16})
    with MockServer(behaviour) as server:
        too_big = httpx.post(f"{server.url}/v1/completions",
                             json={"model": "mock-model", "prompt": [1] * 100, "max_tokens": 1})
        fits = httpx.post(f"{server.url}/v1/completions", json={"model": "mock-model", "prompt": [1] * 10,
                                                                 "max_tokens": 2})
    assert too_big.status_code == 400 and "KV" in too_big.json()["error"]["message"]
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 2


def test_a_failing_engine_breaks_its_streams_and_refuses_new_requests(monkeypatch):
    def broken(self, now):
        raise SimulationError("no progress possible")

    monkeypatch.setattr(EngineDriver, "step", broken)
    body = {"model": "mock-model", "prompt": [1, 2], "max_tokens": 3, "stream": True}
    with MockServer(MockBehaviour(engine_policy="default")) as server:
        with pytest.raises(httpx.HTTPError), httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                                                          timeout=10) as response:
            list(response.iter_lines())
        later = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=10)
    assert later.status_code == 400 and "no progress possible" in later.json()["error"]["message"]


@pytest.mark.parametrize("policy, shorts_first", [("default", False), ("short_request_first", True)])
def test_engine_policy_orders_the_waiting_queue(policy, shorts_first):
    """long-1 is sent alone; while it prefills (2048 tokens at 64 a step: 32 steps) long-2 and two shorts
    queue. FCFS (default) admits long-2 before the shorts; short_request_first the shorts first. The
    order is decided by the queue, not by when the three arrived, as long as they arrive while long-1
    prefills (the test waits for the engine to have started long-1 and to hold long-2 before it sends the
    shorts, not for a fixed time)."""
    import asyncio

    config = {"policy": policy, "threshold": 256}
    behaviour = MockBehaviour(engine_policy=config, engine_limits={"max_num_batched_tokens": 64})

    async def scenario() -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            async def send(name: str, tokens: int) -> None:
                await client.post("/v1/completions", headers={"x-request-id": name},
                                  json={"model": "mock-model", "prompt": [1] * tokens, "max_tokens": 1})
                finished.append(name)

            first = asyncio.create_task(send("long-1", 2048))
            while server.app.engine is None or server.app.engine.steps == 0:
                await asyncio.sleep(0.001)
            # long-2 must reach the engine before the shorts (separate connections race otherwise)
            second = asyncio.create_task(send("long-2", 2048))
            while len(server.app.engine.driver.active) < 2:
                await asyncio.sleep(0.001)
            rest = [asyncio.create_task(send(name, tokens)) for name, tokens in (("short-1", 8), ("short-2", 9))]
            await asyncio.gather(first, second, *rest)
        return finished

    with MockServer(behaviour) as server:
        order = asyncio.run(scenario())
    assert order[0] == "long-1"
    assert (order.index("long-2") > max(order.index("short-1"), order.index("short-2"))) == shorts_first


def test_runs_as_its_own_process():
    process = subprocess.Popen([sys.executable, "-m", "prefillq.cli.mockserver", "--port", "0", "--model", "p"],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
        url = line.strip().rsplit(" ", 1)[-1]
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "p"
    finally:
        process.terminate()
        process.wait(10)
