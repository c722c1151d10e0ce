"""Small trace files written on the fly for the tests of trace splitting and reading."""

from __future__ import annotations

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
