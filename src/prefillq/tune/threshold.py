"""Step 1 of the recipe: the short/long ``threshold`` and how it splits the trace into lanes.

The threshold itself is :func:`prefillq.workload.split.split_threshold` (KDE valley, else the percentile
fallback), the same split ``prefillq compare`` uses for traces; this module adds the lane shares and the
tuner's error type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefillq.metrics import median
from prefillq.workload.split import ThresholdChoice, split_threshold


class TuneError(ValueError):
    """Input the tuner cannot work with (the message says what and where)."""


@dataclass
class LaneShares:
    """How a threshold splits the trace: share of requests and of prefill tokens in each lane."""

    threshold: int
    short_requests: int
    long_requests: int
    short_request_share: float
    long_request_share: float
    short_token_share: float
    long_token_share: float
    short_prompt_p50: float | None
    long_prompt_p50: float | None


def choose_threshold(prompt_lengths: Sequence[int]) -> ThresholdChoice:
    """Pick the short/long threshold for ``prompt_lengths`` (SPEC §3.5); bad input is a :class:`TuneError`."""
    return split_threshold(prompt_lengths, error=TuneError)


def lane_shares(prompt_lengths: Sequence[int], threshold: int) -> LaneShares:
    """Share of requests and of prefill tokens on each side of ``threshold`` (``<= threshold`` is short)."""
    import numpy as np

    lengths = np.asarray(prompt_lengths, dtype=float)
    if lengths.size == 0:
        raise TuneError("no prompt lengths")
    short = lengths <= threshold
    total_tokens = float(lengths.sum())
    short_tokens = float(lengths[short].sum())
    n_short = int(short.sum())
    n_long = int(lengths.size - n_short)
    return LaneShares(
        threshold=int(threshold),
        short_requests=n_short,
        long_requests=n_long,
        short_request_share=n_short / lengths.size,
        long_request_share=n_long / lengths.size,
        short_token_share=short_tokens / total_tokens,
        long_token_share=1.0 - short_tokens / total_tokens,
        short_prompt_p50=median(lengths[short]) if n_short else None,
        long_prompt_p50=median(lengths[~short]) if n_long else None,
    )
