"""The named scenarios of the published evaluation, as seeded request schedules.

Every scenario is one generator with one parameter set (``scenarios.json``); only the defaults differ.
A scenario is an optional leading burst of long requests followed by a stream of requests whose
arrivals are constant-spaced (``uniform``), ``poisson`` or ``gamma`` (bursty, coefficient of variation
``gamma_cv``), a ``long_fraction`` of which are long.

Multi-turn sessions (``turns`` > 1): each stream arrival starts a session of ``turns`` requests,
``turn_gap_s`` apart; a turn's prompt is the previous turn's prompt, its answer (``output_tokens``) and
a new ``short_tokens`` message, so it extends the previous prompt. The first prompt is
``shared_prefix_tokens`` (one system prompt common to every session) plus ``short_tokens`` or
``long_tokens``; every turn of a session has the session's class. Such requests carry block hashes
(``RequestSpec.hash_ids``, one per ``hash_block_tokens`` tokens, as a Mooncake trace's ``hash_ids``):
equal ids for the shared prefix and for the part a turn repeats, which is what the simulated prefix
cache keys on (``params["prefix_hash_block_tokens"]`` says the block size).

Priority classes (``interactive_share`` > 0): that share of all requests, drawn by seed from the short
ones (a session's turns share its class), is *interactive* (``RequestSpec.priority`` 0) and every other
request *batch* (priority 1), as clients would send vLLM's request ``priority``.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any


class WorkloadError(ValueError):
    """Bad workload input: unknown scenario or parameter, or a malformed trace (names file and line)."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: when (seconds from the start of the run), how long, and its class.

    ``admission_priority`` is the router-side admission flag of SPEC §5 (lower is admitted first when
    a disaggregated router holds requests back). ``priority`` is the request's priority class as a
    client sends it to vLLM (the request body's ``priority``, lower first). It never sets the engine's
    internal inference priority by itself: only an engine in vLLM's ``priority`` scheduling mode honours
    it (the operator's declaration that request priorities are trusted, SPEC §4.1/§5).
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    klass: str  # "short" | "long"
    admission_priority: int = 0
    session: str | None = None  # a trace's session (or prefix hash): what a fleet's affinity router keys on
    hash_ids: tuple[int, ...] | None = None  # prefix block hashes (Mooncake ``hash_ids``): the prefix cache's keys
    priority: int = 0  # the client's priority class (vLLM's request ``priority``); see the docstring


@dataclass
class Workload:
    """A named list of requests, sorted by arrival, and the parameters that produced it."""

    name: str
    requests: list[RequestSpec]
    params: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Time of the last arrival."""
        return self.requests[-1].arrival_s if self.requests else 0.0


@cache
def _table() -> dict[str, Any]:
    text = resources.files("prefillq.workload").joinpath("scenarios.json").read_text(encoding="utf-8")
    return json.loads(text)


def _scenario_defaults() -> dict[str, dict[str, Any]]:
    table = _table()
    base = table["parameters"]
    result: dict[str, dict[str, Any]] = {}
    for name, values in table["scenarios"].items():
        merged = dict(base)
        merged.update(values)
        result[name] = merged
    return result


SCENARIOS: dict[str, dict[str, Any]] = _scenario_defaults()
"""Scenario name -> its default parameters (``description`` included)."""

ALIASES: dict[str, str] = dict(_table()["aliases"])
ARRIVALS = ("uniform", "poisson", "gamma")
LONG_PATTERNS = ("random", "every")


def scenario_names() -> list[str]:
    """The canonical scenario names (aliases excluded)."""
    return list(SCENARIOS)


def _check_params(name: str, params: dict[str, Any]) -> None:
    def positive_int(key: str, allow_zero: bool = False) -> None:
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
            bound = ">= 0" if allow_zero else ">= 1"
            raise WorkloadError(f"scenario {name!r}: {key} must be an int {bound}, got {value!r}")

    def number(key: str, low: float, *, strict: bool = False) -> None:
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise WorkloadError(f"scenario {name!r}: {key} must be a number, got {value!r}")
        if value < low or (strict and value == low):
            relation = ">" if strict else ">="
            raise WorkloadError(f"scenario {name!r}: {key} must be {relation} {low}, got {value!r}")

    for key in ("short_tokens", "long_tokens", "output_tokens", "turns", "hash_block_tokens"):
        positive_int(key)
    positive_int("leading_long", allow_zero=True)
    positive_int("shared_prefix_tokens", allow_zero=True)
    number("turn_gap_s", 0.0)
    if params["num_requests"] is not None:
        positive_int("num_requests", allow_zero=True)
    number("rate", 0.0, strict=True)
    number("duration_s", 0.0)
    number("leading_spacing_ms", 0.0)
    number("stream_start_ms", 0.0)
    number("gamma_cv", 0.0, strict=True)
    number("long_fraction", 0.0)
    number("interactive_share", 0.0)
    if params["interactive_share"] > 1 - params["long_fraction"] + 1e-12:
        raise WorkloadError(f"scenario {name!r}: interactive_share ({params['interactive_share']!r}) is drawn from "
                            f"the short requests and cannot exceed their share 1 - long_fraction "
                            f"({1 - params['long_fraction']:g})")
    if params["long_fraction"] > 1:
        fraction = params["long_fraction"]
        raise WorkloadError(f"scenario {name!r}: long_fraction must be in [0, 1], got {fraction!r}")
    if params["arrival"] not in ARRIVALS:
        raise WorkloadError(
            f"scenario {name!r}: arrival must be one of {', '.join(ARRIVALS)}, got {params['arrival']!r}"
        )
    if params["long_pattern"] not in LONG_PATTERNS:
        raise WorkloadError(
            f"scenario {name!r}: long_pattern must be one of {', '.join(LONG_PATTERNS)}, "
            f"got {params['long_pattern']!r}"
        )


def _stream_offsets(params: dict[str, Any], rng: random.Random) -> list[float]:
    """Arrival offsets (s) of the stream, relative to its start."""
    rate = float(params["rate"])
    count = params["num_requests"]
    arrival = params["arrival"]
    if arrival == "uniform":
        if count is None:
            count = round(rate * params["duration_s"])
        return [i / rate for i in range(count)]
    # Poisson: exponential gaps (gamma shape 1); gamma: shape k = 1/cv^2 keeps the mean gap at 1/rate.
    shape = 1.0 if arrival == "poisson" else 1.0 / float(params["gamma_cv"]) ** 2
    scale = 1.0 / (rate * shape)
    offsets: list[float] = []
    t = 0.0
    while True:
        if count is not None and len(offsets) >= count:
            break
        if count is None and t >= params["duration_s"]:
            break
        offsets.append(t)
        t += rng.gammavariate(shape, scale)
    if count is None:
        offsets = [x for x in offsets if x < params["duration_s"]]
    return offsets


def scenario(name: str, *, seed: int = 0, **overrides: Any) -> Workload:
    """Build a named scenario with its published defaults; any parameter can be overridden.

    Raises :class:`WorkloadError` for an unknown scenario or parameter, or a bad value.
    """
    canonical = ALIASES.get(name, name)
    if canonical not in SCENARIOS:
        import difflib

        valid = ", ".join([*SCENARIOS, *ALIASES])
        close = difflib.get_close_matches(str(name), [*SCENARIOS, *ALIASES], n=1, cutoff=0.6)
        hint = f" (did you mean {ALIASES.get(close[0], close[0])!r}?)" if close else ""
        raise WorkloadError(f"unknown scenario {name!r}{hint}; valid scenarios: {valid}")
    params = dict(SCENARIOS[canonical])
    for key, value in overrides.items():
        if key not in params or key == "description":
            valid = ", ".join(k for k in params if k != "description")
            raise WorkloadError(f"scenario {name!r}: unknown parameter {key!r}; valid parameters: {valid}")
        params[key] = value
    _check_params(canonical, params)
    rng = random.Random(seed)

    arrivals: list[tuple[float, bool]] = []  # (arrival_s, is_long)
    spacing_s = params["leading_spacing_ms"] / 1000.0
    arrivals.extend((i * spacing_s, True) for i in range(params["leading_long"]))
    stream_start_s = params["stream_start_ms"] / 1000.0
    offsets = _stream_offsets(params, rng)
    fraction = float(params["long_fraction"])
    if params["long_pattern"] == "every" and fraction > 0:
        period = max(1, round(1.0 / fraction))
        long_flags = [i % period == 0 for i in range(len(offsets))]
    else:
        long_flags = [rng.random() < fraction for _ in offsets]
    arrivals.extend((stream_start_s + off, is_long) for off, is_long in zip(offsets, long_flags, strict=True))
    classes = _priority_classes(params, [is_long for _, is_long in arrivals], seed)
    if params["turns"] > 1 or params["shared_prefix_tokens"]:
        requests = _sessions(canonical, params, arrivals, classes)
        params["prefix_hash_block_tokens"] = params["hash_block_tokens"]
    else:
        order = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])  # stable: the burst stays first
        requests = [
            RequestSpec(
                request_id=f"{canonical}-{index:06d}",
                arrival_s=round(arrivals[i][0], 9),
                prompt_tokens=params["long_tokens"] if arrivals[i][1] else params["short_tokens"],
                output_tokens=params["output_tokens"],
                klass="long" if arrivals[i][1] else "short",
                priority=classes[i],
            )
            for index, i in enumerate(order)
        ]
    params["seed"] = seed
    params["scenario"] = canonical
    if any(classes):
        params["priority_classes"] = sorted(set(classes))
    return Workload(name=canonical, requests=requests, params=params)


INTERACTIVE, BATCH = 0, 1  # the priority classes interactive_share assigns (vLLM's meaning: lower first)


def _priority_classes(params: dict[str, Any], long_flags: list[bool], seed: int) -> list[int]:
    """Each arrival's priority class: with ``interactive_share`` > 0, short requests are drawn (by seed) as
    interactive (priority 0) with the probability that makes that share of all requests interactive; every
    other request is batch (priority 1). Without it, every request has priority 0 (no classes)."""
    share = float(params["interactive_share"])
    if share <= 0:
        return [0] * len(long_flags)
    short_share = 1.0 - float(params["long_fraction"])
    chance = min(1.0, share / short_share) if short_share > 0 else 0.0
    rng = random.Random(f"interactive-{seed}")  # its own stream: the rest of the workload does not change
    return [BATCH if is_long or rng.random() >= chance else INTERACTIVE for is_long in long_flags]


def _sessions(name: str, params: dict[str, Any], starts: list[tuple[float, bool]],
              classes: list[int]) -> list[RequestSpec]:
    """Every turn of every session (one per entry of ``starts``), sorted by arrival, with block hashes."""
    block = params["hash_block_tokens"]
    shared = params["shared_prefix_tokens"]
    growth = params["output_tokens"] + params["short_tokens"]  # the answer and the next message
    shared_blocks = shared // block  # blocks wholly inside the shared prefix: one id for every session
    turns: list[tuple[float, int, int, bool]] = []  # (arrival, session, prompt tokens, long)
    for session, (start_s, is_long) in enumerate(starts):
        first = shared + (params["long_tokens"] if is_long else params["short_tokens"])
        turns.extend((start_s + k * params["turn_gap_s"], session, first + k * growth, is_long)
                     for k in range(params["turns"]))  # every turn has its session's class
    turns.sort(key=lambda item: item[0])  # stable: a session's turns stay in order at equal times
    return [
        RequestSpec(
            request_id=f"{name}-{index:06d}",
            arrival_s=round(arrival_s, 9),
            prompt_tokens=prompt,
            output_tokens=params["output_tokens"],
            klass="long" if is_long else "short",
            session=f"session-{session}",
            hash_ids=tuple(j if j < shared_blocks else ((session + 1) << 32) | j for j in range(-(-prompt // block))),
            priority=classes[session],
        )
        for index, (arrival_s, session, prompt, is_long) in enumerate(turns)
    ]
