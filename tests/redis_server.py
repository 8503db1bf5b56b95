"""A real ``redis-server`` on a free port, for tests (never the one on 6379).

    with RedisServer() as server:
        ...  # server.url, server.port, server.kill(), server.restart()

Persistence is off (``--save "" --appendonly no``): a restart starts empty, like a lost Redis.
``persist=True`` turns the append-only file on (fsync on every write): a restart after
``kill()`` (SIGKILL) starts with every write Redis acknowledged.
Import the ``redis_server`` fixture into a test module for one server shared by the session,
flushed before each test.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import pytest

from tests.processes import free_port, kill, terminate, wait_ready


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process; ``restart()`` keeps the port so clients reconnect."""

    def __init__(
        self,
        port: int | None = None,
        *,
        ready_timeout: float = 10.0,
        persist: bool = False,
        bind: str = "127.0.0.1",
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.port = port or free_port()
        self.ready_timeout = ready_timeout
        self.persist = persist
        self.bind = bind  # "0.0.0.0" only for exposure tests: a server open to every network
        self._dir = tempfile.TemporaryDirectory(prefix="tiergate-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The running server's process id (to stop or signal it); an error when not started."""
        if self._proc is None:
            raise RuntimeError("redis-server is not started")
        return self._proc.pid

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING."""
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.bind,
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--appendfsync",
            "always",
            "--dir",
            self._dir.name,
            "--logfile",
            str(Path(self._dir.name) / "redis.log"),
        ]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(
            self._proc,
            lambda: _ping(self.port),
            timeout=self.ready_timeout,
            poll_s=0.02,
            what=f"redis-server on port {self.port}",
            log=self.log_text,
        )
        return self

    def log_text(self) -> str:
        """What the server logged so far (empty before it wrote anything)."""
        path = Path(self._dir.name) / "redis.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server (an outage) and reap it."""
        kill(self._proc)

    def restart(self) -> RedisServer:
        """Start again on the same port (empty: persistence is off)."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        terminate(self._proc, timeout=5)
        self._dir.cleanup()

    def flushall(self) -> None:
        """Empty every database (a test's fresh start)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(b"FLUSHALL\r\n")
            sock.recv(16)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_SERVER_KEY = pytest.StashKey[RedisServer]()


@pytest.fixture
def redis_server(request: pytest.FixtureRequest) -> RedisServer:
    """A running redis-server shared by the session's tests, flushed (or restarted) per test."""
    stash = request.config.stash
    server = stash.get(_SERVER_KEY, None)
    if server is None:
        server = stash[_SERVER_KEY] = RedisServer().start()
        request.config.add_cleanup(server.stop)
    elif not server.running:
        server.start()
    server.flushall()
    return server
