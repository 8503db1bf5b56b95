"""What every test helper that runs a real server process needs: wait for it, stop it.

Used by ``tests/redis_server.py``, ``tests/simulator/procs.py``,
``tests/integration/gateway_proc.py`` and ``tests/e2e/llama_server.py``.
"""

from __future__ import annotations

import multiprocessing.context
import os
import random
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# The most a wait is stretched: a machine this loaded fails for other reasons anyway.
MAX_STRETCH = 8.0

# Binary (redis, the gateway, llama-server) or text-mode (the simulator) pipes alike.
Process = subprocess.Popen[bytes] | subprocess.Popen[str]


def _ports_below_ephemeral() -> range | None:
    """Listening ports outside the kernel's ephemeral range (which it hands to outgoing
    connections as their source ports), or ``None`` where that range leaves too few below it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    first = max(10_000, low - 12_000)
    return range(first, low) if low - first >= 2_000 else None


_PORTS = _ports_below_ephemeral()
_DRAW = random.Random()  # spreading test ports, not security


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago.

    Drawn below the ephemeral range where there is room: a port the kernel picked (bind to 0)
    is an ephemeral one, which any client connection of the run may take as its source port
    before the server the test starts binds it (a CI run's gateway failed to start with "the
    port is already in use" beside 2,800 tests' connections). Only another test drawing the
    same port within that moment can still collide there."""
    for port in _DRAW.sample(_PORTS, 50) if _PORTS is not None else ():
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


@contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that accepts every connection and never answers (a collector, a Redis
    or a backend gone silent): every read from it times out. Its connections are held open
    until the block ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def load_per_core() -> float:
    """The last minute's load average per usable core (0.0 where the OS has none)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 0.0
    return load / max(len(os.sched_getaffinity(0)), 1)


def patience(seconds: float) -> float:
    """``seconds`` stretched by how loaded the machine is: a wait for something to become
    true (a server ready, a counter reached) that fits an idle machine fits a busy one too.

    At one runnable task per core or less it is ``seconds``; above, it grows with the load
    per core, up to ``MAX_STRETCH`` times. Only for waits that end as soon as the condition
    holds: never to widen a bound a test asserts.
    """
    return seconds * min(max(load_per_core(), 1.0), MAX_STRETCH)


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
    """Poll ``ready`` until it holds; kill ``proc`` and raise if it exits or time runs out.

    ``timeout`` is what an idle machine needs; it is stretched by ``patience`` (re-read while
    waiting, so load that rises meanwhile counts) and a process that exits fails at once.
    """
    start = time.monotonic()
    waited = 0.0
    while waited < patience(timeout):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{log()}")
        if ready():
            return
        time.sleep(poll_s)
        waited = time.monotonic() - start
    dump_stacks(proc.pid)  # a `tiergate serve` writes every thread's stack to its stderr
    kill(proc)
    raise RuntimeError(
        f"{what} did not become ready in {waited:.0f} s (load per core "
        f"{load_per_core():.1f}):\n{log()}"
    )


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (its main thread's children), from /proc."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    return [int(child) for child in text.split()]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs); one gone meanwhile has none."""
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            below = children(parent)
        except OSError:
            continue
        found.extend(below)
        parents.extend(below)
    return found


def dump_stacks(pid: int, settle_s: float = 1.0) -> None:
    """SIGUSR1 to process ``pid`` and its descendants: a ``tiergate serve`` process (supervisor
    or worker) answers with every thread's Python stack on its stderr (faulthandler), so a
    start that never finished shows where it stands. Then wait ``settle_s`` for the writes."""
    for each in [pid, *descendants(pid)]:
        try:
            os.kill(each, signal.SIGUSR1)
        except ProcessLookupError:
            continue
    time.sleep(settle_s)


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


def run_tiergate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gateway ARGS`` from the repository with no ``TIERGATE_*`` variable of
    this environment, only those of ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIERGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
        check=False,
    )


def run_module_forked(
    forks: multiprocessing.context.ForkServerContext,
    module: str,
    *args: str,
    cwd: Path,
    env: dict[str, str],
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` as a fork of ``forks``' server: a process of its own, with its
    exit status, stdout and stderr, but none of a fresh interpreter's start-up and imports
    (what the server preloaded, see ``set_forkserver_preload``, is imported already).

    The child takes ``cwd`` and exactly ``env``, puts ``cwd`` and ``PYTHONPATH`` first on its
    path as ``-m`` does, and imports ``MODULE``'s top-level package afresh from there.
    """
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        child = forks.Process(
            target=_module_as_main, args=([module, *args], str(cwd), env, str(out), str(err))
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join(10)
            raise subprocess.TimeoutExpired([module, *args], timeout)
        return subprocess.CompletedProcess(
            [module, *args], child.exitcode, out.read_text(), err.read_text()
        )


def _module_as_main(command: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: stdout and stderr to files, then run ``command[0]`` (a module) as
    ``__main__`` (multiprocessing turns its SystemExit into the exit status, a traceback
    into 1)."""
    module = command[0]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.path[:0] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    package = module.split(".", maxsplit=1)[0]
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = list(command)  # run_module puts the module's file in sys.argv[0], as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)
