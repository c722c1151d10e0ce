"""What one streamed completion measures: server-sent events in, a :class:`RequestRecord` out.

:class:`EventBuffer` cuts a response body into events (``data:`` lines up to a blank line) as the
bytes arrive; :class:`Measurement` stamps each token event with the time its bytes were read and
turns the stamps into the project's single definition of TTFT/E2E/ITL.

A chunk may carry several tokens (vLLM coalesces tokens into one event when its front end lags), so
tokens are not counted by events, but as ``vllm bench serve`` does: the output count is the server's
``usage.completion_tokens``, and TPOT divides by it. ITL is one gap per chunk (vLLM's definition too);
with ``stream_options.continuous_usage_stats`` (which we ask for) every chunk also carries the running
count, so the tokens each gap delivered are known (``chunk_tokens``). Only a server that reports no usage
at all falls back to one token per chunk.

Two definitions of the clock (``measure``):

* ``prefillq`` (the default): from the moment the request's bytes are written to an already open
  keep-alive connection to the moment the bytes carrying a token were read (before any parsing);
* ``vllm-bench``: as ``vllm bench serve`` times it: from the moment the request is due (before a
  connection is taken, or opened when none is idle) to the moment the event carrying the token has
  been parsed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefillq.bench.payload import Payload
from prefillq.metrics import RequestRecord

MEASURES = ("prefillq", "vllm-bench")


class EventBuffer:
    """Splits server-sent-event bytes into the ``data`` of each event, across reads."""

    def __init__(self, on_event: Callable[[bytes, float], None]) -> None:
        self.on_event = on_event
        self.pending = b""

    def feed(self, data: bytes, at: float) -> None:
        """Body bytes read at ``at``: every event they complete goes to ``on_event``."""
        if self.pending:
            data = self.pending + data
            self.pending = b""
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
            self.pending = data[start:]

    def flush(self, at: float) -> None:
        """The body ended: a last event without its blank line still counts."""
        if self.pending.strip():
            rest, self.pending = self.pending, b""
            self._event(rest.strip(), at)

    def _event(self, block: bytes, at: float) -> None:
        if block.startswith(b"data:") and b"\n" not in block:  # the usual one-line event
            self.on_event(block[5:].strip(), at)
            return
        lines = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if lines:
            self.on_event(b"\n".join(lines), at)


_TOTAL_KEY = b'"completion_tokens":'


def _running_total(data: bytes) -> int | None:
    """``usage.completion_tokens`` of a compact event, read without parsing the JSON (None: not found)."""
    start = data.find(_TOTAL_KEY)
    if start < 0:
        return None
    start += len(_TOTAL_KEY)
    end = start
    while end < len(data) and 48 <= data[end] <= 57:  # ASCII digits
        end += 1
    return int(data[start:end]) if end > start else None


@dataclass
class Measurement:
    """Timestamps of one streamed response, turned into a record by :meth:`record`."""

    payload: Payload
    scheduled_at: float  # from run start
    sent_at: float | None = None  # absolute clock(): the request's bytes were written
    due_at: float | None = None  # absolute clock(): the pacing loop handed the request over (vllm-bench origin)
    measure: str = "prefillq"  # or "vllm-bench": which clock the record uses (see the module docstring)
    stamp: Callable[[], float] = time.perf_counter  # vllm-bench: the clock read after an event is parsed
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    token_events: int = 0  # events (chunks) that carried output: one or several tokens each
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each chunk carried (running usage deltas)
    chunks_counted: bool = True  # every chunk came with the server's running token count
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    error: str | None = None
    done: bool = False

    def on_event(self, data: bytes, at: float) -> None:
        """One server-sent event ``data:`` payload, received at ``at``."""
        if data == b"[DONE]":
            return
        vllm_bench = self.measure == "vllm-bench"
        if not vllm_bench and b'"choices":[{' in data and b'"error"' not in data:
            # Fast path: a compact token event needs no parsing, at most its running token count.
            if b'"usage":{' not in data:
                self._token(at)
                return
            total = _running_total(data)
            if total is not None:
                self._token(at, total - (self.usage_completion_tokens or 0))
                self.usage_completion_tokens = total
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
        total = None
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                total = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt_tokens = usage["prompt_tokens"]
        if event.get("choices"):
            # With continuous usage stats (vLLM) a chunk's tokens are the growth of the running total.
            self._token(self.stamp() if vllm_bench else at,
                        None if total is None else total - (self.usage_completion_tokens or 0))
        if total is not None:
            self.usage_completion_tokens = total

    def _token(self, at: float, tokens: int | None = None) -> None:
        """A chunk carrying output arrived at ``at``: ``tokens`` of them, when the server said how many."""
        self.token_events += 1
        if tokens is None:
            self.chunks_counted = False
        else:
            self.chunk_tokens.append(tokens)
        if self.first_token_at is None:
            self.first_token_at = at
        else:
            self.gaps.append(at - self.last_token_at)  # type: ignore[operator]
        self.last_token_at = at

    def record(self, run_start: float) -> RequestRecord:
        """The request's record, times relative to ``run_start`` (an absolute clock() value)."""
        spec = self.payload.spec
        sent = self.sent_at if self.sent_at is not None else run_start + self.scheduled_at
        if self.measure == "vllm-bench" and self.due_at is not None:
            sent = self.due_at
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
