"""Start, probe, measure and stop the server processes a benchmark leg needs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now (TIME_WAIT counts as free)."""
    with socket.socket() as sock:
        # As servers do (aiohttp, uvicorn), so that a port a stopped server left in TIME_WAIT
        # is not mistaken for a taken one.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http_status(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    """Status of one request (0 when the connection fails)."""
    request = urllib.request.Request(url, data=body, headers=headers or {})  # noqa: S310 - bench URLs are http://127.0.0.1 built here
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - same
            response.read()
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


def http_answers(url: str) -> Callable[[], bool]:
    """Readiness check: the server answers ``url`` with any HTTP status."""
    return lambda: http_status(url) != 0


def redis_answers(port: int) -> Callable[[], bool]:
    """Readiness check: a Redis server on ``port`` answers PING."""

    def ping() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    return ping


def post_json(
    url: str, body: bytes, api_key: str | None, extra_headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """POST a JSON body; return status and response body (status 0 on connection failure)."""
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 - bench URLs are http://127.0.0.1 built here
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - same
            status: int = response.status
            return status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc).encode()


def boost_session(pid: int) -> None:
    """Raise the scheduling weight of ``pid``'s session (root only; a no-op otherwise).

    With autogroup scheduling (the Linux default on desktops and many VMs) each session is
    one scheduling group and plain ``nice`` only ranks processes inside their own session, so
    the session's autogroup nice is what competes with other sessions' work.
    """
    if os.geteuid() != 0:
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text("-20")
    except OSError:
        return  # no autogroup support: the `nice -n -20` prefix alone applies


@contextmanager
def boosted_own_session() -> Iterator[None]:
    """Run the block with this process' session at autogroup nice -20, then restore it."""
    path = Path(f"/proc/{os.getpid()}/autogroup")
    try:
        before = path.read_text().split("nice")[-1].strip()
    except OSError:
        before = ""
    if os.geteuid() != 0 or not before:
        yield
        return
    boost_session(os.getpid())
    try:
        yield
    finally:
        with suppress(OSError):
            path.write_text(before)


@dataclass
class Service:
    """One server subprocess, its log file and the port it listens on."""

    name: str
    cmd: list[str]
    port: int
    log_path: Path
    env: dict[str, str] | None = None
    boost: bool = False
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self, ready: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Start the process and wait until ``ready()`` is true."""
        log = self.log_path.open("wb")
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        if self.boost:
            boost_session(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; "
                    f"command: {' '.join(self.cmd)}\n--- log tail ---\n{self.log_tail()}"
                )
            if ready():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"{self.name} not ready after {timeout_s:.0f}s\n--- log tail ---\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process' combined stdout/stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def listener_pid(self) -> int:
        """PID of the process holding the listening socket (the server itself, not a wrapper)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return pid_listening_on(self.port, session_of=self.proc.pid) or self.proc.pid

    def stop(self) -> None:
        """Terminate the whole process group, then kill it if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session made the child its own group leader
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def pid_listening_on(port: int, session_of: int) -> int | None:
    """Find the PID in session ``session_of`` that owns a LISTEN socket on ``port``."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session_of:
                continue
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(entry.name)
        except OSError:
            continue
    return None


def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) of one process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
