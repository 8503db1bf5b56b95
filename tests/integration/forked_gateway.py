"""``tiergate serve`` forked from a process that imported the gateway once.

    with ForkedGateway({"auth": {"enabled": False}, "tiers": {...}}) as gw:
        ...  # as GatewayProcess: gw.url, gw.pid, gw.log_text(), gw.stop(), gw.kill()

``GatewayProcess`` runs ``python -m gateway serve``: every start pays a new interpreter and
the gateway's imports, about 2 s of the 2.4 s of CPU a start costs on the 2-core build
machine. ``ForkedGateway`` runs the same command line (``gateway.__main__.main``) in a child of
multiprocessing's fork server, which imports the serving modules once per test process (the
first start pays them), so a start costs about 0.4 s. The gateway is still a process of its
own: its own pid (signals, SIGKILL), listening socket, log file and exit code; with
``workers`` its supervisor still starts that many ``python -m gateway`` workers.

Use it where the interpreter's start is not what a test is about: never for start-up failures
and their output, ``python -m gateway`` itself, or behaviour fixed at import time. The child
takes its environment (``env`` over this process's, ``TIERGATE_CONFIG`` dropped, as
``GatewayProcess``) when it starts, not when its interpreter did: ``PYTHON*`` variables have
no effect there.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from multiprocessing.process import BaseProcess
from typing import Final

import yaml

from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import dump_stacks, http_answers, load_per_core, patience

# What ``serve`` imports (``gateway/__main__.py`` defers most of it to the command), and this
# module for the child's target; ``__main__`` is a pytest run's script, skipped under xdist.
PRELOAD: Final = [
    "__main__",
    "gateway.__main__",
    "gateway.access.auth",
    "gateway.composition",
    "gateway.http.workers",
    "gateway.telemetry.logging",
    __name__,
]
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(PRELOAD)


def _serve(argv: list[str], env: dict[str, str], log: str) -> None:
    """In the fork: this environment, stdout and stderr to ``log``, then the command."""
    os.chdir(REPO_ROOT)
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from gateway.__main__ import main  # preloaded in the fork server: a dictionary lookup

    sys.argv = ["tiergate", *argv]
    sys.exit(main(argv))


class ForkedGateway(GatewayProcess):
    """``GatewayProcess``, forked from the pre-imported fork server (``output`` not taken)."""

    _child: BaseProcess | None = None

    def start(self) -> ForkedGateway:
        """Fork the gateway and wait until ``/livez`` answers (``patience``-stretched)."""
        if self.output is not None or self.module != "gateway":
            raise ValueError("ForkedGateway runs `gateway serve` into its log file only")
        self.config_path.write_text(yaml.safe_dump(self.config), encoding="utf-8")
        self.log_path.write_bytes(b"")
        env = {**os.environ, **self.env}
        env.pop("TIERGATE_CONFIG", None)
        argv = ["serve", "--config", str(self.config_path), "--port", str(self.port),
                "--workers", str(self.workers)]  # fmt: skip
        child = _FORKS.Process(target=_serve, args=(argv, env, str(self.log_path)), daemon=True)
        child.start()
        self._child = child
        self._wait_live()
        return self

    def __enter__(self) -> ForkedGateway:
        return self.start()

    def _wait_live(self) -> None:
        """``tests.processes.wait_ready`` for a fork: fail at once if it exits, and after the
        stretched timeout (killed) with its log."""
        assert self._child is not None
        start = time.monotonic()
        waited = 0.0
        while waited < patience(self.ready_timeout):
            if self._child.exitcode is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log_text()}")
            if http_answers(self.url + "/livez"):
                return
            time.sleep(0.1)
            waited = time.monotonic() - start
        dump_stacks(self.pid)  # every thread's stack into the log, before the kill
        self.kill()
        raise RuntimeError(
            f"gateway did not become ready in {waited:.0f} s (load per core "
            f"{load_per_core():.1f}):\n{self.log_text()}"
        )

    @property
    def pid(self) -> int:
        """The gateway's process id (its supervisor's, with several workers)."""
        assert self._child is not None
        assert self._child.pid is not None
        return self._child.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit status (minus the signal that ended it) after."""
        return None if self._child is None else self._child.exitcode

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the gateway to exit on its own; its exit status
        (as ``exitcode``: None if it still runs)."""
        assert self._child is not None
        self._child.join(timeout)
        return self.exitcode

    def stop(self) -> None:
        """SIGTERM, wait up to 10 s, then SIGKILL (``tests.processes.terminate``)."""
        child = self._child
        if child is not None and child.exitcode is None:
            child.terminate()
            child.join(10)
            if child.exitcode is None:
                self.kill()

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is settled or released) and wait for it."""
        child = self._child
        if child is not None and child.exitcode is None:
            child.kill()
            child.join(10)
