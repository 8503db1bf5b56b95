"""``tiergate serve --workers N``: N gateway processes behind one listening socket.

The supervisor binds the socket once and starts N ``tiergate serve`` children that inherit it
(the kernel hands each accepted connection to one of the processes waiting in ``accept``). It
forwards SIGTERM/SIGINT, so every worker drains its streams within ``shutdown_grace_s``;
restarts a worker that dies (not one that keeps dying at start-up); kills and restarts one
whose event loop stopped (``server.worker_stall_s``); and removes the group's
shared directory at the end (see :mod:`gateway.upstream.worker_share`). Children die with it:
the kernel sends them SIGTERM when it dies, and :mod:`gateway.http.reaper` resumes or kills
those that cannot act on it (stopped, wedged).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import structlog

from gateway.config.settings import Settings
from gateway.http.listen import listen

_log = structlog.get_logger("tiergate.workers")
_PR_SET_PDEATHSIG = 1
_QUICK_DEATH_S = 5.0
_MAX_QUICK_DEATHS = 3
_DUMP_S = 1.0  # from a hung worker's SIGUSR1 (its stack dumped) to its SIGKILL


@dataclass(slots=True)
class _Heartbeat:
    """What the supervisor last saw of one worker's heartbeat: its metrics file, rewritten
    every second while the worker's event loop runs (:func:`metrics_file`)."""

    spawned_at: float  # monotonic, as the others
    mtime_ns: int | None  # the file's at the spawn (a previous worker's), then at each change
    changed_at: float  # the spawn, then the last change
    serving_since: float | None = None  # the first change: start-up is over
    dumped_at: float | None = None  # when its start ran out of time and it was sent SIGUSR1


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
    sock = listen(host, port)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _waited_for_cpu_s(pid: int) -> float:
    """Seconds process ``pid``'s main thread was ready to run but waited for a CPU (the
    scheduler's run-queue delay, ``/proc/PID/schedstat``); 0.0 where the kernel has none."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text(encoding="ascii").split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def die_with_supervisor(supervisor_pid: int | None) -> None:
    """In a worker, first thing: SIGTERM from the kernel when the supervisor dies
    (``PR_SET_PDEATHSIG``), and the same at once if it died before this call (the worker was
    reparented). Not a ``preexec_fn`` between fork and exec: the supervisor has threads (the
    log writer), and Python code in a forked child can deadlock on what they held."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if supervisor_pid is not None and os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)


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
        self.beats: dict[int, _Heartbeat] = {}
        self.quick_deaths = 0
        self.reaper: socket.socket | None = None
        self.pidfds = True  # False once pidfd_open failed (logged once)

    def _start_reaper(self) -> None:
        """Start the group's reaper and hand it every running worker (a pidfd each)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        grace = self.settings.server.shutdown_grace_s + 10  # as this process waits in run()
        cmd = [sys.executable, "-m", "gateway.http.reaper", "--fd", str(theirs.fileno())]
        cmd += ["--share-dir", str(self.share_dir), "--grace", str(grace)]
        with theirs:  # it forks at once and this first process exits
            try:
                subprocess.run(cmd, pass_fds=(theirs.fileno(),), check=True)  # noqa: S603  # ours
            except (OSError, subprocess.CalledProcessError) as exc:
                _log.error("server.reaper_unavailable", error=str(exc))
                ours.close()
                self.reaper = None
                return
        self.reaper = ours
        for child in self.children.values():
            self._announce(child)

    def _announce(self, child: subprocess.Popen[bytes]) -> None:
        """Pass the reaper a pidfd of ``child`` (not yet reaped, so it is that process)."""
        if self.reaper is None or not self.pidfds:
            return
        try:
            pidfd = os.pidfd_open(child.pid)
        except OSError as exc:  # Linux before 5.3: the reaper only removes the directory
            _log.warning("server.reaper_unavailable", error=exc.strerror)
            self.pidfds = False
            return
        with contextlib.suppress(OSError):  # the reaper is gone: _check_reaper restarts it
            socket.send_fds(self.reaper, [b"w"], [pidfd])
        os.close(pidfd)

    def _reap_strays(self) -> None:
        """Reap exited children that are not workers: the orphans handed to this process when
        it is PID 1 of a container without an init (or a subreaper), a replaced reaper among
        them. A worker's exit is left for its ``Popen`` (``WNOWAIT``: only looked at)."""
        workers = {child.pid for child in self.children.values()}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # no children at all
                return
            if info is None or info.si_pid in workers:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def _check_reaper(self) -> None:
        """Restart the reaper if it is gone (its end closed: it never sends anything)."""
        if self.reaper is not None and select.select([self.reaper], [], [], 0)[0]:
            _log.warning("server.reaper_exited")
            self.reaper.close()
            self._start_reaper()

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
            "--supervisor-pid",
            str(os.getpid()),
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
        )
        self._announce(self.children[index])
        now = time.monotonic()
        # A replaced worker's file (none before the first start: not read, so the metrics
        # module is imported after every worker of the group has been started).
        previous = self._mtime_ns(index) if index in self.beats else None
        self.beats[index] = _Heartbeat(now, previous, now)

    def _mtime_ns(self, index: int) -> int | None:
        from gateway.upstream.worker_share import metrics_file  # noqa: PLC0415  # see _spawn

        try:
            return metrics_file(self.share_dir, index).stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def _beat(self, index: int) -> _Heartbeat:
        """The worker's heartbeat, brought up to date."""
        beat = self.beats[index]
        mtime_ns = self._mtime_ns(index)
        if mtime_ns != beat.mtime_ns:
            beat.mtime_ns, beat.changed_at = mtime_ns, time.monotonic()
            if beat.serving_since is None:
                beat.serving_since = beat.changed_at
        return beat

    def _watch(self, index: int, child: subprocess.Popen[bytes]) -> None:
        """Kill a worker whose event loop stopped running (SIGSTOP, a wedged loop): its
        connections would hang forever; killed, it is replaced like any dead worker."""
        beat = self._beat(index)
        if beat.serving_since is None:
            self._watch_start(index, child, beat)
            return
        stall_s = self.settings.server.worker_stall_s
        silent = time.monotonic() - beat.changed_at
        if 0 < stall_s < silent:
            _log.error("server.worker_stalled", worker=index, silent_s=round(silent, 1))
            child.kill()
            beat.changed_at = time.monotonic()  # one kill: the next rounds reap it

    def _watch_start(self, index: int, child: subprocess.Popen[bytes], beat: _Heartbeat) -> None:
        """Kill a worker whose start-up has not ended within ``server.worker_start_timeout_s``
        (it hangs importing, building the app, binding): first SIGUSR1, so that its stack
        (where it hangs) is on its stderr, then SIGKILL; it is replaced like any dead worker.

        The time it waited for a CPU does not count: a start slowed down by a loaded node is
        not hung, and a replacement would start from scratch as starved (three such kills
        would stop the group)."""
        limit_s = self.settings.server.worker_start_timeout_s
        waited = time.monotonic() - beat.spawned_at
        if not 0 < limit_s < waited:
            return
        starved = _waited_for_cpu_s(child.pid)
        if beat.dumped_at is None:
            if waited - starved <= limit_s:
                return
            _log.error(
                "server.worker_start_timeout", worker=index, waited_s=round(waited, 1),
                starved_s=round(starved, 1), limit_s=limit_s, pid=child.pid,
            )  # fmt: skip
            child.send_signal(signal.SIGUSR1)  # the stack is written in the signal handler
            beat.dumped_at = time.monotonic()
        elif time.monotonic() - beat.dumped_at > _DUMP_S:
            child.kill()

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
        self._check_reaper()
        self._reap_strays()
        for index, child in list(self.children.items()):
            if self.stopping:
                return
            code = child.poll()
            if code is None:
                self._watch(index, child)
                continue
            beat = self._beat(index)
            now = time.monotonic()
            lived = now - beat.spawned_at
            _log.warning("server.worker_exited", worker=index, code=code, lived_s=round(lived, 1))
            # Quick: before its start-up was over (however long that took: minutes on a loaded
            # node) or within seconds of it.
            served = 0.0 if beat.serving_since is None else now - beat.serving_since
            self.quick_deaths = self.quick_deaths + 1 if served < _QUICK_DEATH_S else 0
            if self.quick_deaths >= _MAX_QUICK_DEATHS:
                _log.error("server.workers_failing", worker=index)
                self._stop(signal.SIGTERM, None)
                return
            self._spawn(index)

    def run(self, meanwhile: Callable[[], object] = lambda: None) -> int:
        """Serve until SIGTERM/SIGINT; 0 on a clean stop, 1 when workers kept failing.

        The workers are started first, then the reaper, then ``meanwhile`` runs (this
        process's own set-up: its logging) while they start: what this process still has to
        import or start is not added to the workers' start-up time.
        """
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        try:
            for index in range(self.count):
                self._spawn(index)
            # Before anything else: killed while its workers start, this process leaves the
            # reaper to end those that have not asked for the kernel's signal yet and to
            # remove the group's directory.
            self._start_reaper()
            meanwhile()
            from gateway.telemetry.lifecycle import log_started  # noqa: PLC0415  # see above

            log_started(self.settings, port=self.sock.getsockname()[1], workers=self.count)
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
            if self.reaper is not None:  # every worker has exited: it just leaves
                self.reaper.close()
        return 1 if self.quick_deaths >= _MAX_QUICK_DEATHS else 0
