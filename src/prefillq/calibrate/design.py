"""The calibration workload: which batches of prompts the engine is driven through, phase by phase.

A phase is a set of requests submitted together and run to completion. The design covers prefill-only
chunks of many sizes, chunked long prompts, small chunks on top of deep prefix-cached contexts,
several chunks in one step, and decode batches of many sizes and context lengths. Pure Python: the
probe (:mod:`prefillq.calibrate.probe`) is what runs it through vLLM.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

Phase = list[tuple[list[int], int]]  # requests submitted together: (prompt token ids, output tokens)

DEFAULT_VOCAB_SIZE = 2048


def design_phases(*, budget: int = 1024, max_model_len: int = 8192, vocab_size: int = DEFAULT_VOCAB_SIZE,
                  seed: int = 0) -> tuple[list[Phase], int]:
    """One round of the calibration workload, and how many leading phases are warm-up (not fitted).

    Prompts are random token ids (from 3 up; ids 0-2 are the tiny model's special tokens), fresh for
    every request so prefix caching hits only where a phase reuses a prefix on purpose. Rounds with
    different seeds schedule exactly the same batches (vLLM's scheduling depends on lengths only).
    """
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab_size) for _ in range(n)]

    longest = max_model_len - 64
    warmup: list[Phase] = [[(tokens(budget), 4), (tokens(64), 4)], [(tokens(256), 8)]]
    phases: list[Phase] = []
    # One prefill chunk alone, at context 0.
    for chunk in (16, 32, 64, 128, 256, 384, 512, 768, budget):
        phases.append([(tokens(min(chunk, budget)), 1)])
    # Several chunks in one step.
    phases.append([(tokens(budget // 4), 1), (tokens(budget // 4), 1), (tokens(budget // 3), 1)])
    phases.append([(tokens(32), 1) for _ in range(8)])
    # Long prompts run as budget-sized chunks at growing contexts.
    for prompt in (2 * budget, 4 * budget, 6 * budget, longest):
        phases.append([(tokens(min(prompt, longest)), 1)])
    # Small chunks on top of a deep prefix-cached context.
    for depth in (budget, 2 * budget, 4 * budget, 6 * budget):
        if depth + budget > longest:
            continue
        prefix = tokens(depth)
        phases.append([(prefix, 1)])
        for chunk in (32, 128, budget // 2):
            phases.append([(prefix + tokens(chunk), 1)])
    # Decode batches: (sequences, prompt length, output tokens).
    for sequences, prompt, output in ((1, 16, 48), (4, 16, 32), (16, 16, 32), (64, 16, 24), (128, 16, 16),
                                      (1, budget, 32), (8, budget, 32), (32, budget // 2, 24),
                                      (1, 4 * budget, 32), (4, 4 * budget, 24), (2, longest - 64, 24)):
        phases.append([(tokens(min(prompt, longest - output)), output) for _ in range(sequences)])
    return warmup + phases, len(warmup)


def model_vocab_size(model: str) -> int:
    """The vocabulary size in a local model folder's ``config.json`` (the tiny model's 2048 otherwise)."""
    config_file = Path(model) / "config.json"
    if config_file.exists():
        return int(json.loads(config_file.read_text()).get("vocab_size", DEFAULT_VOCAB_SIZE))
    return DEFAULT_VOCAB_SIZE


def design_rounds(*, rounds: int, budget: int = 1024, max_model_len: int = 8192,
                  vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0) -> tuple[list[Phase], int]:
    """``rounds`` rounds of the design back to back (round ``i`` with seed ``seed + i``), warm-up once.

    Returns the phases and how many leading phases are warm-up.
    """
    phases: list[Phase] = []
    warmup = 0
    for round_index in range(rounds):
        round_phases, round_warmup = design_phases(budget=budget, max_model_len=max_model_len,
                                                   vocab_size=vocab_size, seed=seed + round_index)
        if round_index == 0:
            phases += round_phases
            warmup = round_warmup
        else:
            phases += round_phases[round_warmup:]
    return phases, warmup
