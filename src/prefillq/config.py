"""One typed configuration object and the three dialects that produce it (SPEC §4).

* LightLLM: ``--prefill_queue_strategy {default,promote_shortest,hrrn,auto}`` (as argv text, an argv list,
  or a dict ``{"prefill_queue_strategy": ...}``);
* vLLM Ascend: ``{"scheduler_config": {"short_request_first_config": {"enabled": ..., ...}}}``, usually
  part of a larger ``--additional-config`` object whose other keys (at both levels) belong to other
  features and are ignored; ``"short_request_first_config": null`` means the defaults (disabled);
* native: ``{"policy": "hrrn"}`` / ``{"policy": "short_request_first", "threshold": 512, ...}``,
  optionally wrapped as ``{"prefillq": {...}}``.

:func:`resolve_config` is the engine-side lookup: the policy a vLLM engine runs, from its
``--additional-config`` object or the ``PREFILLQ_CONFIG`` environment variable. It reads that object with
:func:`read_additional_config`, the same parser :func:`load_config` uses for a mapping.

Bad configuration never falls back silently: it raises :class:`ConfigError`, whose message names the
offending key or value and lists the valid choices. A near-miss spelling of a key we read is an error
naming the key it resembles, even where other keys are ignored: a typo must not leave an engine on FCFS.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from prefillq.validation import check_bool, check_choice, check_int, check_number, close_key, reject_unknown_keys

# The one registry of policy names: every other module reads these.
POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first", "auto")
ALIASES = {"fcfs": "default", "srf": "short_request_first"}
# Other engines' own options, emulated for comparison in the simulator (policies/peers/, docs/peers.md).
PEER_POLICIES = ("sglang_hrrn", "sglang_spf", "trtllm_suf", "dynamo_wspt")
LIGHTLLM_STRATEGIES = ("default", "promote_shortest", "hrrn", "auto")
PARTIAL_PREFILLS = ("first", "ordered")  # SPEC §3.6: the engine's own rule, or the policy's order
ASCEND_SRF_KEYS = ("enabled", "threshold", "long_max_wait_ms")
ENV_CONFIG = "PREFILLQ_CONFIG"        # the environment variable an engine reads when --additional-config has none
ADDITIONAL_CONFIG_KEY = "prefillq"    # our key inside vLLM's --additional-config object
ASCEND_KEY = "scheduler_config"       # vLLM Ascend: {"scheduler_config": {"short_request_first_config": {...}}}
ASCEND_SRF_KEY = "short_request_first_config"
LIGHTLLM_KEY = "prefill_queue_strategy"
# Where other features' keys sit beside ours, a key this close to one we read is taken for a typo of it
# (difflib ratio): 'scheduler_confg' 0.97, 'short_request_frist_config' 0.96, 'prefilq' 0.93, while
# vLLM Ascend's own 'ascend_scheduler_config' (0.82 against 'scheduler_config') is left alone.
NEAR_MISS_CUTOFF = 0.85


class ConfigError(ValueError):
    """Invalid prefillq configuration; the message names the key/value and the valid choices."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Everything a prefill queue is configured with; defaults live here and nowhere else."""

    policy: str = "default"
    threshold: int = 256
    long_max_wait_ms: float = 0.0
    trust_request_priority: bool = False
    stats_interval_s: float = 5.0
    partial_prefills: str = "first"
    metrics_port: int = 0  # Prometheus endpoint of the engine process (integrations/metrics.py); 0 = off
    # Strict tiers of the request priority (lower first), the policy's order inside each tier: vLLM's
    # --scheduling-policy priority (policies/tiers.py). Implies trusting request priorities (SPEC §5).
    priority_tiers: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", canonical_policy(self.policy))
        check_int("threshold", self.threshold, error=ConfigError)
        object.__setattr__(self, "long_max_wait_ms",
                           check_number("long_max_wait_ms", self.long_max_wait_ms, error=ConfigError))
        check_bool("trust_request_priority", self.trust_request_priority, error=ConfigError)
        object.__setattr__(self, "stats_interval_s",
                           check_number("stats_interval_s", self.stats_interval_s, error=ConfigError))
        check_choice("partial_prefills", self.partial_prefills, PARTIAL_PREFILLS, error=ConfigError)
        object.__setattr__(self, "metrics_port", _check_port(self.metrics_port))
        check_bool("priority_tiers", self.priority_tiers, error=ConfigError)
        if self.priority_tiers and self.policy in PEER_POLICIES:
            raise ConfigError(f"priority_tiers needs one of prefillq's own policies ({', '.join(POLICIES)}), "
                              f"got the peer emulation {self.policy!r}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_(self, **changes: Any) -> PolicyConfig:
        return replace(self, **changes)


NATIVE_KEYS = tuple(f.name for f in fields(PolicyConfig))


def _check_port(value: Any) -> int:
    """``metrics_port``: a TCP port 1-65535, or 0 / None (JSON null) for no metrics endpoint."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"metrics_port must be a TCP port 1-65535 (or 0 / null for no metrics endpoint), "
                          f"got {value!r}")
    return value


def canonical_policy(name: Any) -> str:
    """The canonical policy name for a name or alias, or ConfigError listing the choices."""
    if not isinstance(name, str):
        raise ConfigError(f"policy must be a string, got {name!r}; valid policies: {_choices()}")
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in POLICIES and key not in PEER_POLICIES:
        meant = close_key(key, [*POLICIES, *ALIASES])
        hint = f" (did you mean {ALIASES.get(meant, meant)!r}?)" if meant else ""
        raise ConfigError(f"unknown policy {name!r}{hint}; valid policies: {_choices()}")
    return key


def load_config(source: Any = None) -> PolicyConfig:
    """Build a :class:`PolicyConfig` from any dialect.

    ``source`` may be ``None`` (defaults), a :class:`PolicyConfig`, a policy name or alias, JSON text,
    LightLLM argv text/list, a path to a JSON file, or a mapping in any of the three dialects.
    """
    if source is None:
        return PolicyConfig()
    if isinstance(source, PolicyConfig):
        return source
    if isinstance(source, Path):
        return _load_file(source)
    if isinstance(source, str):
        text = source.strip()
        if not text:
            raise ConfigError(f"empty configuration; give a policy name ({_choices()}) or JSON")
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"malformed JSON configuration: {exc.msg} at line {exc.lineno} "
                                  f"column {exc.colno}: {text[:80]!r}") from None
            return load_config(data)
        if text.startswith("--"):
            import shlex

            return _from_lightllm_argv(shlex.split(text))
        if text.endswith(".json") or "/" in text:
            return _load_file(Path(text))
        return PolicyConfig(policy=canonical_policy(text))
    if isinstance(source, Mapping):
        return _from_mapping(source)
    if isinstance(source, Sequence) and all(isinstance(s, str) for s in source):
        return _from_lightllm_argv(list(source))
    raise ConfigError(f"cannot read a configuration from {type(source).__name__} {source!r}; "
                      "give a policy name, JSON text, a dict or a PolicyConfig")


def deployment_config(config: PolicyConfig, *, kv_role: str | None = None,
                      scheduling_policy: str | None = None) -> PolicyConfig:
    """The configuration an engine runs, checked (:func:`validate_deployment`). Under the engine's
    ``priority`` scheduling the policy runs inside strict priority tiers (SPEC §4.1: choosing that mode is
    the operator's declaration that request priorities are trusted), so ``priority_tiers`` is implied."""
    if config.policy in PEER_POLICIES:
        raise ConfigError(f"{config.policy!r} is prefillq's emulation of another engine's queue option, for the "
                          "simulator (prefillq compare --policies peers); an engine runs prefillq's own "
                          "policies: default, promote_shortest, hrrn, short_request_first, auto")
    if scheduling_policy == "priority" and not config.priority_tiers:
        config = config.with_(priority_tiers=True)
    validate_deployment(config, kv_role=kv_role, scheduling_policy=scheduling_policy)
    return config


def validate_deployment(config: PolicyConfig, *, kv_role: str | None = None,
                        scheduling_policy: str | None = None) -> None:
    """Refuse deployments a policy cannot serve (SPEC §3.4 compatibility)."""
    if config.policy == "short_request_first" and kv_role == "kv_consumer":
        raise ConfigError("short_request_first cannot run on a decode-only node (kv_role='kv_consumer'); "
                          "run it on the prefill node (kv_producer/kv_both) or choose another policy")
    if scheduling_policy == "priority":
        if not config.priority_tiers:
            raise ConfigError("vLLM's scheduling policy 'priority' needs prefillq's strict priority tiers: set "
                              "\"priority_tiers\": true in the prefillq configuration (requests are then served "
                              "in tiers of their priority, the policy's order inside each tier), or remove the "
                              "--scheduling-policy setting")
    elif scheduling_policy is not None and scheduling_policy != "fcfs":
        raise ConfigError(f"prefillq policies replace the engine's waiting-queue order and need "
                          f"scheduling policy 'fcfs' (or 'priority' with priority_tiers), got "
                          f"{scheduling_policy!r}; remove the --scheduling-policy setting or do not use "
                          "prefillq's scheduler")
    elif config.priority_tiers and scheduling_policy is not None:
        raise ConfigError("priority_tiers orders requests by their priority, which vLLM honours only with "
                          "--scheduling-policy priority; add it, or set priority_tiers to false")


def resolve_config(additional_config: Any, environ: Mapping[str, str] | None = None) -> tuple[PolicyConfig, str]:
    """The policy configuration for an engine, and where it came from (for the start-up log line).

    First match wins: the ``prefillq`` key or the vLLM Ascend key of ``additional_config`` (read by
    :func:`read_additional_config`), the ``PREFILLQ_CONFIG`` environment variable, the defaults.
    """
    environ = os.environ if environ is None else environ
    if isinstance(additional_config, Mapping):
        found = read_additional_config(additional_config)
        if found is not None:
            return found
    text = environ.get(ENV_CONFIG, "").strip()
    if text:
        try:
            return load_config(text), f"environment variable {ENV_CONFIG}"
        except ConfigError as exc:
            raise ConfigError(f"{ENV_CONFIG}: {exc}") from None
    return load_config(None), "default (no prefillq configuration given)"


def read_additional_config(data: Mapping[str, Any]) -> tuple[PolicyConfig, str] | None:
    """The policy an ``--additional-config`` object sets, and the key that sets it; None if it sets none.

    It sets one through our ``prefillq`` key or the vLLM Ascend key
    ``scheduler_config.short_request_first_config`` (not both); ``null`` there means the defaults.
    Other keys, at the top level and inside ``scheduler_config``, belong to other features and are
    ignored, except a near-miss spelling of ours, which is an error naming the key it resembles.
    """
    _reject_near_misses(data, (ADDITIONAL_CONFIG_KEY, ASCEND_KEY), "the top level of the configuration")
    scheduler_config = data.get(ASCEND_KEY)
    if scheduler_config is not None and not isinstance(scheduler_config, Mapping):
        raise ConfigError(f"{ASCEND_KEY!r} must be an object (vLLM Ascend: {{\"{ASCEND_SRF_KEY}\": {{...}}}}), "
                          f"got {scheduler_config!r}")
    ascend = scheduler_config is not None and ASCEND_SRF_KEY in scheduler_config
    if scheduler_config is not None:
        _reject_near_misses(scheduler_config, (ASCEND_SRF_KEY,), f"{ASCEND_KEY!r}")
    ours = ADDITIONAL_CONFIG_KEY in data
    if ours and ascend:
        raise ConfigError(f"the configuration sets both {ADDITIONAL_CONFIG_KEY!r} and "
                          f"'{ASCEND_KEY}.{ASCEND_SRF_KEY}'; keep one of them")
    if ours:
        inner = data[ADDITIONAL_CONFIG_KEY]
        if inner is not None and not isinstance(inner, Mapping):
            raise ConfigError(f"{ADDITIONAL_CONFIG_KEY!r} must be an object like {{\"policy\": \"hrrn\"}}, "
                              f"got {inner!r}")
        return _from_native(inner or {}), f"--additional-config key {ADDITIONAL_CONFIG_KEY!r}"
    if ascend:
        source = f"--additional-config key '{ASCEND_KEY}.{ASCEND_SRF_KEY}'"
        return _from_ascend(scheduler_config[ASCEND_SRF_KEY]), source
    return None


def parse_policy_spec(text: str) -> tuple[str, PolicyConfig]:
    """One ``compare --policy`` SPEC as ``(label, config)``; the label is ``text`` exactly as given.

    SPEC is a policy name or alias (``hrrn``), a JSON object (``{"policy": "hrrn"}``, read by
    :func:`load_config`), a path to a JSON file, or ``NAME:KEY=VALUE[,KEY=VALUE...]``
    (``short_request_first:threshold=512,long_max_wait_ms=1500``), where each KEY is a
    :class:`PolicyConfig` field and its VALUE is read as that field's type (int, float, bool, str or a
    choice of literals; ``none`` for a field that may be None). Bad specs raise :class:`ConfigError`.
    """
    if not isinstance(text, str):
        raise ConfigError(f"a policy spec must be text, got {text!r}")
    try:
        return text, _read_policy_spec(text)
    except ConfigError as exc:
        raise ConfigError(f"policy spec {text!r}: {exc}") from None


def _read_policy_spec(text: str) -> PolicyConfig:
    body = text.strip()
    if not body:
        raise ConfigError(f"empty; give a policy name ({_choices()}), NAME:KEY=VALUE,... or JSON")
    if body.startswith("{") or body.endswith(".json") or ":" not in body:
        if "=" in body and not body.startswith(("{", "--")):
            raise ConfigError("settings go after the policy name, as NAME:KEY=VALUE "
                              "(e.g. short_request_first:threshold=512)")
        return load_config(body)
    name, _, settings = body.partition(":")
    policy = canonical_policy(name)
    keys = [f.name for f in fields(PolicyConfig) if f.name != "policy"]
    values: dict[str, Any] = {}
    for item in settings.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        key = key.replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE after {name.strip()!r}:, got {item.strip()!r} "
                              f"(keys: {', '.join(keys)})")
        if key not in keys:
            meant = close_key(key, keys)
            hint = f" (did you mean {meant!r}?)" if meant else ""
            where = "is given before ':'" if key == "policy" else "is not a setting"
            raise ConfigError(f"{key!r} {where}{hint}; valid keys: {', '.join(keys)}")
        if key in values:
            raise ConfigError(f"{key!r} is given twice")
        values[key] = _typed_value(key, raw, _field_types()[key])
    return PolicyConfig(policy=policy, **values)


def _field_types() -> dict[str, Any]:
    """PolicyConfig's field types, resolved (fields other branches add are read the same way)."""
    import typing

    try:
        return typing.get_type_hints(PolicyConfig)
    except (NameError, TypeError):  # an annotation that does not resolve here: read the plain names only
        plain = {"int": int, "float": float, "bool": bool, "str": str}
        return {f.name: plain.get(f.type, Any) if isinstance(f.type, str) else f.type for f in fields(PolicyConfig)}


def _typed_value(key: str, raw: str, kind: Any) -> Any:
    """``raw`` read as a ``kind`` value (the type of PolicyConfig's field ``key``)."""
    import types
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Literal:
        choices = {str(choice): choice for choice in args}
        if raw not in choices:
            raise ConfigError(f"{key}={raw!r} is not a valid choice; "
                              f"valid choices: {', '.join(choices)}")
        return choices[raw]
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if len(options) < len(args) and raw.lower() in ("none", "null"):
            return None
        if len(options) == 1:
            return _typed_value(key, raw, options[0])
        return _json_or_text(raw)
    if kind is bool:
        flag = {"true": True, "1": True, "yes": True, "on": True,
                "false": False, "0": False, "no": False, "off": False}.get(raw.lower())
        if flag is None:
            raise ConfigError(f"{key}={raw!r} must be true or false")
        return flag
    if kind in (int, float):
        try:
            return int(raw) if kind is int else float(raw)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"{key}={raw!r} must be {what}") from None
    if kind is str:
        return raw
    return _json_or_text(raw)


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


# --- dialects ---------------------------------------------------------------------------------

def _from_mapping(data: Mapping[str, Any]) -> PolicyConfig:
    found = read_additional_config(data)
    if found is not None:
        return found[0]
    if ASCEND_KEY in data:  # an Ascend object that leaves short_request_first unconfigured: its defaults
        return _from_ascend(None)
    if LIGHTLLM_KEY in data:
        reject_unknown_keys(data, (LIGHTLLM_KEY,), "LightLLM configuration", error=ConfigError)
        return _lightllm_strategy(data[LIGHTLLM_KEY])
    _reject_near_misses(data, (LIGHTLLM_KEY,), "the configuration")
    return _from_native(data)


def _from_native(data: Mapping[str, Any]) -> PolicyConfig:
    reject_unknown_keys(data, NATIVE_KEYS, "prefillq configuration", error=ConfigError)
    return PolicyConfig(**dict(data))


def _from_ascend(srf: Any) -> PolicyConfig:
    """``short_request_first_config``'s value; ``None`` (JSON null) means the defaults, as in vLLM Ascend."""
    srf = {} if srf is None else srf
    if not isinstance(srf, Mapping):
        raise ConfigError(f"{ASCEND_SRF_KEY!r} must be an object with keys {list(ASCEND_SRF_KEYS)} or null, "
                          f"got {srf!r}")
    reject_unknown_keys(srf, ASCEND_SRF_KEYS, ASCEND_SRF_KEY, error=ConfigError)
    enabled = srf.get("enabled", False)
    check_bool("enabled", enabled, error=ConfigError)
    threshold = srf.get("threshold", 256)
    wait = srf.get("long_max_wait_ms", 0)
    check_int("threshold", threshold, error=ConfigError)
    wait = check_number("long_max_wait_ms", wait, error=ConfigError)
    return PolicyConfig(policy="short_request_first" if enabled else "default",
                        threshold=threshold, long_max_wait_ms=wait)


def _from_lightllm_argv(argv: list[str]) -> PolicyConfig:
    strategy: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--prefill_queue_strategy="):
            strategy = arg.split("=", 1)[1]
        elif arg == "--prefill_queue_strategy":
            if i + 1 >= len(argv):
                raise ConfigError("--prefill_queue_strategy needs a value; valid choices: "
                                  + ", ".join(LIGHTLLM_STRATEGIES))
            strategy = argv[i + 1]
            i += 1
        else:
            raise ConfigError(f"unknown LightLLM option {arg!r}; the only one read is --prefill_queue_strategy")
        i += 1
    return _lightllm_strategy("default" if strategy is None else strategy)


def _lightllm_strategy(value: Any) -> PolicyConfig:
    if value not in LIGHTLLM_STRATEGIES:
        raise ConfigError(f"unknown prefill_queue_strategy {value!r}; valid choices: "
                          + ", ".join(LIGHTLLM_STRATEGIES))
    return PolicyConfig(policy=value)


def _load_file(path: Path) -> PolicyConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed JSON in {path}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return load_config(data)


# --- checks -----------------------------------------------------------------------------------

def _reject_near_misses(data: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    """Refuse a key of ``data`` that is not one of ``keys`` but is a near-miss spelling of one."""
    for key in data:
        if key in keys:
            continue
        meant = close_key(key, keys, cutoff=NEAR_MISS_CUTOFF)
        if meant is not None:
            raise ConfigError(f"unknown key {key!r} in {where}: did you mean {meant!r}? (keys read there: "
                              f"{', '.join(keys)}; other keys are left to other features)")

def _choices() -> str:
    return ", ".join(POLICIES) + " (aliases: " + ", ".join(f"{a}={p}" for a, p in ALIASES.items()) + ")"
