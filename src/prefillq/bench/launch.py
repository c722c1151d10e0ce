"""Start and stop the servers a benchmark runs against.

:class:`LaunchedServer` runs one server command in its own process group with its output in a log
file, waits until ``/health`` answers, and stops the whole group (the OpenAI front-end and the
engine-core process it spawns) afterwards. A server that exits is reported with the tail of its log.

:class:`Targets` is what the protocol asks for a policy's URL:

* :class:`UrlTargets`: servers someone else runs (``--url``);
* :class:`LaunchedTargets`: servers we start per policy, either all at once on consecutive ports
  and kept for the whole protocol (``all-at-once``: cheap, rotation between rounds costs nothing;
  needs memory for every server at the same time) or one fresh server per run (``one-at-a-time``:
  one accelerator is enough, each run gets its own warm-up).

A row may be :data:`STOCK`: the engine's own scheduler, started with the same command minus prefillq's
``--scheduler-cls`` and its ``--additional-config`` key (the baseline a user compares against first).
``server_cpus`` pins every launched server to CPUs with ``taskset -c`` (a client on the same cores
as its server sends late). ``record_steps`` (a folder) has every vLLM server that runs the plug-in record
its engine steps there (``record_steps`` in its ``--additional-config``; the stock row has no plug-in and
records nothing), for ``prefillq calibrate --from-bench``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from prefillq.bench.results import file_label
from prefillq.config import PolicyConfig

SERVER_MODES = ("all-at-once", "one-at-a-time")
STOCK = "stock"  # the row that runs the engine's own scheduler: config None, no prefillq in its command
STOCK_NEEDS_LAUNCH = (f"'{STOCK}' is vLLM without prefillq's scheduler, a row only --launch can start: against a "
                      "running server (--url) prefillq cannot choose the scheduler; use --launch vllm, or label "
                      "the server with another name")


def default_baseline(labels: Sequence[str]) -> str:
    """The row every other one is compared with unless the user says: stock when it runs, else default."""
    return STOCK if STOCK in labels else "default"
DEFAULT_VOCAB_SIZE = 1000  # token ids below this are valid for any real model


class ServerFailed(RuntimeError):
    """A launched server exited or never became ready; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def model_vocab_size(model: str) -> int | None:
    """The vocabulary size in a model folder's ``config.json`` (None when it cannot be read)."""
    config = Path(model) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    value = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class LaunchedServer:
    """One server process: ``start()``, ``wait_ready()``, ``check()``, ``stop()``."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None, *, url: str, log_path: Path,
                 ready_path: str = "/health") -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.url = url
        self.log_path = Path(log_path)
        self.ready_path = ready_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> LaunchedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        # Its own process group (stop() signals the whole group; a terminal's Ctrl-C reaches only us),
        # but our session: with the kernel's autogroup scheduling a new session is a new CPU group,
        # and an engine whose processes spin on both cores then starves the load generator in ours
        # (send lateness p99 of 0.77-2.3 s on a 2-core VM with start_new_session=True, 0.2-6 ms without).
        self.process = subprocess.Popen(
            self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            process_group=0,
        )
        return self

    def wait_ready(self, timeout_s: float = 900.0, on_wait: Callable[[float], None] | None = None) -> None:
        """Poll ``ready_path`` until it answers 200; ServerFailed if the process exits or time runs out."""
        import httpx

        started = time.monotonic()
        while True:
            self.check()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}{self.ready_path}", timeout=2.0).status_code == 200:
                    return
            waited = time.monotonic() - started
            if waited > timeout_s:
                self.stop()
                raise ServerFailed(f"{self.name} server not ready after {timeout_s:g} s; log tail "
                                   f"({self.log_path}):\n{tail(self.log_path)}")
            if on_wait is not None:
                on_wait(waited)
            time.sleep(0.5)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """ServerFailed (with the log tail) when the process has exited."""
        if self.process is None:
            raise ServerFailed(f"{self.name} server was never started")
        code = self.process.poll()
        if code is not None:
            raise ServerFailed(f"{self.name} server exited with status {code}; log tail ({self.log_path}):\n"
                               f"{tail(self.log_path)}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``."""
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        # children that outlived the leader (e.g. an engine core) share its group id
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


# ---------------------------------------------------------------------------------------------------
# Server commands


def vllm_server(model: str, config: PolicyConfig | None, *, port: int, log_path: Path, host: str = "127.0.0.1",
                extra_args: Sequence[str] = (), python: str | None = None) -> LaunchedServer:
    """vLLM's OpenAI server with our scheduler and ``config`` (command from ``integrations.serve``);
    ``config=None`` (the :data:`STOCK` row): the same command with vLLM's own scheduler."""
    from prefillq.integrations.serve import build_server_command

    python = python or sys.executable
    argv, env = build_server_command(model, config, host=host, port=port, extra_args=tuple(extra_args),
                                     python=python)
    if config is None:
        argv = stock_argv(argv)
    if CPU_KV_CACHE_ENV not in env and cpu_vllm(python):
        # vLLM's CPU build otherwise reserves 92% of the NUMA node it binds to and refuses to start when
        # less is free (on a 2-core VM whose node 0 holds 7 of its 24 GiB, it always is); 1 GiB is also
        # what `prefillq calibrate` measures the cpu-tiny-llama profile's KV blocks with
        env[CPU_KV_CACHE_ENV] = CPU_KV_CACHE_DEFAULT_GIB
    return LaunchedServer(f"vLLM ({_describe(config)})", argv, env, url=f"http://{host}:{port}", log_path=log_path)


def _take_option(argv: Sequence[str], option: str) -> tuple[list[str], list[str]]:
    """``argv`` without ``option`` (``--opt value`` or ``--opt=value``, every occurrence), and its values."""
    kept: list[str] = []
    values: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == option:
            values.append(next(args, ""))
        elif arg.startswith(option + "="):
            values.append(arg.split("=", 1)[1])
        else:
            kept.append(arg)
    return kept, values


def stock_argv(argv: Sequence[str]) -> list[str]:
    """A vLLM server command with prefillq taken out: no ``--scheduler-cls`` (vLLM's own scheduler) and
    no ``prefillq`` key in ``--additional-config`` (the user's other keys stay)."""
    from prefillq.config import ADDITIONAL_CONFIG_KEY

    kept, _ = _take_option(argv, "--scheduler-cls")
    kept, additional = _take_option(kept, "--additional-config")
    if additional:
        config = json.loads(additional[-1])
        config.pop(ADDITIONAL_CONFIG_KEY, None)
        if config:
            kept += ["--additional-config", json.dumps(config, separators=(",", ":"))]
    return kept


def with_step_records(argv: Sequence[str], folder: str) -> list[str]:
    """A plug-in server command whose ``--additional-config`` also asks the plug-in to record its steps to
    ``folder`` (``{"prefillq": {..., "record_steps": folder}}``; integrations/vllm_steps.py)."""
    from prefillq.config import ADDITIONAL_CONFIG_KEY
    from prefillq.integrations.vllm_steps import RECORD_STEPS_KEY

    kept, additional = _take_option(argv, "--additional-config")
    config = json.loads(additional[-1]) if additional else {}
    config[ADDITIONAL_CONFIG_KEY] = {**(config.get(ADDITIONAL_CONFIG_KEY) or {}), RECORD_STEPS_KEY: folder}
    return [*kept, "--additional-config", json.dumps(config, separators=(",", ":"))]


def pinned(argv: Sequence[str], cpus: str | None) -> list[str]:
    """``argv`` run on ``cpus`` with ``taskset -c`` (unchanged when ``cpus`` is None). ``taskset`` execs
    the command, so the server keeps its process id and group."""
    if cpus is None:
        return list(argv)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise ServerFailed("--server-cpus needs the taskset command (util-linux), which is not on PATH")
    return [taskset, "-c", cpus, *argv]


CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_KV_CACHE_DEFAULT_GIB = "1"


@functools.cache  # one question per interpreter, not one per launched server
def cpu_vllm(python: str) -> bool:
    """Whether ``python``'s vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    code = "import importlib.metadata as m; m.version('vllm-cpu')"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def mock_server(model: str, config: PolicyConfig | None, *, port: int, log_path: Path, host: str = "127.0.0.1",
                extra_args: Sequence[str] = (), python: str | None = None) -> LaunchedServer:
    """The mock server as its own process, running ``config`` on the simulated vLLM engine in real time.

    Every request goes through the simulator's engine model with the real prefillq queue of
    ``config`` (``--engine-policy``), so the policy label of a mock run is honest: that policy ordered
    the (simulated) engine's waiting queue. For testing the tool without a GPU; the numbers are the
    cost profile's, not a real engine's. The :data:`STOCK` row (``config=None``) runs the engine model's
    own arrival order, which is what stock vLLM does (prefillq's ``default``).
    """
    engine_config = config if config is not None else PolicyConfig()
    argv = [python or sys.executable, "-m", "prefillq.cli.mockserver", "--host", host, "--port", str(port),
            "--engine-policy", json.dumps(engine_config.to_dict()), "--model", model, *extra_args]
    return LaunchedServer(f"mock ({_describe(config)})", argv, {"PYTHONUNBUFFERED": "1"}, url=f"http://{host}:{port}",
                          log_path=log_path)


def _describe(config: PolicyConfig | None) -> str:
    """The policy and, when it is not the default, how partial prefills are ordered (for status lines)."""
    if config is None:
        return f"{STOCK}: its own scheduler"
    if config.partial_prefills == "first":
        return config.policy
    return f"{config.policy}, partial_prefills={config.partial_prefills}"


ServerFactory = Callable[..., LaunchedServer]
LAUNCHERS: dict[str, ServerFactory] = {"vllm": vllm_server, "mock": mock_server}


# ---------------------------------------------------------------------------------------------------
# Targets: where each policy's requests go


class Targets:
    """Where the protocol sends each policy's load. ``fresh_per_run``: every run gets a new server."""

    fresh_per_run = False

    def open(self, policy: str) -> str:
        """The URL to send ``policy``'s run to (starting a server when needed)."""
        raise NotImplementedError

    def check(self, policy: str) -> None:
        """Raise :class:`ServerFailed` when the server of ``policy`` has died."""

    def done(self, policy: str) -> None:
        """The run of ``policy`` is over (a fresh-per-run server is stopped here)."""

    def close(self) -> None:
        """Stop everything this object started."""

    def start_all(self) -> None:
        """Start the servers that are kept for the whole protocol (none unless we launch them)."""

    def describe(self) -> dict[str, object]:
        return {}


class UrlTargets(Targets):
    """Servers that are already running: one URL per policy label."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = dict(urls)

    def open(self, policy: str) -> str:
        return self.urls[policy]

    def describe(self) -> dict[str, object]:
        return {"urls": self.urls}


class LaunchedTargets(Targets):
    """Servers this process starts, one per policy."""

    def __init__(self, launcher: str, configs: dict[str, PolicyConfig | None], *, model: str, log_dir: Path,
                 mode: str = "all-at-once", host: str = "127.0.0.1", base_port: int | None = None,
                 extra_args: Sequence[str] = (), python: str | None = None, ready_timeout_s: float = 900.0,
                 on_status: Callable[[str], None] | None = None, server_cpus: str | None = None,
                 record_steps: str | None = None) -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; valid: {', '.join(LAUNCHERS)}")
        if mode not in SERVER_MODES:
            raise ValueError(f"unknown server mode {mode!r}; valid: {', '.join(SERVER_MODES)}")
        self.launcher = launcher
        self.configs = configs
        self.model = model
        self.log_dir = Path(log_dir)
        self.mode = mode
        self.host = host
        self.base_port = base_port
        self.extra_args = list(extra_args)
        self.python = python
        self.ready_timeout_s = ready_timeout_s
        self.on_status = on_status or (lambda message: None)
        self.server_cpus = server_cpus
        self.record_steps = record_steps
        self.fresh_per_run = mode == "one-at-a-time"
        self.servers: dict[str, LaunchedServer] = {}
        self.starts: dict[str, int] = {}

    def _port(self, policy: str) -> int:
        if self.base_port is None:
            return free_port(self.host)
        return self.base_port + list(self.configs).index(policy)

    def server(self, policy: str, log_path: Path) -> LaunchedServer:
        """The server of ``policy``, not started yet (its command as it will run, pinning included)."""
        factory = LAUNCHERS[self.launcher]
        kwargs: dict[str, object] = {"port": self._port(policy), "log_path": log_path, "host": self.host,
                                     "extra_args": self.extra_args, "python": self.python}
        server = factory(self.model, self.configs[policy], **kwargs)
        if self.record_steps is not None and self.launcher == "vllm" and self.configs[policy] is not None:
            server.argv = with_step_records(server.argv, self.record_steps)
        server.argv = pinned(server.argv, self.server_cpus)
        return server

    def _start(self, policy: str) -> LaunchedServer:
        self.starts[policy] = self.starts.get(policy, 0) + 1
        log_path = self.log_dir / f"server-{file_label(policy)}-{self.starts[policy]:02d}.log"
        server = self.server(policy, log_path)
        self.on_status(f"starting {server.name} on {server.url} (log {log_path})")
        server.start()
        self.servers[policy] = server
        started = time.monotonic()
        server.wait_ready(self.ready_timeout_s)
        self.on_status(f"{server.name} ready after {time.monotonic() - started:.1f} s")
        return server

    def start_all(self) -> None:
        """Start every policy's server now (``all-at-once``)."""
        for policy in self.configs:
            if policy not in self.servers:
                self._start(policy)

    def open(self, policy: str) -> str:
        server = self.servers.get(policy)
        if server is None:
            server = self._start(policy)
        return server.url

    def check(self, policy: str) -> None:
        server = self.servers.get(policy)
        if server is not None:
            server.check()

    def done(self, policy: str) -> None:
        if self.fresh_per_run:
            server = self.servers.pop(policy, None)
            if server is not None:
                server.stop()

    def close(self) -> None:
        for policy in list(self.servers):
            self.servers.pop(policy).stop()

    def describe(self) -> dict[str, object]:
        return {"launch": self.launcher, "model": self.model, "servers": self.mode, "extra_args": self.extra_args,
                "configs": {name: config and config.to_dict() for name, config in self.configs.items()},
                "server_cpus": self.server_cpus, "record_steps": self.record_steps}
