"""Request bodies for ``POST /v1/completions``, built once before a run so sending costs only a write.

Prompts are lists of token ids by default: the server then sees exactly ``prompt_tokens`` tokens with
no tokenizer in the way. Ids are drawn per request from a generator seeded by ``(payload_seed,
request_id)``, so every policy of a round gets byte-identical bodies while different rounds get
different ids (a server's prefix cache cannot turn round 2 into a replay of round 1). Output length is
pinned with ``max_tokens`` plus ``ignore_eos``.

SPEC §5: a client can never set the engine's internal priority. A ``priority`` key in user-supplied
extra body fields is dropped (and reported) unless the operator explicitly asks to forward vLLM's
request priority with ``forward_priority=True``.

A request's own priority class (``RequestSpec.priority``, a trace's ``priority`` field) is what its client
sent: a body carries it as vLLM's request ``priority`` whenever it is not 0, overriding an extra-body
value. vLLM honours it only when the server runs ``--scheduling-policy priority`` (the operator's
declaration that request priorities are trusted); with FCFS the server ignores it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefillq.workload import RequestSpec

# Reserved keys the builder owns; extra body fields may not override them.
_OWNED_KEYS = ("model", "prompt", "max_tokens", "stream", "stream_options")

# Common English words that byte-level BPE tokenizers keep as one token after a space; text prompts
# are built from them when the server needs text (``--text-prompts``).
_WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his",
    "her", "they", "have", "this", "are", "be", "not", "but", "had", "which", "one", "all", "were", "when",
    "we", "there", "can", "an", "been", "has", "more", "who", "will", "would", "their", "if", "so", "no", "out",
    "up", "about", "what", "time", "into", "only", "some", "could", "them", "see", "other", "than", "then",
    "now", "look", "come", "its", "over", "think", "also", "back", "after", "use", "two", "how", "our", "work",
    "first", "well", "way", "even", "new", "want", "because", "any", "these", "give", "day", "most", "us",
)


@dataclass(frozen=True)
class PayloadOptions:
    """What goes into every request body."""

    model: str
    vocab_size: int = 1000  # token ids are drawn from [min_token_id, vocab_size)
    min_token_id: int = 0
    text_prompts: bool = False
    ignore_eos: bool = True
    include_usage: bool = True
    temperature: float | None = 0.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    forward_priority: bool = False  # operator opt-in: pass a `priority` extra-body field through to vLLM

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        if not 0 <= self.min_token_id < self.vocab_size:
            raise ValueError(f"need 0 <= min_token_id < vocab_size, got {self.min_token_id} and {self.vocab_size}")
        clash = [key for key in self.extra_body if key in _OWNED_KEYS]
        if clash:
            raise ValueError(f"extra body may not set {', '.join(clash)} (the load generator owns them)")


@dataclass(frozen=True)
class Payload:
    """One prepared request: the encoded body and headers to send for one :class:`RequestSpec`."""

    spec: RequestSpec
    body: bytes
    headers: tuple[tuple[str, str], ...]


def dropped_extra_keys(options: PayloadOptions) -> list[str]:
    """Extra-body keys the builder refuses to forward (SPEC §5): today only ``priority`` without opt-in."""
    if "priority" in options.extra_body and not options.forward_priority:
        return ["priority"]
    return []


def prompt_token_ids(spec: RequestSpec, options: PayloadOptions, payload_seed: int) -> list[int]:
    """The prompt of ``spec`` as token ids: deterministic in (payload_seed, request_id)."""
    rng = np.random.default_rng([payload_seed & 0xFFFFFFFF, zlib.crc32(spec.request_id.encode())])
    return rng.integers(options.min_token_id, options.vocab_size, size=spec.prompt_tokens).tolist()


def prompt_text(spec: RequestSpec, payload_seed: int, words: int | None = None) -> str:
    """A text prompt of about ``spec.prompt_tokens`` tokens (one common word per token), unique per request."""
    rng = np.random.default_rng([payload_seed & 0xFFFFFFFF, zlib.crc32(spec.request_id.encode())])
    count = spec.prompt_tokens if words is None else words
    picks = rng.integers(0, len(_WORDS), size=max(1, count))
    return " ".join(_WORDS[i] for i in picks)


def build_body(spec: RequestSpec, options: PayloadOptions, payload_seed: int, *, stream: bool = True,
               text: str | None = None) -> dict[str, Any]:
    """The JSON body for one request (a dict; see :func:`build_payload` for the encoded form)."""
    body: dict[str, Any] = {}
    dropped = set(dropped_extra_keys(options))
    for key, value in options.extra_body.items():
        if key not in dropped:
            body[key] = value
    body["model"] = options.model
    if options.text_prompts:
        body["prompt"] = text if text is not None else prompt_text(spec, payload_seed)
    else:
        body["prompt"] = prompt_token_ids(spec, options, payload_seed)
    if spec.priority:  # the request's class, as its client sent it (vLLM's request priority)
        body["priority"] = spec.priority
    body["max_tokens"] = spec.output_tokens
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.temperature is not None and "temperature" not in body:
        body["temperature"] = options.temperature
    body["stream"] = stream
    if stream and options.include_usage:
        # continuous_usage_stats: every chunk carries the running token count (a chunk may hold several)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def build_payload(spec: RequestSpec, options: PayloadOptions, payload_seed: int, *,
                  text: str | None = None) -> Payload:
    """The encoded streaming request for ``spec``; the request id travels in ``X-Request-Id``."""
    body = build_body(spec, options, payload_seed, text=text)
    encoded = json.dumps(body, separators=(",", ":")).encode()
    headers = (("content-type", "application/json"), ("x-request-id", spec.request_id))
    return Payload(spec=spec, body=encoded, headers=headers)
