"""The load generator: sends each request at its scheduled absolute time and measures its stream.

Why our own thin layer over h11 rather than a general-purpose HTTP client: the measured path must add
as little and as predictable work as possible between "the schedule says now" and "the bytes are on
the socket", and it must timestamp every streamed token when the bytes arrive. So:

* connections are opened *before* the run (``prewarm``), and a send is one ``transport.write`` of
  a request encoded ahead of time, done inline in the pacing loop;
* pacing targets absolute times ``t0 + arrival_s`` (never relative sleeps, which accumulate drift):
  a coarse ``asyncio.sleep`` to ``spin_s`` (1 ms) before the target (epoll rounds timeouts up to whole
  milliseconds, so this wakes at most ~1 ms later, i.e. by the target), then a spin that keeps serving
  other sockets (``sleep(0)``) until the last ``busy_s`` (0.1 ms), which it busy-waits (not when sends
  are under 1 ms apart: there the CPU is better spent on the sockets);
* each read is stamped when it arrives, then framed by h11 (:mod:`prefillq.bench.connection`) and
  cut into server-sent events (:mod:`prefillq.bench.stream`); every event carries its read's stamp.
  A read that arrives within ``guard_s`` (2 ms) of the next send (when that send comes at least 1 ms
  after the one before it), while fewer than 32 wait, is only stamped and queued (a
  :class:`~prefillq.bench.connection.ReadBacklog`); the pacing loop parses
  queued reads, oldest first, while one more fits before the next send (twice the measured average
  cost of a parse), and all of them once the last request is sent. So the work of a burst of streamed
  tokens lands between sends, not on them, and the records and stamps are the same as when every read
  is parsed at once. A send that finds no idle connection first parses held reads (up to 1 ms) to
  free one, which is cheaper than connecting. A read held longer than ``max_hold_s`` (20 ms) is parsed
  even when that makes a send late: a client that cannot keep up shows it in its lateness rather than
  in its memory, and a client already more than ``guard_s`` behind its schedule holds nothing (it
  parses as reads come, as without a backlog). The ``vllm-bench`` clock stamps events when parsed, so
  it parses at once.

Every request ends as one :class:`~prefillq.metrics.RequestRecord` (the project's single definition
of TTFT/E2E/ITL), handed to ``on_record`` as soon as it finishes: the JSONL writer flushes it at once,
so an interrupted run loses nothing it had measured. HTTP errors, timeouts and broken streams become
records with ``error`` set, never exceptions.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import gc
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from prefillq.bench.analysis import lateness_summary
from prefillq.bench.connection import Connection, Pool, ReadBacklog, Wire, clock, encode_request
from prefillq.bench.payload import Payload, PayloadOptions, prompt_text
from prefillq.bench.stream import MEASURES, Measurement
from prefillq.metrics import RequestRecord
from prefillq.workload import RequestSpec

COMPLETIONS_PATH = "/v1/completions"


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


def request_wire(endpoint: Endpoint, payload: Payload, api_key: str | None) -> Wire:
    """The ``POST /v1/completions`` of ``payload``, encoded before the run."""
    host = endpoint.host if endpoint.port in (80, 443) else f"{endpoint.host}:{endpoint.port}"
    headers = [("host", host), ("content-length", str(len(payload.body))), ("accept", "text/event-stream"),
               *payload.headers]
    if api_key:
        headers.append(("authorization", f"Bearer {api_key}"))
    return encode_request("POST", f"{endpoint.base_path}{COMPLETIONS_PATH}", headers, payload.body)


class _LoadRun:
    """One pass over a workload: what the pacing loop and the connections' callbacks share."""

    def __init__(self, payloads: Sequence[Payload], endpoint: Endpoint, *, timeout_s: float,
                 connect_timeout_s: float, on_record: OnRecord | None, refill_horizon_s: float,
                 max_idle_connections: int, api_key: str | None,
                 on_progress: Callable[[int, int], None] | None, measure: str = "prefillq",
                 guard_s: float = 0.002) -> None:
        self.loop = asyncio.get_running_loop()
        self.backlog = ReadBacklog(guard_s) if measure == "prefillq" and guard_s > 0 else None
        self.pool = Pool(endpoint.scheme, endpoint.host, endpoint.port, connect_timeout_s, self.backlog)
        self.ordered = sorted(payloads, key=lambda p: p.spec.arrival_s)
        self.arrivals = [p.spec.arrival_s for p in self.ordered]
        self.total = len(self.ordered)
        self.wires = [request_wire(endpoint, p, api_key) for p in self.ordered]
        self.timeout_s = timeout_s
        self.on_record = on_record
        self.on_progress = on_progress
        self.refill_horizon_s = refill_horizon_s
        self.max_idle_connections = max_idle_connections
        self.measure = measure
        self.records: list[RequestRecord] = []
        self.in_flight: dict[int, tuple[Measurement, asyncio.TimerHandle]] = {}
        self.connections: dict[int, Connection] = {}
        self.retried: set[int] = set()
        self.all_done = asyncio.Event()
        self.background: set[asyncio.Task[None]] = set()
        self.finished = 0
        self.next_index = 0
        self.next_send_at = math.inf
        self.last_end = 0.0
        self.run_start = 0.0

    # a request ends
    def finish(self, key: int) -> None:
        entry = self.in_flight.pop(key, None)
        if entry is None:
            return
        measurement, timer = entry
        timer.cancel()
        self.connections.pop(key, None)
        record = measurement.record(self.run_start)
        self.records.append(record)
        self.finished += 1
        self.last_end = max(self.last_end, clock())
        if self.on_record is not None:
            self.on_record(record, {"requested_output_tokens": measurement.payload.spec.output_tokens,
                                    "server_prompt_tokens": measurement.usage_prompt_tokens,
                                    "server_output_tokens": measurement.usage_completion_tokens,
                                    "chunk_tokens": (measurement.chunk_tokens if measurement.chunks_counted
                                                     and record.ok else None),
                                    "retried": key in self.retried,
                                    "send_after_due_s": (measurement.sent_at - measurement.due_at
                                                         if measurement.sent_at is not None
                                                         and measurement.due_at is not None else None)})
        if self.on_progress is not None and self.next_send_at - clock() > 0.02:
            self.on_progress(self.finished, self.total)
        if self.finished == self.total:
            self.all_done.set()

    def on_timeout(self, key: int) -> None:
        entry = self.in_flight.get(key)
        if entry is None:
            return
        connection = self.connections.get(key)
        if connection is not None and connection.held:  # its answer may be waiting: read it first
            self.backlog.drain()  # type: ignore[union-attr]
            if key not in self.in_flight:
                return
        if connection is not None:
            connection.abort(f"timeout after {self.timeout_s:g} s")
        else:
            entry[0].error = entry[0].error or f"timeout after {self.timeout_s:g} s"
            self.finish(key)

    def connection_finished(self, key: int, reused: bool, connection: Connection, measurement: Measurement,
                            keep: bool) -> None:
        if keep:
            self.pool.give_back(connection)
        stale = reused and not connection.received_any and measurement.first_token_at is None
        if stale and key not in self.retried and (measurement.error or "").startswith("connection closed"):
            # The server closed an idle keep-alive connection just as we wrote to it: send again once.
            self.retried.add(key)
            measurement.error = None
            measurement.done = False
            self.connections.pop(key, None)
            self.spawn(self.connect_then_send(key, measurement))
            return
        self.finish(key)

    # sending
    def send_on(self, key: int, connection: Connection, measurement: Measurement, reused: bool) -> None:
        self.connections[key] = connection
        connection.uses += 1
        connection.send(measurement, self.wires[key], functools.partial(self.connection_finished, key, reused))

    async def connect_then_send(self, key: int, measurement: Measurement) -> None:
        try:
            connection = await self.pool.open()
        except (OSError, TimeoutError) as exc:
            if measurement.sent_at is None:
                measurement.sent_at = clock()
            measurement.error = f"connect failed: {type(exc).__name__} {exc}".strip()
            self.finish(key)
            return
        if key not in self.in_flight:  # timed out while connecting
            connection.transport.abort()  # type: ignore[union-attr]
            return
        self.send_on(key, connection, measurement, reused=False)

    def send(self, key: int) -> None:
        payload = self.ordered[key]
        measurement = Measurement(payload=payload, scheduled_at=payload.spec.arrival_s, due_at=clock(),
                                  measure=self.measure)
        self.in_flight[key] = (measurement, self.loop.call_later(self.timeout_s, self.on_timeout, key))
        self.next_index = key + 1
        connection = self.pool.take_idle()
        backlog = self.backlog
        if connection is None and backlog is not None and backlog.items:
            # a held read may finish a request and free its connection: cheaper than connecting
            give_up_at = clock() + 0.001
            while connection is None and backlog.items and clock() < give_up_at:
                backlog.parse_one()
                connection = self.pool.take_idle()
        if connection is not None:
            self.send_on(key, connection, measurement, reused=connection.uses > 0)
        else:
            self.spawn(self.connect_then_send(key, measurement))

    def spawn(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def keep_connections_ready(self) -> None:
        while self.next_index < self.total:
            due = bisect.bisect_right(self.arrivals, clock() - self.run_start + self.refill_horizon_s) - self.next_index
            missing = min(self.max_idle_connections, due + 4) - len(self.pool.idle)
            if missing > 0:
                await self.pool.add_idle(missing)
            await asyncio.sleep(0.05)

    # the run
    async def pace(self, spin_s: float, busy_s: float = 0.0001, max_hold_s: float = 0.02,
                   hold_gap_s: float = 0.001) -> None:
        """Send every request at ``run_start + arrival_s``, then wait for the last to finish.

        Between sends: parse held reads while one more fits before the next send (and any read held
        over ``max_hold_s``), sleep to ``spin_s`` before it, serve the sockets until ``busy_s`` before
        it, and busy-wait the rest. Reads are held only for a send at least ``hold_gap_s`` after the
        one before it (denser sends leave no room to move parsing into).
        """
        if self.total == 0:
            self.all_done.set()
        if self.measure == "prefillq":  # vllm-bench: connections open on demand, as aiohttp's pool does
            self.spawn(self.keep_connections_ready())
        arrivals, run_start, total, backlog = self.arrivals, self.run_start, self.total, self.backlog
        items = backlog.items if backlog is not None else ()
        backlog_guard = backlog.guard_s if backlog is not None else math.inf
        key = 0
        while key < total:
            target = run_start + arrivals[key]
            self.next_send_at = target
            # Sends closer together than hold_gap_s leave no room to move parsing into, nor CPU to spend
            # busy-waiting: hold nothing and serve the sockets up to the send.
            dense = key > 0 and arrivals[key] - arrivals[key - 1] < hold_gap_s
            busy = 0.0 if dense else busy_s
            if backlog is not None:
                backlog.next_send_at = math.inf if dense else target
            now = clock()
            while items and (backlog.fits_before(now, target) or now - items[0][1] > max_hold_s):  # type: ignore[union-attr]
                backlog.parse_one()  # type: ignore[union-attr]
                now = clock()
            if target - now > spin_s:
                await asyncio.sleep(target - now - spin_s)
            yielded = False
            while (now := clock()) < target:
                if items and (backlog.fits_before(now, target) or now - items[0][1] > max_hold_s):  # type: ignore[union-attr]
                    backlog.parse_one()  # type: ignore[union-attr]
                elif target - now > busy:
                    await asyncio.sleep(0)
                    yielded = True
            # Everything due by now goes out before yielding again: one event-loop pass may have taken
            # longer than the gap between sends, and a send must not wait for another pass.
            behind = now - target > backlog_guard
            self.send(key)
            key += 1
            while key < total and run_start + arrivals[key] <= clock():
                self.send(key)
                key += 1
            if behind and items:  # holding cannot keep time now: parse as it comes, as without a backlog
                backlog.drain()  # type: ignore[union-attr]
            if not yielded:  # take in what arrived (held reads cost a stamp each) before the next
                await asyncio.sleep(0)
        self.next_send_at = math.inf
        if backlog is not None:
            backlog.next_send_at = math.inf
            backlog.drain()
        await self.all_done.wait()

    def interrupt(self) -> None:
        """Record every request in flight as interrupted (after parsing what had arrived)."""
        if self.backlog is not None:
            self.backlog.next_send_at = math.inf
            self.backlog.drain()
        for key, (measurement, _) in list(self.in_flight.items()):
            measurement.error = measurement.error or "interrupted"
            self.finish(key)

    def close(self) -> None:
        for task in list(self.background):
            task.cancel()
        self.pool.close()


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
    measure: str = "prefillq",
    guard_s: float = 0.002,
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

    ``measure="vllm-bench"`` times every request as ``vllm bench serve`` does (see
    :mod:`prefillq.bench.stream`): from the moment it is due, with no connection opened ahead (a
    request that finds no idle keep-alive connection connects on its own clock, as with aiohttp), to
    the moment each event is parsed.

    ``guard_s``: a read arriving this close before a send waits to be parsed until after it (its
    stamp is taken on arrival either way); 0 parses every read at once.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    run = _LoadRun(payloads, Endpoint.parse(url), timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                   on_record=on_record, refill_horizon_s=refill_horizon_s, max_idle_connections=max_idle_connections,
                   api_key=api_key, on_progress=on_progress, measure=measure, guard_s=guard_s)
    warm = bisect.bisect_right(run.arrivals, warm_horizon_s) + 4 if measure == "prefillq" else 0
    prewarmed = await run.pool.add_idle(min(max_idle_connections, warm))
    # A full garbage collection takes tens of milliseconds with big payloads in memory; do it now and
    # not in the middle of a burst (reference counting still frees everything during the run).
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    run.run_start = clock() + lead_in_s
    started_unix = time.time() + lead_in_s
    try:
        await run.pace(spin_s)
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C, or SIGTERM raised in this very frame
        run.interrupt()
        raise
    finally:
        if gc_was_enabled:
            gc.enable()
        run.close()
    records = run.records
    sends = [r.sent_at for r in records]
    duration = (run.last_end - run.run_start - min(sends)) if sends else 0.0
    records.sort(key=lambda r: (r.scheduled_at, r.request_id))
    return RunResult(records=records, started_at_unix=started_unix, duration_s=max(0.0, duration),
                     prewarmed_connections=prewarmed)
