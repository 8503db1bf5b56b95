"""The group's reaper: ends what a killed supervisor leaves of ``tiergate serve --workers N``.

When the supervisor dies the kernel sends each worker SIGTERM (``PR_SET_PDEATHSIG``) and a
running worker drains and exits. A worker stopped at that moment (SIGSTOP) keeps the signal
pending and never acts on it, and one whose event loop is wedged takes it but never drains:
either would hold the listening socket for ever, with nobody left to kill it. (A worker whose
stop and SIGTERM both arrive before it runs again may die anyway: the lower-numbered SIGTERM
is taken first and, before start-up installed its handler, ends it.)

So the supervisor starts this small process first (stdlib only, detached by a double fork,
so it is not one of the supervisor's children and holds none of its descriptors but one end
of a Unix socket) and passes it a pidfd of every worker it starts. A pidfd, not a pid: a
worker's number may be reused once it exited. When the socket reaches its end (the
supervisor exited, however it exited) the reaper sends every worker still there SIGTERM and
SIGCONT (a stopped one then drains like the rest), waits ``--grace`` seconds (the
supervisor's own ``shutdown_grace_s`` + 10 s) for them to exit, SIGKILLs those left (wedged)
and removes the group's directory. SIGHUP, SIGINT and SIGTERM are ignored: it ends with the
supervisor, not with its signals. It runs in a session of its own, so a kill of the group's
process group leaves it to remove the directory (the workers are gone then: it exits at once);
a cgroup kill (a container, systemd) still takes it along. After a clean stop every worker has
exited already and it just leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

_MAX_FDS = 16  # pidfds one message may carry (the supervisor sends one at a time)


def _signal(pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited meanwhile
        signal.pidfd_send_signal(pidfd, signum)


def watch(sock: socket.socket) -> set[int]:
    """Collect the workers' pidfds until the supervisor's end closes; those still running."""
    workers: set[int] = set()
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is not sock:  # a pidfd is readable once its process exited
                    sel.unregister(key.fd)
                    workers.discard(key.fd)
                    os.close(key.fd)
                    continue
                data, fds, _, _ = socket.recv_fds(sock, 16, _MAX_FDS)
                if not data and not fds:
                    return workers
                for fd in fds:
                    workers.add(fd)
                    sel.register(fd, selectors.EVENT_READ)


def finish(workers: set[int], grace_s: float) -> None:
    """SIGTERM and SIGCONT to every worker, SIGKILL to those still there after ``grace_s``."""
    for pidfd in workers:
        _signal(pidfd, signal.SIGTERM)
        _signal(pidfd, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    with selectors.DefaultSelector() as sel:
        for pidfd in workers:
            sel.register(pidfd, selectors.EVENT_READ)
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sel.unregister(key.fd)
    for pidfd in workers:
        _signal(pidfd, signal.SIGKILL)
        os.close(pidfd)


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.http.reaper --fd N --share-dir DIR --grace SECONDS``."""
    parser = argparse.ArgumentParser(prog="gateway.http.reaper")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--share-dir", type=Path, required=True)
    parser.add_argument("--grace", type=float, required=True)
    args = parser.parse_args(argv)
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    if os.fork() > 0:  # the supervisor waits for this first process only
        os._exit(0)
    # Out of the group's process group: a kill of that group (``kill -KILL -PGID``) ends the
    # workers with the supervisor, and this process is left to remove their directory.
    os.setsid()
    with socket.socket(fileno=args.fd) as sock:
        workers = watch(sock)
    finish(workers, args.grace)
    shutil.rmtree(args.share_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
