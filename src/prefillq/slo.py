"""TTFT service-level objectives as operators state them (SPEC §6): ``200ms+0.1ms/token``.

    parse_ttft_slo("200ms+0.1ms/token")                 # every request: 200 ms + 0.1 ms per prompt token
    parse_ttft_slo("short=200ms+0.1ms/token,long=5s")   # one per class
    parse_ttft_slo("1s,long=5s")                        # a default, and an override for one class

A term is a base time, a per-token allowance, or both joined by ``+`` (either order); times take
``ms`` or ``s``. A class without its own term uses the unnamed one; with no unnamed term, requests of
an unnamed class have no SLO and are left out of goodput. Goodput itself is defined in
:func:`prefillq.metrics.ttft_goodput`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

CLASSES = ("short", "long")
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_TIME = re.compile(rf"^{_NUMBER}\s*(ms|s)$")
_PER_TOKEN = re.compile(rf"^{_NUMBER}\s*(ms|s)\s*/\s*(?:token|tok)$")
EXAMPLE = "200ms+0.1ms/token, or per class: short=200ms+0.1ms/token,long=5s"


class SloError(ValueError):
    """A TTFT SLO that cannot be read; the message names the bad part and shows the form."""


@dataclass(frozen=True)
class SloTerm:
    """TTFT limit = ``base_ms + per_token_ms * prompt_tokens``."""

    base_ms: float = 0.0
    per_token_ms: float = 0.0

    def limit_ms(self, prompt_tokens: int) -> float:
        return self.base_ms + self.per_token_ms * prompt_tokens

    def __str__(self) -> str:
        parts = []
        if self.base_ms or not self.per_token_ms:
            parts.append(f"{self.base_ms:g}ms")
        if self.per_token_ms:
            parts.append(f"{self.per_token_ms:g}ms/token")
        return "+".join(parts)


@dataclass(frozen=True)
class TtftSlo:
    """An SLO per request class; ``default`` covers the classes not named (None: they have none)."""

    default: SloTerm | None = None
    per_class: dict[str, SloTerm] = field(default_factory=dict)
    text: str = ""

    def term(self, klass: str) -> SloTerm | None:
        return self.per_class.get(klass, self.default)

    def __str__(self) -> str:
        return self.text or ",".join(([str(self.default)] if self.default else [])
                                     + [f"{k}={v}" for k, v in self.per_class.items()])


def _ms(number: str, unit: str) -> float:
    value = float(number) * (1000.0 if unit == "s" else 1.0)
    if not math.isfinite(value):
        raise SloError(f"TTFT SLO time {number}{unit} is not a finite number")
    return value


def _term(text: str, whole: str) -> SloTerm:
    base = per_token = None
    for part in (p.strip() for p in text.split("+")):
        if match := _TIME.match(part):
            if base is not None:
                raise SloError(f"TTFT SLO {whole!r}: two base times in {text!r}; expected e.g. {EXAMPLE}")
            base = _ms(*match.groups())
        elif match := _PER_TOKEN.match(part):
            if per_token is not None:
                raise SloError(f"TTFT SLO {whole!r}: two per-token allowances in {text!r}; expected e.g. {EXAMPLE}")
            per_token = _ms(*match.groups())
        else:
            raise SloError(f"TTFT SLO {whole!r}: cannot read {part!r} (a time like 200ms or 5s, or a per-token "
                           f"allowance like 0.1ms/token); expected e.g. {EXAMPLE}")
    term = SloTerm(base or 0.0, per_token or 0.0)
    if term.base_ms == 0 and term.per_token_ms == 0:
        raise SloError(f"TTFT SLO {whole!r}: {text!r} allows no time at all; expected e.g. {EXAMPLE}")
    return term


def parse_ttft_slo(text: str) -> TtftSlo:
    """Read an SLO as people state it; :class:`SloError` (a ValueError) names what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise SloError(f"empty TTFT SLO; expected e.g. {EXAMPLE}")
    default: SloTerm | None = None
    per_class: dict[str, SloTerm] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            raise SloError(f"TTFT SLO {text!r} has an empty part; expected e.g. {EXAMPLE}")
        if "=" in item:
            klass, _, term = (s.strip() for s in item.partition("="))
            if klass not in CLASSES:
                raise SloError(f"TTFT SLO {text!r}: unknown request class {klass!r}; valid classes: "
                               f"{', '.join(CLASSES)}")
            if klass in per_class:
                raise SloError(f"TTFT SLO {text!r} names class {klass!r} twice")
            per_class[klass] = _term(term, text)
        else:
            if default is not None:
                raise SloError(f"TTFT SLO {text!r} has two terms for every class; name a class "
                               f"(short=..., long=...) for the second")
            default = _term(item, text)
    return TtftSlo(default, per_class, text.strip())
