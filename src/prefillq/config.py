"""One typed configuration object and the three dialects that produce it (SPEC §4).

* LightLLM: ``--prefill_queue_strategy {default,promote_shortest,hrrn}`` (as argv text, an argv list,
  or a dict ``{"prefill_queue_strategy": ...}``);
* vLLM Ascend: ``{"scheduler_config": {"short_request_first_config": {"enabled": ..., ...}}}``;
* native: ``{"policy": "hrrn"}`` / ``{"policy": "short_request_first", "threshold": 512, ...}``,
  optionally wrapped as ``{"prefillq": {...}}``.

:func:`resolve_config` is the engine-side lookup: the policy a vLLM engine runs, from its
``--additional-config`` object or the ``PREFILLQ_CONFIG`` environment variable.

Bad configuration never falls back silently: it raises :class:`ConfigError`, whose message names the
offending key or value and lists the valid choices.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from prefillq.validation import check_bool, check_int, check_number, reject_unknown_keys

# The one registry of policy names: every other module reads these.
POLICIES = ("default", "promote_shortest", "hrrn", "short_request_first")
ALIASES = {"fcfs": "default", "srf": "short_request_first"}
LIGHTLLM_STRATEGIES = ("default", "promote_shortest", "hrrn")
ASCEND_SRF_KEYS = ("enabled", "threshold", "long_max_wait_ms")
ENV_CONFIG = "PREFILLQ_CONFIG"        # the environment variable an engine reads when --additional-config has none
ADDITIONAL_CONFIG_KEY = "prefillq"    # our key inside vLLM's --additional-config object


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", canonical_policy(self.policy))
        check_int("threshold", self.threshold, error=ConfigError)
        object.__setattr__(self, "long_max_wait_ms",
                           check_number("long_max_wait_ms", self.long_max_wait_ms, error=ConfigError))
        check_bool("trust_request_priority", self.trust_request_priority, error=ConfigError)
        object.__setattr__(self, "stats_interval_s",
                           check_number("stats_interval_s", self.stats_interval_s, error=ConfigError))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_(self, **changes: Any) -> PolicyConfig:
        return replace(self, **changes)


NATIVE_KEYS = tuple(f.name for f in fields(PolicyConfig))


def canonical_policy(name: Any) -> str:
    """The canonical policy name for a name or alias, or ConfigError listing the choices."""
    if not isinstance(name, str):
        raise ConfigError(f"policy must be a string, got {name!r}; valid policies: {_choices()}")
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; valid policies: {_choices()}")
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


def validate_deployment(config: PolicyConfig, *, kv_role: str | None = None,
                        scheduling_policy: str | None = None) -> None:
    """Refuse deployments a policy cannot serve (SPEC §3.4 compatibility)."""
    if config.policy == "short_request_first" and kv_role == "kv_consumer":
        raise ConfigError("short_request_first cannot run on a decode-only node (kv_role='kv_consumer'); "
                          "run it on the prefill node (kv_producer/kv_both) or choose another policy")
    if scheduling_policy is not None and scheduling_policy != "fcfs":
        raise ConfigError(f"prefillq policies replace the engine's waiting-queue order and need "
                          f"scheduling policy 'fcfs', got {scheduling_policy!r}; remove the "
                          "--scheduling-policy setting or do not use prefillq's scheduler")


def resolve_config(additional_config: Any, environ: Mapping[str, str] | None = None) -> tuple[PolicyConfig, str]:
    """The policy configuration for an engine, and where it came from (for the start-up log line).

    Only the parts of ``additional_config`` that configure a prefill queue are read; its other keys
    belong to other vLLM features and are left alone.
    """
    environ = os.environ if environ is None else environ
    ours = ascend = None
    if isinstance(additional_config, Mapping):
        ours = additional_config.get(ADDITIONAL_CONFIG_KEY)
        scheduler_config = additional_config.get("scheduler_config")
        if isinstance(scheduler_config, Mapping) and "short_request_first_config" in scheduler_config:
            ascend = {"scheduler_config": {"short_request_first_config":
                                           scheduler_config["short_request_first_config"]}}
    if ours is not None and ascend is not None:
        raise ConfigError("--additional-config sets both 'prefillq' and "
                          "'scheduler_config.short_request_first_config'; keep one of them")
    if ours is not None:
        return load_config({ADDITIONAL_CONFIG_KEY: ours}), "--additional-config key 'prefillq'"
    if ascend is not None:
        return (load_config(ascend),
                "--additional-config key 'scheduler_config.short_request_first_config'")
    text = environ.get(ENV_CONFIG, "").strip()
    if text:
        try:
            return load_config(text), f"environment variable {ENV_CONFIG}"
        except ConfigError as exc:
            raise ConfigError(f"{ENV_CONFIG}: {exc}") from None
    return load_config(None), "default (no prefillq configuration given)"


# --- dialects ---------------------------------------------------------------------------------

def _from_mapping(data: Mapping[str, Any]) -> PolicyConfig:
    if "scheduler_config" in data:
        reject_unknown_keys(data, ("scheduler_config",), "top level of the vLLM Ascend configuration",
                            error=ConfigError)
        return _from_ascend(data["scheduler_config"])
    if "prefillq" in data:
        reject_unknown_keys(data, ("prefillq",), "top level of the configuration", error=ConfigError)
        inner = data["prefillq"]
        if not isinstance(inner, Mapping):
            raise ConfigError(f"'prefillq' must be an object like {{\"policy\": \"hrrn\"}}, got {inner!r}")
        return _from_native(inner)
    if "prefill_queue_strategy" in data:
        reject_unknown_keys(data, ("prefill_queue_strategy",), "LightLLM configuration", error=ConfigError)
        return _lightllm_strategy(data["prefill_queue_strategy"])
    return _from_native(data)


def _from_native(data: Mapping[str, Any]) -> PolicyConfig:
    reject_unknown_keys(data, NATIVE_KEYS, "prefillq configuration", error=ConfigError)
    return PolicyConfig(**dict(data))


def _from_ascend(scheduler_config: Any) -> PolicyConfig:
    if not isinstance(scheduler_config, Mapping):
        raise ConfigError(f"'scheduler_config' must be an object, got {scheduler_config!r}")
    # Sibling keys of short_request_first_config configure other Ascend scheduler features.
    srf = scheduler_config.get("short_request_first_config", {})
    if not isinstance(srf, Mapping):
        raise ConfigError(f"'short_request_first_config' must be an object with keys {list(ASCEND_SRF_KEYS)}, "
                          f"got {srf!r}")
    reject_unknown_keys(srf, ASCEND_SRF_KEYS, "short_request_first_config", error=ConfigError)
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

def _choices() -> str:
    return ", ".join(POLICIES) + " (aliases: " + ", ".join(f"{a}={p}" for a, p in ALIASES.items()) + ")"
