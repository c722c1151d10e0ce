"""Small trace files written on the fly for the tests of trace splitting and reading."""

from __future__ import annotations

import json
from pathlib import Path

AZURE_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def two_lengths_trace(path: Path, short: int = 70, long: int = 30) -> Path:
    """An Azure-format trace of ``short`` prompts of 100 tokens and ``long`` of 5000, interleaved, one
    request every 0.1 s (8 output tokens each)."""
    lengths = [100] * short + [5000] * long
    count = len(lengths)
    lengths = [lengths[i] for i in sorted(range(count), key=lambda i: (i * 7) % count)]
    path.write_text(AZURE_HEADER + "".join(f"{i * 0.1:.1f},{n},8\n" for i, n in enumerate(lengths)))
    return path


def bench_records_trace(path: Path, ids: list[str | None]) -> Path:
    """A ``prefillq bench`` per-request JSONL, one record per entry of ``ids`` (None: no ``request_id``),
    scheduled 0.1 s apart, prompts of 100 tokens."""
    lines = []
    for i, request_id in enumerate(ids):
        record = {"scheduled_at": round(i * 0.1, 3), "prompt_tokens": 100, "output_tokens": 8}
        if request_id is not None:
            record["request_id"] = request_id
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))
    return path
