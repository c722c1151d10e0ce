"""The one small set of value checks used by config, cost-model profiles, PD settings and trace rows.

Each check raises the caller's own error class (``ConfigError``, ``ProfileError``, ``WorkloadError``, ...)
with a message that names the value (``name`` may carry its place, e.g. ``"trace.csv line 4: prompt_tokens"``)
and says what was expected. Booleans are never accepted as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["check_bool", "check_choice", "check_int", "check_number", "close_key", "reject_unknown_keys",
           "settings_from"]


def _bound_text(kind: str, minimum: float, strict: bool) -> str:
    if minimum == 0 and not strict:
        return f"a non-negative {kind}"
    return f"{'an' if kind == 'integer' else 'a'} {kind} {'>' if strict else '>='} {minimum:g}"


def check_int(name: str, value: Any, *, minimum: int = 0, error: type[Exception] = ValueError) -> int:
    """``value`` as an int ``>= minimum``; anything else (bool, float, str) raises ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{name} must be {_bound_text('integer', minimum, False)}, got {value!r}")
    return value


def check_number(name: str, value: Any, *, minimum: float = 0.0, strict: bool = False,
                 error: type[Exception] = ValueError) -> float:
    """``value`` as a finite float ``>= minimum`` (``> minimum`` when ``strict``)."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > minimum if strict else value >= minimum))
    if not ok:
        raise error(f"{name} must be {_bound_text('number', minimum, strict)}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any, *, error: type[Exception] = ValueError) -> bool:
    """``value`` if it is exactly True or False."""
    if not isinstance(value, bool):
        raise error(f"{name} must be true or false, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str], *, error: type[Exception] = ValueError) -> str:
    """``value`` if it is one of ``choices``; the error lists them."""
    options = list(choices)
    if value not in options:
        raise error(f"unknown {name} {value!r}; valid choices: {', '.join(options)}")
    return value


def close_key(key: Any, keys: Sequence[str], *, cutoff: float = 0.6) -> str | None:
    """The one of ``keys`` that ``key`` looks like a misspelling of (``difflib`` ratio >= ``cutoff``), if any."""
    if not isinstance(key, str):
        return None
    import difflib  # only on the error path: keeps `import prefillq` light

    matches = difflib.get_close_matches(key, list(keys), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def reject_unknown_keys(data: Mapping[str, Any], allowed: Iterable[str], where: str, *,
                        error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first key of ``data`` not in ``allowed``, the key it resembles, and the valid keys."""
    valid = list(allowed)
    for key in data:
        if key not in valid:
            meant = close_key(key, valid)
            hint = f" (did you mean {meant!r}?)" if meant else ""
            raise error(f"unknown key {key!r} in {where}{hint}; valid keys: {', '.join(valid)}")


def settings_from(cls: Any, value: Any, what: str, name: str) -> Any:
    """A settings dataclass ``cls`` from itself, a dict of its fields (an unknown key is named), or None
    (all defaults); ValueError for anything else. ``what`` names the settings, ``name`` the argument."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        reject_unknown_keys(value, cls.__dataclass_fields__, what)
        return cls(**value)
    raise ValueError(f"{name} must be a {cls.__name__} or a dict, got {type(value).__name__}")
