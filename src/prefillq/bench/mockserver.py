"""A small OpenAI-compatible streaming server for testing the load generator without an engine.

It speaks just enough HTTP/1.1 (keep-alive, chunked server-sent events) over asyncio streams to serve
``GET /health``, ``GET /v1/models`` and ``POST /v1/completions`` the way vLLM's OpenAI front-end does:
one ``data: {...}`` event per output token, an optional usage event (``stream_options.include_usage``)
and ``data: [DONE]``. Timing is configurable (a fixed first-token delay, a per-prompt-token prefill
cost, a gap between output tokens) and, with ``queue_policy`` set, prefills run one at a time in
``fcfs`` or ``shortest_first`` order, so two mock servers can stand in for two scheduling policies.

Faults on demand, keyed by the request id the client sends in ``X-Request-Id``:
``http500`` (an error status), ``hang`` (never answers), ``break:N`` (drops the connection after N
tokens), ``close`` (drops the connection before answering), ``bad-json`` (an unparsable event).

Run it in a thread of the current process (:class:`MockServer`, used by the tests) or as its own
process: ``python -m prefillq.cli.mockserver --port 8000 [--queue-policy fcfs] ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

QUEUE_POLICIES = ("fcfs", "shortest_first")
FAULTS = ("http500", "hang", "break", "close", "bad-json")


@dataclass
class MockBehaviour:
    """How the mock answers. Times in seconds."""

    model: str = "mock-model"
    vocab_size: int = 32000
    first_token_delay_s: float = 0.0
    prefill_token_s: float = 0.0
    token_interval_s: float = 0.0
    queue_policy: str | None = None  # None: every request runs independently (unbounded parallelism)
    faults: dict[str, str] = field(default_factory=dict)  # request id -> fault
    record_requests: bool = True  # keep what was received (tests); off for long-running servers

    def __post_init__(self) -> None:
        if self.queue_policy is not None and self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"queue_policy must be one of {QUEUE_POLICIES} or None, got {self.queue_policy!r}")
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


class _PrefillLane:
    """One prefill at a time, in the order of a queue policy: a caricature of an engine's prefill queue."""

    def __init__(self, behaviour: MockBehaviour) -> None:
        self.behaviour = behaviour
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # (prompt_tokens, seq, done)
        self.wakeup = asyncio.Event()
        self.sequence = 0
        self.worker = asyncio.get_running_loop().create_task(self._run())

    async def prefill(self, prompt_tokens: int) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sequence += 1
        self.waiting.append((prompt_tokens, self.sequence, done))
        self.wakeup.set()
        await done

    async def _run(self) -> None:
        while True:
            while not self.waiting:
                self.wakeup.clear()
                await self.wakeup.wait()
            if self.behaviour.queue_policy == "shortest_first":
                chosen = min(self.waiting, key=lambda item: (item[0], item[1]))
            else:
                chosen = min(self.waiting, key=lambda item: item[1])
            self.waiting.remove(chosen)
            prompt_tokens, _, done = chosen
            if done.cancelled():
                continue
            await asyncio.sleep(self.behaviour.first_token_delay_s + self.behaviour.prefill_token_s * prompt_tokens)
            if not done.done():
                done.set_result(None)

    def close(self) -> None:
        self.worker.cancel()


class MockApp:
    """The request handling, independent of how the server is run."""

    def __init__(self, behaviour: MockBehaviour) -> None:
        self.behaviour = behaviour
        self.received: list[ReceivedRequest] = []
        self.connections = 0
        self.completions = 0
        self._lane: _PrefillLane | None = None
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
            prompt_tokens, max_tokens, stream, include_usage = self._validate(body)
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
        await self._prefill(prompt_tokens)
        if not stream:
            await asyncio.sleep(self.behaviour.token_interval_s * max(0, max_tokens - 1))
            await self._send_json(writer, 200, {
                "id": request_id, "object": "text_completion", "model": self.behaviour.model,
                "choices": [{"index": 0, "text": " tok" * max_tokens, "finish_reason": "length"}],
                "usage": _usage(prompt_tokens, max_tokens),
            })
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        break_after = int(argument) if kind == "break" and argument else (0 if kind == "break" else None)
        for index in range(max_tokens):
            if index:
                await asyncio.sleep(self.behaviour.token_interval_s)
            if break_after is not None and index >= break_after:
                writer.transport.abort()
                return False
            if kind == "bad-json" and index == max(0, max_tokens - 1):
                _write_chunk(writer, b"data: {not json\n\n")
                continue
            event = {
                "id": request_id, "object": "text_completion", "model": self.behaviour.model,
                "choices": [{"index": 0, "text": " tok", "logprobs": None,
                             "finish_reason": "length" if index == max_tokens - 1 else None}],
            }
            if include_usage:
                event["usage"] = None
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

    def _validate(self, body: Any) -> tuple[int, int, bool, bool]:
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
        return prompt_tokens, max_tokens, bool(body.get("stream")), bool(options.get("include_usage"))

    async def _prefill(self, prompt_tokens: int) -> None:
        if self.behaviour.queue_policy is None:
            delay = self.behaviour.first_token_delay_s + self.behaviour.prefill_token_s * prompt_tokens
            if delay > 0:
                await asyncio.sleep(delay)
            return
        if self._lane is None:
            self._lane = _PrefillLane(self.behaviour)
        await self._lane.prefill(prompt_tokens)

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, payload: Any, close: bool = False) -> None:
        data = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n")
        if close:
            head += "connection: close\r\n"
        writer.write(head.encode() + b"\r\n" + data)
        await writer.drain()

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()
        for writer in list(self._writers):
            writer.transport.abort()


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
