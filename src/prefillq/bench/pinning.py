"""Which CPUs the client and the servers run on, and what to do when they share them.

A load generator on the same cores as the engine it measures is descheduled while the engine's
threads spin, and its sends go out late (the rounds are then excluded as disturbed). ``bench.json``
records the client's CPUs and, for launched servers, the ``--server-cpus`` list; from these
:func:`sharing_hint` says, in one sentence, how to pin the two apart. Pure functions: nothing here
reads the machine except :func:`client_cpus`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a ``taskset -c`` list such as ``0``, ``2-3`` or ``0,2,4-7``; ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list such as 0, 2-3 or 0,2,4-7")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"{part.strip()!r} in {text!r} runs backwards")
        cpus.update(range(first, last + 1))
    return cpus


def server_cpus_problem(text: str) -> str | None:
    """What is wrong with a ``--server-cpus`` list on this machine (None when ``taskset -c`` can take it)."""
    try:
        cpus = parse_cpu_list(text)
    except ValueError as exc:
        return str(exc)
    count = os.cpu_count() or 1
    if max(cpus) >= count:
        return f"CPU {max(cpus)} does not exist (this machine has {count}: 0-{count - 1})"
    if shutil.which("taskset") is None:
        return ("the servers would run under taskset -c, and there is no taskset command on PATH (install "
                "util-linux, or leave --server-cpus out)")
    return None


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``0-2,5`` (the form ``taskset -c`` takes)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    for i, cpu in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != cpu + 1:
            first = ordered[start]
            parts.append(str(first) if first == cpu else f"{first}-{cpu}")
            start = i + 1
    return ",".join(parts)


def client_cpus() -> list[int] | None:
    """The CPUs this process may run on (None where the platform cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def split_suggestion(cpus: Sequence[int]) -> tuple[str, str] | None:
    """(server CPUs, client CPUs) to suggest: the last CPU for the client (it needs about one core),
    the others for the server; None with fewer than two CPUs."""
    ordered = sorted(set(cpus))
    if len(ordered) < 2:
        return None
    return format_cpu_list(ordered[:-1]), format_cpu_list(ordered[-1:])


def _local(url: str) -> bool:
    try:
        host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    except ValueError:
        return False
    return host in LOCAL_HOSTS or host.startswith("127.")


def sharing_hint(invocation: dict[str, Any]) -> str | None:
    """How to stop the client and the server(s) of one bench invocation sharing CPUs, in one sentence;
    None when they are pinned apart, or when the servers run elsewhere (or nothing was recorded)."""
    targets = invocation.get("targets") or {}
    client = set(invocation.get("client_cpus") or [])
    if not isinstance(targets, dict) or not client:
        return None
    if targets.get("launch"):
        server_cpus = targets.get("server_cpus")
        try:
            server = parse_cpu_list(server_cpus) if server_cpus else set(client)  # unpinned: it inherits ours
        except ValueError:
            return None
        shared = client & server
        if not shared:
            return None
        split = split_suggestion(sorted(client | server))
        if split is None:
            return (f"the client and the servers it launched share the only CPU ({format_cpu_list(shared)}); "
                    "measure on a machine with at least two cores")
        return (f"the client shares CPU(s) {format_cpu_list(shared)} with the servers it launched: pin them to "
                f"separate cores, e.g. `taskset -c {split[1]} prefillq bench ... --server-cpus {split[0]}`")
    urls = [url for url in (targets.get("urls") or {}).values() if isinstance(url, str)]
    if not urls or not any(_local(url) for url in urls):
        return None
    split = split_suggestion(sorted(client))
    if split is None:
        return None
    return (f"the server runs on this machine and may share the client's CPUs ({format_cpu_list(client)}): pin "
            f"them to separate cores, e.g. start the server under `taskset -c {split[0]} ...` and the client "
            f"as `taskset -c {split[1]} prefillq bench ...`")


def header_hint(header: dict[str, Any] | None) -> str | None:
    """The :func:`sharing_hint` of the latest invocation in ``bench.json`` that has one."""
    invocations = (header or {}).get("invocations")
    if not isinstance(invocations, list):
        return None
    for invocation in reversed(invocations):
        if isinstance(invocation, dict):
            hint = sharing_hint(invocation)
            if hint:
                return hint
    return None
