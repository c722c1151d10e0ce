"""The client's HTTP/1.1 framing against hand-made responses: chunked and content-length bodies, a body
ended by the connection closing, bytes arriving one at a time, chunk extensions, keep-alive and
``Connection: close``, error statuses and garbage; and a timestamp per read (the gap between two
tokens written 80 ms apart is measured as such)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import pytest

from prefillq.bench.client import run_load
from prefillq.bench.payload import PayloadOptions, build_payload
from prefillq.workload import RequestSpec

OPTIONS = PayloadOptions(model="m")
TOKEN = b'data: {"choices":[{"text":"x"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"
SSE = TOKEN * 3 + USAGE + DONE


def _chunked(*parts: bytes, extension: bytes = b"") -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in parts)
    return body + b"0\r\n\r\n"


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

# Each responder gets (writer, request number on this connection) and writes one response.
Responder = Callable[[asyncio.StreamWriter, int], "asyncio.Future[bool] | object"]


class RawServer:
    """Answers each request with what ``respond`` writes; ``respond`` returns False to close."""

    def __init__(self, respond: Callable[[asyncio.StreamWriter, int], object]) -> None:
        self.respond = respond
        self.connections = 0
        self.requests = 0
        self.most_on_one_connection = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                json.loads(await reader.readexactly(length))
                self.requests += 1
                self.most_on_one_connection = max(self.most_on_one_connection, number + 1)
                keep = await self.respond(writer, number)
                number += 1
                await writer.drain()
                if keep is False:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def __enter__(self) -> RawServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _run(server: RawServer, count: int = 1, spacing_s: float = 0.0, timeout_s: float = 5.0,
         guard_s: float = 0.002):
    specs = [RequestSpec(f"r{i}", i * spacing_s, 4, 3, "short") for i in range(count)]
    payloads = [build_payload(spec, OPTIONS, 0) for spec in specs]
    return asyncio.run(run_load(payloads, server.url, timeout_s=timeout_s, warm_horizon_s=0.0,
                                max_idle_connections=1, guard_s=guard_s)).records


# guard_s 0: every read is parsed as it arrives; 10 s: every read that arrives while a send is still to
# come waits in the backlog (and a connection's end waits behind its reads) until the pacing loop has time
PARSING = pytest.mark.parametrize("guard_s", [0.0, 10.0], ids=["parsed-at-once", "held-for-sends"])


async def _write(writer: asyncio.StreamWriter, data: bytes, *, piece: int | None = None) -> None:
    if piece is None:
        writer.write(data)
        return
    for start in range(0, len(data), piece):
        writer.write(data[start:start + piece])
        await writer.drain()
        await asyncio.sleep(0)


def _ok(record) -> None:
    assert record.error is None, record.error
    assert record.output_tokens == 3 and len(record.itl_s) == 2


@pytest.mark.parametrize("piece", [None, 1, 7])
def test_chunked_stream_in_any_pieces(piece):
    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD + _chunked(*[TOKEN] * 3, USAGE, DONE), piece=piece)

    with RawServer(respond) as server:
        _ok(_run(server)[0])


def test_chunk_extensions_and_several_events_per_chunk():
    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD + _chunked(TOKEN * 2, TOKEN + USAGE, DONE, extension=b";name=value"))

    with RawServer(respond) as server:
        _ok(_run(server)[0])


@PARSING
def test_content_length_body(guard_s):
    async def respond(writer, number):
        await _write(writer, b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(SSE), SSE))

    with RawServer(respond) as server:
        records = _run(server, count=3, spacing_s=0.05, guard_s=guard_s)
    for record in records:
        _ok(record)
    assert server.most_on_one_connection >= 2  # kept alive and reused


@PARSING
def test_body_ended_by_the_connection_closing(guard_s):
    async def respond(writer, number):
        await _write(writer, b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + SSE)
        return False

    with RawServer(respond) as server:
        records = _run(server, count=2, spacing_s=0.05, guard_s=guard_s)
    for record in records:
        _ok(record)
    assert server.most_on_one_connection == 1


@PARSING
def test_connection_close_header_is_honoured(guard_s):
    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
                     + _chunked(SSE))
        return False

    with RawServer(respond) as server:
        records = _run(server, count=3, spacing_s=0.05, guard_s=guard_s)
    assert all(record.error is None for record in records)
    assert server.most_on_one_connection == 1 and server.connections >= 3


def test_error_status_with_a_json_body():
    body = json.dumps({"error": {"message": "overloaded", "code": 503}}).encode()

    async def respond(writer, number):
        await _write(writer, b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))

    with RawServer(respond) as server:
        record = _run(server)[0]
    assert record.error == "HTTP 503: overloaded"


def test_garbage_is_a_bad_response():
    async def respond(writer, number):
        await _write(writer, b"SPDY/9 what\r\n\r\n")
        return False

    with RawServer(respond) as server:
        record = _run(server)[0]
    assert record.error.startswith("bad HTTP response")


@PARSING
def test_body_cut_short_is_a_broken_stream(guard_s):
    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD + b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN))
        return False

    with RawServer(respond) as server:
        records = _run(server, count=2, spacing_s=0.05, guard_s=guard_s)
    assert all(record.error.startswith("stream broken") for record in records)


def test_each_read_is_stamped_when_it_arrives():
    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD + b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN))
        await writer.drain()
        await asyncio.sleep(0.08)
        await _write(writer, _chunked(TOKEN, TOKEN, USAGE, DONE))

    with RawServer(respond) as server:
        record = _run(server)[0]
    _ok(record)
    assert record.itl_s[0] >= 0.075  # the second token's bytes came 80 ms after the first's
    assert record.itl_s[1] < 0.02  # the third arrived in the same read as the second


def test_reads_held_while_a_send_is_due_keep_their_arrival_stamps(monkeypatch):
    """With a later send due, the first stream's reads wait in the backlog (parsed only when the pacing
    loop wakes for that send); each keeps the stamp taken when its bytes arrived, so the 80 ms gap the
    server put between two tokens is still measured, and every held read was stamped before it was
    parsed."""
    from prefillq.bench import connection

    held: list[tuple[float, float]] = []  # (stamp on arrival, clock when parsed)
    parse_one = connection.ReadBacklog.parse_one

    def watched(backlog):
        held.append((backlog.items[0][1], connection.clock()))
        parse_one(backlog)

    monkeypatch.setattr(connection.ReadBacklog, "parse_one", watched)

    async def respond(writer, number):
        await _write(writer, CHUNKED_HEAD + b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN))
        await writer.drain()
        await asyncio.sleep(0.08)
        await _write(writer, _chunked(TOKEN, TOKEN, USAGE, DONE))

    with RawServer(respond) as server:
        records = _run(server, count=2, spacing_s=0.3, guard_s=10.0)
    for record in records:
        _ok(record)
    assert held and all(stamp <= parsed for stamp, parsed in held)
    assert records[0].itl_s[0] >= 0.075  # stamped on arrival, not when parsed
