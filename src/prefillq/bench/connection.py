"""Keep-alive HTTP/1.1 connections for the load generator, framed by h11 and timed by us.

h11 is sans-I/O: we own the socket (an :class:`asyncio.Protocol`), stamp every read with the clock
*before* anything is parsed, feed the bytes to ``h11.Connection.receive_data`` and pull its events.
So the stamp a token gets is the moment its bytes were read, exactly as with no parser at all.

Sending stays one ``transport.write`` of bytes encoded before the run (:func:`encode_request`, by h11
on a scratch connection). The connection's own h11 state learns about the request only when the
answer starts (or the connection ends), so no framing work sits between "the schedule says now" and
"the bytes are on the socket".

With a :class:`ReadBacklog` (the pacing loop's, ``measure="prefillq"``), a read that arrives while a
send is due within ``guard_s`` is only stamped and queued; the pacing loop parses queued reads, oldest
first, when it has time before its next send. A burst of streamed tokens then cannot push a send past
its time, and every token keeps the stamp of the moment its bytes were read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11

from prefillq.bench.stream import EventBuffer, Measurement

clock = time.perf_counter
MAX_HEAD_BYTES = 65536  # a response head longer than this is an error
ERROR_BODY_BYTES = 500  # kept of a non-200 response's body, for the error text

OnFinish = Callable[["Connection", Measurement, bool], None]  # (connection, measurement, reusable)


@dataclass(frozen=True)
class Wire:
    """One request encoded ahead of time: the bytes to write and the h11 events they are."""

    data: bytes
    events: tuple[Any, ...]


def encode_request(method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Wire:
    """``method target`` with ``headers`` (host and content-length included) and ``body``, framed by h11."""
    events = (h11.Request(method=method, target=target, headers=headers), h11.Data(data=body), h11.EndOfMessage())
    scratch = h11.Connection(h11.CLIENT)
    data = b"".join(part for event in events for part in (scratch.send_with_data_passthrough(event) or ()))
    return Wire(data=data, events=events)


def error_message(text: str) -> str:
    """The readable part of an error body (an OpenAI-style ``{"error": {"message": ...}}`` or the text)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:200]
        return str(error)[:200]
    return text[:200] or "(empty body)"


@dataclass(frozen=True)
class _Lost:
    """A connection's end, held behind its last reads."""

    exc: Exception | None


class ReadBacklog:
    """Reads held back while a send is due soon, parsed later in the order they arrived.

    The pacing loop sets :attr:`next_send_at`; a read arriving within ``guard_s`` of it while fewer than
    ``limit`` reads wait (or on a connection that already has reads waiting, so that its bytes stay in
    order) is queued with its arrival stamp instead of parsed. :meth:`parse_one` and :meth:`drain` do the parsing later.
    """

    def __init__(self, guard_s: float, limit: int = 32) -> None:
        self.guard_s = guard_s
        self.limit = limit
        self.next_send_at = math.inf
        self.items: collections.deque[tuple[Connection, float, bytes | _Lost]] = collections.deque()
        self.cost_s = 50e-6  # what parsing one read costs, a moving average of the measured costs

    def holds(self, at: float) -> bool:
        """Whether a read arriving at ``at`` waits: a send is due within ``guard_s`` (not overdue: then the
        client is behind, and holding would only add to it) and the backlog is short."""
        return self.next_send_at - self.guard_s < at < self.next_send_at and len(self.items) < self.limit

    def hold(self, connection: Connection, at: float, item: bytes | _Lost) -> None:
        connection.held += 1
        self.items.append((connection, at, item))

    def fits_before(self, now: float, deadline: float) -> bool:
        """Whether one more read can be parsed, by its usual cost with a margin, before ``deadline``."""
        return now + 2 * self.cost_s < deadline

    def parse_one(self) -> None:
        """Parse the oldest held read (or deliver a held connection loss)."""
        started = clock()
        connection, at, item = self.items.popleft()
        connection.held -= 1
        if isinstance(item, _Lost):
            connection._lost(item.exc)
        else:
            connection._receive(item, at)
        self.cost_s += 0.05 * (clock() - started - self.cost_s)

    def drain(self) -> None:
        while self.items:
            self.parse_one()


class Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection carrying one streamed request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.current: Measurement | None = None
        self.uses = 0
        self.on_finish: OnFinish | None = None
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.untold: tuple[Any, ...] = ()  # events written to the socket that h11 has not been told of
        self.held = 0  # reads (and a loss) of this connection waiting in the pool's backlog
        self._new_response()

    def _new_response(self) -> None:
        self.status = 0
        self.events: EventBuffer | None = None  # the body's event parser (200 responses only)
        self.error_body = bytearray()
        self.received_any = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.held:  # its last bytes are still waiting: the loss is delivered after them
            self.pool.backlog.hold(self, clock(), _Lost(exc))  # type: ignore[union-attr]
            return
        self._lost(exc)

    def _lost(self, exc: Exception | None) -> None:
        if self.current is None or self.current.done:
            return
        with contextlib.suppress(h11.ProtocolError):  # a body delimited by the close ends here
            self._tell_h11()
            self.http.receive_data(b"")
            self._pull(clock())
        if self.current is not None and not self.current.done:
            reason = "connection closed before the response" if not self.received_any else "stream broken"
            self._fail(f"{reason}{f' ({exc})' if exc else ''}", keep=False)

    def data_received(self, data: bytes) -> None:
        at = clock()
        if self.current is None:
            return  # stray bytes after an aborted request; this connection is not reused
        backlog = self.pool.backlog
        if backlog is not None and (self.held or backlog.holds(at)):
            backlog.hold(self, at, data)
            return
        self._receive(data, at)

    def _receive(self, data: bytes, at: float) -> None:
        if self.current is None:
            return
        self.received_any = True
        try:
            self._tell_h11()
            self.http.receive_data(data)
            self._pull(at)
        except h11.ProtocolError as exc:
            self._fail(f"bad HTTP response: {exc}", keep=False)

    # sending
    def send(self, measurement: Measurement, wire: Wire, on_finish: OnFinish) -> None:
        self._new_response()
        self.current = measurement
        self.on_finish = on_finish
        self.untold = wire.events
        measurement.sent_at = clock()
        self.transport.write(wire.data)  # type: ignore[union-attr]

    def abort(self, reason: str) -> None:
        if self.current is not None and not self.current.done:
            self._fail(reason, keep=False)

    # receiving
    def _tell_h11(self) -> None:
        """Bring h11's state up to what was written (its copy of the bytes is not needed)."""
        events, self.untold = self.untold, ()
        for event in events:
            self.http.send_with_data_passthrough(event)

    def _pull(self, at: float) -> None:
        while self.current is not None and not self.current.done:
            event = self.http.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return
            if isinstance(event, h11.Response):
                self.status = event.status_code
                if self.status == 200:
                    self.events = EventBuffer(self.current.on_event)
            elif isinstance(event, h11.Data):
                if self.events is not None:
                    self.events.feed(bytes(event.data), at)
                else:
                    self.error_body += event.data[: max(0, ERROR_BODY_BYTES - len(self.error_body))]
            elif isinstance(event, h11.EndOfMessage):
                self._finish()

    def _finish(self) -> None:
        measurement = self.current
        if measurement is None or measurement.done:
            return
        if self.events is None:
            text = bytes(self.error_body).decode("utf-8", "replace").strip()
            measurement.error = measurement.error or f"HTTP {self.status}: {error_message(text)}"
        else:
            self.events.flush(clock())
        keep = not self.closed and self.http.our_state is h11.DONE and self.http.their_state is h11.DONE
        if keep:
            self.http.start_next_cycle()
        self._complete(measurement, keep)

    def _fail(self, reason: str, keep: bool) -> None:
        measurement = self.current
        if measurement is None or measurement.done:
            return
        measurement.error = measurement.error or reason
        self._complete(measurement, keep)

    def _complete(self, measurement: Measurement, keep: bool) -> None:
        measurement.done = True
        self.current = None
        if not keep and self.transport is not None:
            self.transport.abort()
        callback, self.on_finish = self.on_finish, None
        if callback is not None:
            callback(self, measurement, keep)


class Pool:
    """Idle keep-alive connections to one server."""

    def __init__(self, scheme: str, host: str, port: int, connect_timeout_s: float,
                 backlog: ReadBacklog | None = None) -> None:
        self.backlog = backlog  # None: every read is parsed as it arrives
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.all: set[Connection] = set()
        self.ssl_context = ssl.create_default_context() if scheme == "https" else None

    async def open(self) -> Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                lambda: Connection(self), self.host, self.port, ssl=self.ssl_context,
                server_hostname=self.host if self.ssl_context else None,
            )
        self.all.add(connection)
        return connection

    async def add_idle(self, count: int) -> int:
        """Open ``count`` more idle connections (32 at a time); returns how many opened."""
        opened = 0

        async def one() -> bool:
            try:
                connection = await self.open()
            except (OSError, TimeoutError):
                return False
            self.idle.append(connection)
            return True

        while opened < count:
            batch = min(32, count - opened)
            results = await asyncio.gather(*(one() for _ in range(batch)))
            opened += sum(results)
            if not any(results):
                break  # the server refuses; sends will report it
        return opened

    def take_idle(self) -> Connection | None:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                return connection
        return None

    def give_back(self, connection: Connection) -> None:
        if not connection.closed:
            self.idle.append(connection)

    def forget(self, connection: Connection) -> None:
        self.all.discard(connection)
        with contextlib.suppress(ValueError):
            self.idle.remove(connection)

    def close(self) -> None:
        for connection in list(self.all):
            if connection.transport is not None:
                connection.transport.abort()
        self.all.clear()
        self.idle.clear()
