"""The mock OpenAI-compatible server, checked with an independent HTTP client (httpx): the stream
format vLLM uses, validation, the injected faults, and the single prefill lane's order."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from prefillq.bench.mockserver import MockBehaviour, MockServer


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


@pytest.mark.parametrize("policy, expected", [
    ("fcfs", ["long-1", "long-2", "short-1", "short-2"]),
    ("shortest_first", ["long-1", "short-1", "short-2", "long-2"]),
])
def test_prefill_lane_order(policy, expected):
    """One prefill at a time: while long-1 (0.3 s) runs, the others queue and are taken in policy order."""
    import asyncio

    behaviour = MockBehaviour(prefill_token_s=0.001, queue_policy=policy)

    async def scenario() -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            async def send(name: str, tokens: int) -> None:
                await client.post("/v1/completions", headers={"x-request-id": name},
                                  json={"model": "mock-model", "prompt": [1] * tokens, "max_tokens": 1})
                finished.append(name)

            tasks = [asyncio.create_task(send("long-1", 300))]
            await asyncio.sleep(0.05)  # long-1 is being prefilled; the next three queue behind it, in order
            for name, tokens in (("long-2", 300), ("short-1", 2), ("short-2", 3)):
                tasks.append(asyncio.create_task(send(name, tokens)))
                await asyncio.sleep(0.03)
            await asyncio.gather(*tasks)
        return finished

    with MockServer(behaviour) as server:
        assert asyncio.run(scenario()) == expected


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
