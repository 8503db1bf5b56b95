"""``tiergate serve --workers N``: N gateway processes behind one listening socket.

The supervisor binds the socket once and starts N ``tiergate serve`` children that inherit it
(the kernel hands each accepted connection to one of the processes waiting in ``accept``). It
forwards SIGTERM/SIGINT, so every worker drains its streams within ``shutdown_grace_s``;
restarts a worker that dies (not one that keeps dying at start-up); and removes the group's
shared directory at the end (see :mod:`gateway.upstream.worker_share`). Children die with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import structlog

from gateway.config.settings import Settings

_log = structlog.get_logger("tiergate.workers")
_PR_SET_PDEATHSIG = 1
_QUICK_DEATH_S = 5.0
_MAX_QUICK_DEATHS = 3


class WorkersRefused(ValueError):
    """A worker count the rest of the settings cannot honour; the message says why."""


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: its affinity mask, lowered by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        quota, period = (cgroup_root / "cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return max(1, cores)


@dataclass(frozen=True, slots=True)
class WorkerCount:
    """How many workers to run, and why the default of one per core was lowered, if it was."""

    count: int
    cores: int
    lowered_because: str | None = None

    def log(self) -> None:
        """Say why the default was lowered: call it once logging is configured, so the line
        has the configured format and destination (``telemetry.log_format``, ``log_file``)."""
        if self.lowered_because is not None:
            _log.info(
                "server.workers_defaulted",
                workers=self.count,
                cores=self.cores,
                reason=self.lowered_because,
            )


def resolve_workers(settings: Settings, requested: int | None, cores: int) -> WorkerCount:
    """How many workers to run; raises WorkersRefused for an explicit count the limits forbid."""
    count = requested if requested is not None else settings.server.workers
    # Without authentication there are no per-key limits to split.
    memory = settings.ratelimit.backend == "memory" and settings.auth.enabled
    divided = settings.ratelimit.memory_divide_per_worker
    if count is None:
        if memory and not divided and cores > 1:
            reason = "ratelimit.backend is memory: limits are exact in one process only"
            return WorkerCount(1, cores, reason)
        return WorkerCount(cores, cores)
    if count > 1 and memory and not divided:
        raise WorkersRefused(
            f"{count} workers with ratelimit.backend 'memory' would give every key {count}x "
            "its limits (each worker counts on its own). Use ratelimit.backend 'redis', or "
            "set ratelimit.memory_divide_per_worker: true to divide each key's limits among "
            "the workers, or run --workers 1."
        )
    return WorkerCount(count, cores)


def _listen(host: str, port: int) -> socket.socket:
    from gateway.http.server import listen  # noqa: PLC0415  # the same checks and messages

    sock = listen(host, port)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Starts, watches and stops the workers."""

    def __init__(self, settings: Settings, count: int, config: Path | None) -> None:
        self.settings = settings
        self.count = count
        self.config = config
        self.stopping = False
        self.sock = _listen(settings.server.host, settings.server.port)
        shm = Path("/dev/shm")  # noqa: S108  # tmpfs; mkdtemp makes a private 0700 directory
        base = shm if shm.is_dir() else None
        self.share_dir = Path(tempfile.mkdtemp(prefix="tiergate-workers-", dir=base))
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started_at: dict[int, float] = {}
        self.quick_deaths = 0

    def _spawn(self, index: int) -> None:
        s = self.settings.server
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--host",
            s.host,
            "--port",
            str(self.sock.getsockname()[1]),
            "--workers",
            str(self.count),
            "--worker-index",
            str(index),
            "--worker-fd",
            str(self.sock.fileno()),
            "--share-dir",
            str(self.share_dir),
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = dict(os.environ)
        attrs = env.get("OTEL_RESOURCE_ATTRIBUTES", "")
        env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(
            a for a in (attrs, f"tiergate.worker={index}") if a
        )
        self.children[index] = subprocess.Popen(  # noqa: S603  # our own interpreter and options
            cmd,
            pass_fds=(self.sock.fileno(),),
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # one prctl call, no locks taken
        )
        self.started_at[index] = time.monotonic()

    def _stop(self, signum: int, _: FrameType | None) -> None:
        self.stopping = True
        # Stop listening for the whole group at once (every worker's descriptor is this one
        # socket): a new connection is refused, as by one process, instead of waiting in the
        # kernel's queue, never accepted, until the last worker has drained and then reset.
        with contextlib.suppress(OSError):  # already shut down (a second signal)
            self.sock.shutdown(socket.SHUT_RD)
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def _reap(self) -> None:
        for index, child in list(self.children.items()):
            code = child.poll()
            if code is None or self.stopping:
                continue
            lived = time.monotonic() - self.started_at[index]
            _log.warning("server.worker_exited", worker=index, code=code, lived_s=round(lived, 1))
            self.quick_deaths = self.quick_deaths + 1 if lived < _QUICK_DEATH_S else 0
            if self.quick_deaths >= _MAX_QUICK_DEATHS:
                _log.error("server.workers_failing", worker=index)
                self._stop(signal.SIGTERM, None)
                return
            self._spawn(index)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; 0 on a clean stop, 1 when workers kept failing."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        try:
            for index in range(self.count):
                self._spawn(index)
            while not self.stopping:
                time.sleep(0.2)
                self._reap()
            deadline = time.monotonic() + self.settings.server.shutdown_grace_s + 10
            for child in self.children.values():
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        finally:
            self.sock.close()
            shutil.rmtree(self.share_dir, ignore_errors=True)
        return 1 if self.quick_deaths >= _MAX_QUICK_DEATHS else 0
