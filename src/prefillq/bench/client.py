"""The load generator: sends each request at its scheduled absolute time and measures its stream.

Why a small HTTP/1.1 client of our own rather than a general-purpose one: the measured path must add
as little and as predictable work as possible between "the schedule says now" and "the bytes are on
the socket", and it must timestamp every streamed token when the bytes arrive. So:

* connections are opened *before* the run (``prewarm``), and a send is one ``transport.write`` of
  a body encoded ahead of time, done inline in the pacing loop;
* pacing targets absolute times ``t0 + arrival_s`` (never relative sleeps, which accumulate drift):
  a coarse ``asyncio.sleep`` to 1 ms before the target (epoll rounds timeouts up to whole
  milliseconds, so this wakes at most ~1 ms later, i.e. by the target), then a yield-spin
  (``sleep(0)``) that keeps serving other sockets while it waits for the exact moment;
* responses are parsed in ``data_received`` (status line, chunked transfer coding, server-sent
  events) and each event is stamped with the time its bytes were read.

Every request ends as one :class:`~prefillq.metrics.RequestRecord` (the project's single definition
of TTFT/E2E/ITL), handed to ``on_record`` as soon as it finishes: the JSONL writer flushes it at once,
so an interrupted run loses nothing it had measured. HTTP errors, timeouts and broken streams become
records with ``error`` set, never exceptions.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import json
import math
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

from prefillq.bench.analysis import lateness_summary
from prefillq.bench.payload import Payload, PayloadOptions, prompt_text
from prefillq.metrics import RequestRecord
from prefillq.workload import RequestSpec

COMPLETIONS_PATH = "/v1/completions"
clock = time.perf_counter


class ServerUnreachable(RuntimeError):
    """The server did not answer the pre-flight check; nothing was sent."""


@dataclass(frozen=True)
class Endpoint:
    """Where to send: scheme, host, port and the URL prefix in front of ``/v1/...``."""

    scheme: str
    host: str
    port: int
    base_path: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return cls(parts.scheme, parts.hostname, port, base)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"


WAKE_UP_USER = "prefillq-wake-up"


def wake_server(url: str, payload_body: bytes, *, api_key: str | None = None, timeout_s: float = 60.0) -> str | None:
    """Send one tiny, unmeasured completion just before a run; return None, or the error text.

    A server that sat idle while other policies ran can be slow on its first step (measured here:
    ~0.9 s instead of ~0.15 s for an idle vLLM CPU server whose memory the kernel had reclaimed), which
    would be charged to the first requests of the run. The wake-up request uses the run's own model and
    settings with a one-token prompt and one output token, and is marked with ``user`` so that it can be
    told apart in server logs.
    """
    import httpx

    body = json.loads(payload_body)
    prompt = body.get("prompt")
    body.update({"prompt": prompt[:1] if isinstance(prompt, list) else "hello", "max_tokens": 1,
                 "stream": False, "user": WAKE_UP_USER})
    body.pop("stream_options", None)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{Endpoint.parse(url).url}/v1/completions", json=body, headers=headers,
                              timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"


# ---------------------------------------------------------------------------------------------------
# Pre-flight


def check_server(url: str, *, model: str | None = None, timeout_s: float = 5.0,
                 api_key: str | None = None) -> str:
    """Ask ``GET /v1/models`` and return the model name to put in requests.

    Raises :class:`ServerUnreachable` with a clear message when the server cannot be reached, answers
    with an error, or does not serve ``model``.
    """
    import httpx

    endpoint = Endpoint.parse(url)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{endpoint.url}/v1/models", timeout=timeout_s, headers=headers)
    except httpx.HTTPError as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ServerUnreachable(f"cannot reach {endpoint.url} ({reason}); is the server up?") from None
    if response.status_code == 404 and model:
        return model  # a server without /v1/models; trust the name we were given
    if response.status_code != 200:
        raise ServerUnreachable(f"{endpoint.url}/v1/models answered HTTP {response.status_code}: {response.text[:200]}")
    try:
        served = [item["id"] for item in response.json().get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ServerUnreachable(f"{endpoint.url}/v1/models did not return an OpenAI model list") from None
    if model is None:
        if not served:
            raise ServerUnreachable(f"{endpoint.url} serves no model")
        return served[0]
    if served and model not in served:
        raise ServerUnreachable(f"{endpoint.url} does not serve model {model!r}; it serves: {', '.join(served)}")
    return model


def fit_text_prompts(url: str, options: PayloadOptions, specs: Sequence[RequestSpec], payload_seed: int, *,
                     api_key: str | None = None) -> tuple[dict[str, str], bool]:
    """Text prompts of exactly ``spec.prompt_tokens`` tokens, fitted with the server's ``/tokenize``.

    Each prompt is a request-specific run of common words: the word count is searched (proportional
    guess, then bisection) for the longest text not over the target, and the rest is filled with a
    short filler that the tokenizer counts one token per repetition. Returns (request id -> text,
    exact); ``exact`` is False when some prompt could not be hit exactly (it is then the closest below)
    or the server has no ``/tokenize`` (then one word per intended token, as a guess).
    """
    import httpx

    endpoint = Endpoint.parse(url)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    texts = {spec.request_id: prompt_text(spec, payload_seed) for spec in specs}
    with httpx.Client(base_url=endpoint.url, timeout=60.0, headers=headers) as http:

        def count(text: str) -> int | None:
            try:
                response = http.post("/tokenize", json={"model": options.model, "prompt": text})
            except httpx.HTTPError:
                return None
            if response.status_code != 200:
                return None
            value = response.json().get("count")
            return value if isinstance(value, int) else None

        if specs and count("hello world") is None:
            return texts, False
        words_per_token = 1.0
        exact = True
        for spec in specs:
            target = spec.prompt_tokens
            below, below_count, above = 0, 0, None  # word counts bracketing the target
            words = max(1, round(target * words_per_token))
            for _ in range(40):
                got = count(prompt_text(spec, payload_seed, words))
                if got is None:
                    return texts, False
                if got <= target:
                    below, below_count = words, got
                else:
                    above = words
                if got == target or (above is not None and above - below <= 1):
                    break
                if above is None:
                    words = max(words + 1, round(words * target / max(got, 1)))
                elif below == 0:
                    words = max(1, min(above - 1, round(words * target / max(got, 1))))
                else:
                    words = (below + above) // 2
            base = prompt_text(spec, payload_seed, below) if below else ""
            if below:
                words_per_token = below / max(below_count, 1)
            best, best_count = base, below_count
            missing = target - below_count
            for filler in (" .", ".", " 0", "!", " a"):
                if missing <= 0:
                    break
                candidate = base + filler * missing
                got = count(candidate)
                if got == target:
                    best, best_count = candidate, got
                    break
            texts[spec.request_id] = best or prompt_text(spec, payload_seed, 1)
            exact = exact and best_count == target
    return texts, exact


# ---------------------------------------------------------------------------------------------------
# One request's measurement


@dataclass
class _Measurement:
    """Timestamps of one streamed response, turned into a record by :meth:`record`."""

    payload: Payload
    scheduled_at: float  # from run start
    sent_at: float | None = None  # absolute clock()
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    token_events: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    error: str | None = None
    done: bool = False

    def on_event(self, data: bytes, at: float) -> None:
        """One server-sent event ``data:`` payload, received at ``at``."""
        if data == b"[DONE]":
            return
        if b'"choices":[{' in data and b'"usage":{' not in data and b'"error"' not in data:
            self._token(at)  # fast path: a compact token event needs no parsing
            return
        try:
            event = json.loads(data)
        except ValueError:
            self.error = self.error or f"malformed event: {data[:80]!r}"
            return
        if not isinstance(event, dict):
            self.error = self.error or f"malformed event: {data[:80]!r}"
            return
        if "error" in event and not event.get("choices"):
            self.error = self.error or f"server error in stream: {str(event['error'])[:200]}"
            return
        usage = event.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_completion_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt_tokens = usage["prompt_tokens"]
        if event.get("choices"):
            self._token(at)

    def _token(self, at: float) -> None:
        self.token_events += 1
        if self.first_token_at is None:
            self.first_token_at = at
        else:
            self.gaps.append(at - self.last_token_at)  # type: ignore[operator]
        self.last_token_at = at

    def record(self, run_start: float) -> RequestRecord:
        spec = self.payload.spec
        sent = self.sent_at if self.sent_at is not None else run_start + self.scheduled_at
        error = self.error
        if error is None and self.first_token_at is None:
            error = "stream ended without a token"
        ok = error is None
        output_tokens = spec.output_tokens
        if ok:
            counted = self.usage_completion_tokens
            output_tokens = counted if counted is not None else self.token_events
        return RequestRecord(
            request_id=spec.request_id,
            klass=spec.klass,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=output_tokens,
            scheduled_at=self.scheduled_at,
            sent_at=sent - run_start,
            ttft_s=(self.first_token_at - sent) if ok and self.first_token_at is not None else None,
            e2e_s=(self.last_token_at - sent) if ok and self.last_token_at is not None else None,
            itl_s=list(self.gaps) if ok else [],
            error=error,
        )


# ---------------------------------------------------------------------------------------------------
# HTTP/1.1 over asyncio, one response at a time per connection


class _Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection that parses streamed responses as bytes arrive."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.current: _Measurement | None = None
        self.uses = 0
        self.on_finish: Callable[[_Connection, _Measurement, bool], None] | None = None
        self._reset_parser()

    def _reset_parser(self) -> None:
        self.pending = b""  # bytes of an incomplete line or head, waiting for more
        self.state = "head"  # head -> body
        self.status = 0
        self.chunked = False
        self.remaining: int | None = None  # content-length left, or bytes left in the current chunk
        self.chunk_crlf = False  # a chunk's data was read; its CRLF is next
        self.keep_alive = True
        self.event_pending = b""
        self.error_body = bytearray()
        self.received_any = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.current is not None and not self.current.done:
            if self.state == "body" and not self.chunked and self.remaining is None:
                self._finish(keep=False)  # body delimited by connection close
                return
            reason = "connection closed before the response" if not self.received_any else "stream broken"
            self._fail(f"{reason}{f' ({exc})' if exc else ''}", keep=False)

    def data_received(self, data: bytes) -> None:
        at = clock()
        if self.current is None:
            return  # stray bytes after an aborted request; this connection is not reused
        self.received_any = True
        if self.pending:
            data = self.pending + data
            self.pending = b""
        try:
            self.pending = self._consume(data, at)
        except (_ProtocolError, ValueError) as exc:
            self._fail(f"bad HTTP response: {exc}", keep=False)

    # sending
    def send(self, measurement: _Measurement, request_bytes: bytes,
             on_finish: Callable[[_Connection, _Measurement, bool], None]) -> None:
        self._reset_parser()
        self.current = measurement
        self.on_finish = on_finish
        measurement.sent_at = clock()
        self.transport.write(request_bytes)  # type: ignore[union-attr]

    def abort(self, reason: str) -> None:
        if self.current is not None and not self.current.done:
            self._fail(reason, keep=False)

    # parsing
    def _consume(self, data: bytes, at: float) -> bytes:
        """Parse as much of ``data`` as possible; returns the unparsed tail."""
        position, size = 0, len(data)
        while position < size and self.current is not None:
            if self.state == "head":
                end = data.find(b"\r\n\r\n", position)
                if end < 0:
                    if size - position > 65536:
                        raise _ProtocolError("response head too large")
                    return data[position:]
                self._parse_head(data[position:end])
                position = end + 4
                self.state = "body"
                if self.remaining == 0 and not self.chunked:
                    self._finish(keep=self.keep_alive)
                    return b""
            elif not self.chunked:
                if self.remaining is None:  # body delimited by the connection closing
                    self._body_bytes(data[position:], at)
                    return b""
                take = min(self.remaining, size - position)
                self._body_bytes(data[position:position + take], at)
                position += take
                self.remaining -= take
                if self.remaining == 0:
                    self._finish(keep=self.keep_alive)
                    return b""
            elif self.remaining:
                take = min(self.remaining, size - position)
                self._body_bytes(data[position:position + take], at)
                position += take
                self.remaining -= take
                if self.remaining == 0:
                    self.chunk_crlf = True
            elif self.chunk_crlf:
                if size - position < 2:
                    return data[position:]
                position += 2
                self.chunk_crlf = False
            else:
                end = data.find(b"\r\n", position)
                if end < 0:
                    if size - position > 1024:
                        raise _ProtocolError("chunk size line too long")
                    return data[position:]
                size_text = data[position:end].split(b";", 1)[0].strip()
                try:
                    chunk_size = int(size_text, 16)
                except ValueError:
                    raise _ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                position = end + 2
                if chunk_size == 0:
                    self._finish(keep=self.keep_alive)  # trailers (none in practice) are ignored
                    return b""
                self.remaining = chunk_size
        return b""

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
            raise _ProtocolError(f"bad status line {lines[0][:60]!r}")
        self.status = int(status_line[1])
        http10 = status_line[0] == b"HTTP/1.0"
        self.keep_alive = not http10
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            value = value.strip()
            if key == b"content-length":
                self.remaining = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif key == b"connection":
                self.keep_alive = value.lower() == b"keep-alive" if http10 else value.lower() != b"close"
        if self.chunked:
            self.remaining = 0

    def _body_bytes(self, data: bytes, at: float) -> None:
        """Body bytes of a 200 response are server-sent events; anything else is an error text."""
        if self.status != 200:
            self.error_body += data[: max(0, 500 - len(self.error_body))]
            return
        if self.event_pending:
            data = self.event_pending + data
            self.event_pending = b""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = data.find(b"\n\n", start)
            if end < 0:
                break
            self._event(data[start:end], at)
            start = end + 2
        if start < len(data):
            self.event_pending = data[start:]

    def _event(self, block: bytes, at: float) -> None:
        if block.startswith(b"data:") and b"\n" not in block:  # the usual one-line event
            self.current.on_event(block[5:].strip(), at)  # type: ignore[union-attr]
            return
        lines = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if lines:
            self.current.on_event(b"\n".join(lines), at)  # type: ignore[union-attr]

    def _finish(self, keep: bool) -> None:
        measurement = self.current
        if measurement is None or measurement.done:
            return
        if self.status != 200:
            text = bytes(self.error_body).decode("utf-8", "replace").strip()
            measurement.error = measurement.error or f"HTTP {self.status}: {_error_message(text)}"
        elif self.event_pending.strip():  # a last event without its blank line
            rest, self.event_pending = self.event_pending, b""
            self._event(rest.strip(), clock())
        self._complete(measurement, keep and self.keep_alive and not self.closed)

    def _fail(self, reason: str, keep: bool) -> None:
        measurement = self.current
        if measurement is None or measurement.done:
            return
        measurement.error = measurement.error or reason
        self._complete(measurement, keep)

    def _complete(self, measurement: _Measurement, keep: bool) -> None:
        measurement.done = True
        self.current = None
        if not keep and self.transport is not None:
            self.transport.abort()
        callback, self.on_finish = self.on_finish, None
        if callback is not None:
            callback(self, measurement, keep)


class _ProtocolError(Exception):
    pass


def _error_message(text: str) -> str:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:200]
        return str(error)[:200]
    return text[:200] or "(empty body)"


class _Pool:
    """Idle keep-alive connections to one endpoint."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Connection] = []
        self.all: set[_Connection] = set()
        self.ssl_context = ssl.create_default_context() if endpoint.scheme == "https" else None

    async def open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                lambda: _Connection(self), self.endpoint.host, self.endpoint.port, ssl=self.ssl_context,
                server_hostname=self.endpoint.host if self.ssl_context else None,
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

    def take_idle(self) -> _Connection | None:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                return connection
        return None

    def give_back(self, connection: _Connection) -> None:
        if not connection.closed:
            self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self.all.discard(connection)
        with contextlib.suppress(ValueError):
            self.idle.remove(connection)

    def close(self) -> None:
        for connection in list(self.all):
            if connection.transport is not None:
                connection.transport.abort()
        self.all.clear()
        self.idle.clear()


# ---------------------------------------------------------------------------------------------------
# The run


@dataclass
class RunResult:
    """What one pass over a workload produced."""

    records: list[RequestRecord]
    started_at_unix: float
    duration_s: float  # first send to last finish (wall)
    prewarmed_connections: int = 0

    @property
    def lateness_ms(self) -> list[float]:
        """Send lateness (actual minus scheduled send time) of every request, in ms."""
        return [(r.sent_at - r.scheduled_at) * 1000.0 for r in self.records]

    def lateness_summary(self) -> dict[str, float | None]:
        return lateness_summary(self.records)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.records if r.error is not None)


class JsonlWriter:
    """Appends one JSON line per record and flushes it at once (a crash loses nothing written)."""

    def __init__(self, stream: IO[str], extra: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self.extra = dict(extra or {})
        self.lines = 0

    def __call__(self, record: RequestRecord, details: dict[str, Any]) -> None:
        line = record.to_dict()
        line.update(details)
        line.update(self.extra)
        self.stream.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.stream.flush()
        self.lines += 1


OnRecord = Callable[[RequestRecord, dict[str, Any]], None]


def _request_bytes(endpoint: Endpoint, payload: Payload, api_key: str | None) -> bytes:
    host = endpoint.host if endpoint.port in (80, 443) else f"{endpoint.host}:{endpoint.port}"
    lines = [f"POST {endpoint.base_path}{COMPLETIONS_PATH} HTTP/1.1", f"host: {host}",
             f"content-length: {len(payload.body)}", "accept: text/event-stream"]
    lines += [f"{name}: {value}" for name, value in payload.headers]
    if api_key:
        lines.append(f"authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload.body


async def run_load(
    payloads: Sequence[Payload],
    url: str,
    *,
    timeout_s: float = 600.0,
    connect_timeout_s: float = 10.0,
    on_record: OnRecord | None = None,
    lead_in_s: float = 0.05,
    spin_s: float = 0.001,
    warm_horizon_s: float = 0.5,
    refill_horizon_s: float = 0.1,
    max_idle_connections: int = 1024,
    api_key: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Send ``payloads`` at ``t0 + spec.arrival_s`` and measure every stream.

    Connections are opened ahead of need: before the clock starts, one per request due in the first
    ``warm_horizon_s``; during the run a background task keeps as many idle connections as there are
    sends due within the next ``refill_horizon_s`` (servers close idle keep-alive connections after a
    few seconds, so opening them all up front would not help a long run; finished requests hand their
    connections back, so in a steady stream few new ones are needed). A send that finds no idle
    connection connects first, and its lateness shows it.

    ``on_record(record, details)`` gets each finished request at once (details: server-reported token
    counts, retries). ``on_progress(finished, total)`` is called only when no send is due within 20 ms.
    On cancellation (Ctrl-C) every request in flight is recorded with ``error="interrupted"`` before
    the cancellation propagates.
    """
    endpoint = Endpoint.parse(url)
    loop = asyncio.get_running_loop()
    pool = _Pool(endpoint, connect_timeout_s)
    ordered = sorted(payloads, key=lambda p: p.spec.arrival_s)
    arrivals = [p.spec.arrival_s for p in ordered]
    total = len(ordered)
    wires = [_request_bytes(endpoint, p, api_key) for p in ordered]
    prewarmed = await pool.add_idle(min(max_idle_connections, bisect.bisect_right(arrivals, warm_horizon_s) + 4))

    records: list[RequestRecord] = []
    in_flight: dict[int, tuple[_Measurement, asyncio.TimerHandle]] = {}
    connections: dict[int, _Connection] = {}
    retried: set[int] = set()
    all_done = asyncio.Event()
    progress = {"finished": 0, "next_index": 0, "next_send_at": math.inf, "last_end": 0.0}
    # A full garbage collection takes tens of milliseconds with big payloads in memory; do it now and
    # not in the middle of a burst (reference counting still frees everything during the run).
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    run_start = clock() + lead_in_s
    started_unix = time.time() + lead_in_s
    if total == 0:
        all_done.set()

    def finish(key: int) -> None:
        entry = in_flight.pop(key, None)
        if entry is None:
            return
        measurement, timer = entry
        timer.cancel()
        connections.pop(key, None)
        record = measurement.record(run_start)
        records.append(record)
        progress["finished"] += 1
        progress["last_end"] = max(progress["last_end"], clock())
        if on_record is not None:
            on_record(record, {"requested_output_tokens": measurement.payload.spec.output_tokens,
                               "server_prompt_tokens": measurement.usage_prompt_tokens,
                               "server_output_tokens": measurement.usage_completion_tokens,
                               "retried": key in retried})
        if on_progress is not None and progress["next_send_at"] - clock() > 0.02:
            on_progress(progress["finished"], total)
        if progress["finished"] == total:
            all_done.set()

    def on_timeout(key: int) -> None:
        entry = in_flight.get(key)
        if entry is None:
            return
        connection = connections.get(key)
        if connection is not None:
            connection.abort(f"timeout after {timeout_s:g} s")
        else:
            entry[0].error = entry[0].error or f"timeout after {timeout_s:g} s"
            finish(key)

    def on_connection_finish(key: int, reused: bool) -> Callable[[_Connection, _Measurement, bool], None]:
        def callback(connection: _Connection, measurement: _Measurement, keep: bool) -> None:
            if keep:
                pool.give_back(connection)
            stale = reused and not connection.received_any and measurement.first_token_at is None
            if stale and key not in retried and measurement.error and measurement.error.startswith("connection closed"):
                # The server closed an idle keep-alive connection just as we wrote to it: send again once.
                retried.add(key)
                measurement.error = None
                measurement.done = False
                connections.pop(key, None)
                spawn(connect_then_send(key, measurement))
                return
            finish(key)
        return callback

    def send_on(key: int, connection: _Connection, measurement: _Measurement, reused: bool) -> None:
        connections[key] = connection
        connection.uses += 1
        connection.send(measurement, wires[key], on_connection_finish(key, reused))

    async def connect_then_send(key: int, measurement: _Measurement) -> None:
        try:
            connection = await pool.open()
        except (OSError, TimeoutError) as exc:
            if measurement.sent_at is None:
                measurement.sent_at = clock()
            measurement.error = f"connect failed: {type(exc).__name__} {exc}".strip()
            finish(key)
            return
        if key not in in_flight:  # timed out while connecting
            connection.transport.abort()  # type: ignore[union-attr]
            return
        send_on(key, connection, measurement, reused=False)

    background: set[asyncio.Task[None]] = set()

    def spawn(coroutine: Any) -> None:
        task = loop.create_task(coroutine)
        background.add(task)
        task.add_done_callback(background.discard)

    async def keep_connections_ready() -> None:
        while progress["next_index"] < total:
            due = bisect.bisect_right(arrivals, clock() - run_start + refill_horizon_s) - progress["next_index"]
            missing = min(max_idle_connections, due + 4) - len(pool.idle)
            if missing > 0:
                await pool.add_idle(missing)
            await asyncio.sleep(0.05)

    spawn(keep_connections_ready())
    def send(key: int) -> None:
        payload = ordered[key]
        measurement = _Measurement(payload=payload, scheduled_at=payload.spec.arrival_s)
        in_flight[key] = (measurement, loop.call_later(timeout_s, on_timeout, key))
        progress["next_index"] = key + 1
        connection = pool.take_idle()
        if connection is not None:
            send_on(key, connection, measurement, reused=connection.uses > 0)
        else:
            spawn(connect_then_send(key, measurement))

    try:
        key = 0
        while key < total:
            target = run_start + arrivals[key]
            progress["next_send_at"] = target
            delay = target - clock()
            if delay > spin_s:
                await asyncio.sleep(delay - spin_s)
            while clock() < target:
                await asyncio.sleep(0)
            # Everything due by now goes out before yielding again: one event-loop pass may have taken
            # longer than the gap between sends, and a send must not wait for another pass.
            send(key)
            key += 1
            while key < total and run_start + arrivals[key] <= clock():
                send(key)
                key += 1
        progress["next_send_at"] = math.inf
        await all_done.wait()
    except asyncio.CancelledError:
        for key, (measurement, _) in list(in_flight.items()):
            measurement.error = measurement.error or "interrupted"
            finish(key)
        raise
    finally:
        if gc_was_enabled:
            gc.enable()
        for task in list(background):
            task.cancel()
        pool.close()
    sends = [r.sent_at for r in records]
    duration = (progress["last_end"] - run_start - min(sends)) if sends else 0.0
    records.sort(key=lambda r: (r.scheduled_at, r.request_id))
    return RunResult(records=records, started_at_unix=started_unix, duration_s=max(0.0, duration),
                     prewarmed_connections=prewarmed)
