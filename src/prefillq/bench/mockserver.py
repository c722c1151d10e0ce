"""A small OpenAI-compatible streaming server for testing the load generator without an engine.

It speaks just enough HTTP/1.1 (keep-alive, chunked server-sent events) over asyncio streams to serve
``GET /health``, ``GET /v1/models`` and ``POST /v1/completions`` the way vLLM's OpenAI front-end does:
``data: {...}`` events carrying ``tokens_per_chunk`` output tokens each (vLLM sends one token per
event, several when its front end falls behind), an optional usage event
(``stream_options.include_usage``; with ``continuous_usage_stats`` every event carries the running
totals, as in vLLM) and ``data: [DONE]``.

Two ways to produce tokens:

* fixed timings (the default): every request runs on its own, its first token after a fixed delay
  plus a per-prompt-token prefill cost, then one token every ``token_interval_s``;
* ``engine_policy`` set: every request runs on the simulator's vLLM engine model with the real
  prefillq queue of that policy, played out in real time (:mod:`prefillq.bench.simengine`). This is
  what ``prefillq bench --launch mock --policies ...`` starts, so a policy label on a mock run means
  that policy really ordered the (simulated) engine's waiting queue.

Faults on demand, keyed by the request id the client sends in ``X-Request-Id``:
``http500`` (an error status), ``hang`` (never answers), ``break:N`` (drops the connection after N
tokens), ``close`` (drops the connection before answering), ``bad-json`` (an unparsable event).

Run it in a thread of the current process (:class:`MockServer`, used by the tests) or as its own
process: ``python -m prefillq.cli.mockserver --port 8000 [--engine-policy hrrn] ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from prefillq.sim.costs import DEFAULT_PROFILES

FAULTS = ("http500", "hang", "break", "close", "bad-json")


@dataclass
class MockBehaviour:
    """How the mock answers. Times in seconds."""

    model: str = "mock-model"
    vocab_size: int = 32000
    first_token_delay_s: float = 0.0
    prefill_token_s: float = 0.0
    token_interval_s: float = 0.0
    tokens_per_chunk: int = 1  # tokens per server-sent event (vLLM coalesces when its front end lags)
    engine_policy: Any = None  # a policy: requests run on the simulated engine (see simengine.py)
    engine_profile: str = DEFAULT_PROFILES["vllm"]  # the engine's cost profile: compare's vLLM-mode default
    engine_limits: dict[str, int] = field(default_factory=dict)  # overrides of the profile's engine limits
    faults: dict[str, str] = field(default_factory=dict)  # request id -> fault
    record_requests: bool = True  # keep what was received (tests); off for long-running servers

    def __post_init__(self) -> None:
        if isinstance(self.tokens_per_chunk, bool) or not isinstance(self.tokens_per_chunk, int) \
                or self.tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be an integer >= 1, got {self.tokens_per_chunk!r}")
        if self.engine_policy is not None:
            from prefillq.bench.simengine import EngineDriver

            EngineDriver(self.engine_policy, self.engine_profile, self.engine_limits)  # refuses a bad config now
        for request_id, fault in self.faults.items():
            if fault.split(":", 1)[0] not in FAULTS:
                raise ValueError(f"unknown fault {fault!r} for {request_id!r}; valid: {', '.join(FAULTS)}")


@dataclass
class ReceivedRequest:
    """What the mock saw: for tests that check exactly what the client put on the wire."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    received_at: float  # time.monotonic()


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


class MockApp:
    """The request handling, independent of how the server is run."""

    def __init__(self, behaviour: MockBehaviour) -> None:
        self.behaviour = behaviour
        self.received: list[ReceivedRequest] = []
        self.connections = 0
        self.completions = 0
        self.engine: Any = None  # the RealTimeEngine, started with the first request when engine_policy is set
        self._writers: set[asyncio.StreamWriter] = set()

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send_json(writer, 400, {"error": {"message": "header too large"}}, close=True)
                    return
                method, path, headers = _parse_head(head)
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                keep_alive = headers.get("connection", "").lower() != "close"
                if not await self._dispatch(method, path, headers, body, writer):
                    return
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _dispatch(
        self, method: str, path: str, headers: dict[str, str], raw_body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must be dropped."""
        route = path.split("?", 1)[0]
        if route == "/health" and method == "GET":
            await self._send_json(writer, 200, {})
            return True
        if route == "/v1/models" and method == "GET":
            created = int(time.time())
            await self._send_json(
                writer, 200,
                {"object": "list", "data": [{"id": self.behaviour.model, "object": "model", "created": created,
                                             "owned_by": "prefillq-mock", "max_model_len": 1 << 20}]},
            )
            return True
        if route == "/tokenize" and method == "POST":
            try:
                request = json.loads(raw_body or b"null")
                words = len(str(request["prompt"]).split())
            except (ValueError, KeyError, TypeError):
                await self._send_json(writer, 400, {"error": {"message": "need a JSON body with a prompt"}})
                return True
            await self._send_json(writer, 200, {"count": words, "max_model_len": 1 << 20, "tokens": []})
            return True
        if route != "/v1/completions":
            await self._send_json(writer, 404, {"error": {"message": f"no route {route}"}})
            return True
        if method != "POST":
            await self._send_json(writer, 405, {"error": {"message": "use POST"}})
            return True
        try:
            body = json.loads(raw_body or b"null")
        except json.JSONDecodeError:
            body = None
        self.completions += 1
        if self.behaviour.record_requests:
            self.received.append(
                ReceivedRequest(path=route, headers=dict(headers), body=body, received_at=time.monotonic())
            )
        try:
            prompt_tokens, max_tokens, stream, include_usage, continuous_usage = self._validate(body)
        except _HttpError as exc:
            await self._send_json(writer, exc.status, {"error": {"message": exc.message, "type": "BadRequestError"}})
            return True
        request_id = headers.get("x-request-id", f"cmpl-{self.completions}")
        fault = self.behaviour.faults.get(request_id, "")
        kind, _, argument = fault.partition(":")
        if kind == "close":
            return False
        if kind == "http500":
            error = {"message": "injected failure", "type": "InternalServerError"}
            await self._send_json(writer, 500, {"error": error})
            return True
        if kind == "hang":
            await asyncio.Event().wait()  # until the client gives up and the connection is torn down
        try:
            produced = self._produce(prompt_tokens, max_tokens, request_id)
        except ValueError as exc:  # the simulated engine could never run it
            await self._send_json(writer, 400, {"error": {"message": str(exc), "type": "BadRequestError"}})
            return True
        if not stream:
            async for _ in produced:
                pass
            await self._send_json(writer, 200, {
                "id": request_id, "object": "text_completion", "model": self.behaviour.model,
                "choices": [{"index": 0, "text": " tok" * max_tokens, "finish_reason": "length"}],
                "usage": _usage(prompt_tokens, max_tokens),
            })
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        break_after = int(argument) if kind == "break" and argument else (0 if kind == "break" else None)
        per_chunk = self.behaviour.tokens_per_chunk
        sent = 0
        async for tokens in produced:
            # Tokens wait until a chunk's worth is there (or the last one is): several tokens, one event.
            while sent < tokens and (tokens - sent >= per_chunk or tokens == max_tokens):
                if break_after is not None and sent >= break_after:
                    writer.transport.abort()
                    return False
                count = min(per_chunk, tokens - sent)
                sent += count
                if kind == "bad-json" and sent == max_tokens:
                    _write_chunk(writer, b"data: {not json\n\n")
                    continue
                event: dict[str, Any] = {
                    "id": request_id, "object": "text_completion", "model": self.behaviour.model,
                    "choices": [{"index": 0, "text": " tok" * count, "logprobs": None,
                                 "finish_reason": "length" if sent == max_tokens else None}],
                }
                if include_usage:  # vLLM: null, or the running totals with continuous_usage_stats
                    event["usage"] = _usage(prompt_tokens, sent) if continuous_usage else None
                _write_chunk(writer, b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
            await writer.drain()
        if include_usage:
            usage_event = {"id": request_id, "object": "text_completion", "model": self.behaviour.model,
                           "choices": [], "usage": _usage(prompt_tokens, max_tokens)}
            _write_chunk(writer, b"data: " + json.dumps(usage_event, separators=(",", ":")).encode() + b"\n\n")
        _write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    def _produce(self, prompt_tokens: int, max_tokens: int, request_id: str) -> AsyncIterator[int]:
        """The request's output tokens as they are produced: an iterator of running totals."""
        if self.behaviour.engine_policy is None:
            return self._timed_tokens(prompt_tokens, max_tokens)
        if self.engine is None:
            from prefillq.bench.simengine import EngineDriver, RealTimeEngine

            behaviour = self.behaviour
            self.engine = RealTimeEngine(EngineDriver(behaviour.engine_policy, behaviour.engine_profile,
                                                       behaviour.engine_limits))
        return _engine_tokens(self.engine.submit(prompt_tokens, max_tokens, request_id))

    async def _timed_tokens(self, prompt_tokens: int, max_tokens: int) -> AsyncIterator[int]:
        """Fixed timings: the first token after the prefill delay, then one every ``token_interval_s``."""
        delay = self.behaviour.first_token_delay_s + self.behaviour.prefill_token_s * prompt_tokens
        if delay > 0:
            await asyncio.sleep(delay)
        for index in range(max_tokens):
            if index:
                await asyncio.sleep(self.behaviour.token_interval_s)
            yield index + 1

    def _validate(self, body: Any) -> tuple[int, int, bool, bool, bool]:
        if not isinstance(body, dict):
            raise _HttpError(400, "body must be a JSON object")
        if body.get("model") != self.behaviour.model:
            raise _HttpError(404, f"The model `{body.get('model')}` does not exist.")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.behaviour.vocab_size]
            if bad:
                raise _HttpError(400, f"token id {bad[0]} out of vocabulary (size {self.behaviour.vocab_size})")
            prompt_tokens = len(prompt)
        elif isinstance(prompt, str) and prompt:
            prompt_tokens = len(prompt.split())  # the mock's tokenizer: one token per word
        else:
            raise _HttpError(400, "prompt must be a non-empty string or list of token ids")
        max_tokens = body.get("max_tokens", 16)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _HttpError(400, "max_tokens must be an integer >= 1")
        options = body.get("stream_options") or {}
        return (prompt_tokens, max_tokens, bool(body.get("stream")), bool(options.get("include_usage")),
                bool(options.get("include_usage") and options.get("continuous_usage_stats")))

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, payload: Any, close: bool = False) -> None:
        data = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n")
        if close:
            head += "connection: close\r\n"
        writer.write(head.encode() + b"\r\n" + data)
        await writer.drain()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        for writer in list(self._writers):
            writer.transport.abort()


async def _engine_tokens(progress: Any) -> AsyncIterator[int]:
    """Running totals of a request on the simulated engine, as its steps end."""
    while True:
        await progress.changed.wait()
        progress.changed.clear()
        if progress.error is not None:
            raise ConnectionAbortedError(progress.error)  # the handler drops the connection
        yield progress.tokens
        if progress.finished:
            return


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "/")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return method, path, headers


class MockServer:
    """The mock running in a background thread with its own event loop (so it never shares the client's).

    ``with MockServer(MockBehaviour(token_interval_s=0.01)) as server: ... server.url ...``
    """

    def __init__(self, behaviour: MockBehaviour | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.behaviour = behaviour or MockBehaviour()
        self.app = MockApp(self.behaviour)
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def received(self) -> list[ReceivedRequest]:
        return self.app.received

    def start(self) -> MockServer:
        self._thread = threading.Thread(target=self._serve_in_thread, name="prefillq-mockserver", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"mock server failed to start: {self._error}") from self._error
        return self

    def _serve_in_thread(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self.app.handle_connection, self.host, self.port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            self.app.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def serve_forever(behaviour: MockBehaviour, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until cancelled; ``announce`` gets the URL once listening."""
    app = MockApp(behaviour)
    server = await asyncio.start_server(app.handle_connection, host, port, backlog=4096)
    announce(f"http://{host}:{server.sockets[0].getsockname()[1]}")
    async with server:
        await server.serve_forever()
