"""What every test helper that runs a real server process needs: wait for it, stop it.

Used by ``tests/redis_server.py``, ``tests/simulator/procs.py``,
``tests/integration/gateway_proc.py`` and ``tests/e2e/llama_server.py``.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

# Binary (redis, the gateway, llama-server) or text-mode (the simulator) pipes alike.
Process = subprocess.Popen[bytes] | subprocess.Popen[str]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when a GET of ``url`` (one we built, on loopback) answers 2xx/3xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310  # local URL we built
            return True
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(
    proc: Process,
    ready: Callable[[], bool],
    *,
    timeout: float,
    poll_s: float,
    what: str,
    log: Callable[[], str],
) -> None:
    """Poll ``ready`` until it holds; kill ``proc`` and raise if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{log()}")
        if ready():
            return
        time.sleep(poll_s)
    kill(proc)
    raise RuntimeError(f"{what} did not become ready in {timeout:.0f} s:\n{log()}")


def kill(proc: Process | None) -> None:
    """SIGKILL (a crash) and reap, if still running."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def terminate(proc: Process | None, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; no-op when already gone."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill(proc)
