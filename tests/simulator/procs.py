"""Start the simulator as a real subprocess, for these tests and the gateway's integration tests.

with SimulatorProcess("--profile", "fast", "--latency-scale", "0") as sim:
    ...  # sim.url, sim.stats(), sim.set_faults(fail_500=1.0), sim.kill()
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.processes import kill, load_per_core, patience, terminate

REPO_ROOT = Path(__file__).resolve().parents[2]
SimulatorFactory = Callable[..., "SimulatorProcess"]
_READY = re.compile(r"simulator listening on (http://(\S+):(\d+))")


class SimulatorProcess:
    """One ``python -m simulator --port 0 ...`` process; ``args`` are extra CLI options."""

    def __init__(self, *args: str, ready_timeout: float = 20.0) -> None:
        self.args = list(args)
        self.ready_timeout = ready_timeout
        self.url = ""
        self.host = ""
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()

    def start(self) -> SimulatorProcess:
        """Spawn the process and wait for its ``listening`` line (``patience``-stretched)."""
        command = [sys.executable, "-m", "simulator", "--port", "0", *self.args]
        self._proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        stdout = self._proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + patience(self.ready_timeout)
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.5)
            line = stdout.readline() if ready else ""
            match = _READY.search(line)
            if match:
                self.url, self.host, self.port = match[1], match[2], int(match[3])
                return self
            if self._proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(
            f"simulator did not start (load per core {load_per_core():.1f}): {self.stderr_text()}"
        )

    @property
    def pid(self) -> int:
        """The process id."""
        assert self._proc is not None
        return self._proc.pid

    def stderr_text(self) -> str:
        """Whatever the process wrote to stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read()

    def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - local http URL built by us
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - same
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        """``GET /sim/stats``."""
        result: dict[str, Any] = self._call("GET", "/sim/stats")
        return result

    def set_faults(self, **changes: float | bool) -> dict[str, Any]:
        """``POST /sim/faults`` with e.g. ``fail_500=1.0`` or ``healthy=False``."""
        result: dict[str, Any] = self._call("POST", "/sim/faults", dict(changes))
        return result

    def reset(self) -> dict[str, Any]:
        """``POST /sim/reset``: zero the counters."""
        result: dict[str, Any] = self._call("POST", "/sim/reset", {})
        return result

    async def astats(self) -> dict[str, Any]:
        """``stats()`` without blocking the event loop."""
        return await asyncio.to_thread(self.stats)

    async def aset_faults(self, **changes: float | bool) -> dict[str, Any]:
        """``set_faults()`` without blocking the event loop."""
        return await asyncio.to_thread(lambda: self.set_faults(**changes))

    def metrics_text(self) -> str:
        """The raw ``/metrics`` page."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:  # noqa: S310 - local
            text: str = response.read().decode()
            return text

    def kill(self) -> None:
        """SIGKILL the process (simulates a crashed replica) and reap it."""
        kill(self._proc)

    def stop(self) -> None:
        """SIGTERM, wait, and release resources."""
        terminate(self._proc, timeout=5)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@pytest.fixture
def start_simulator() -> Iterator[SimulatorFactory]:
    """A factory: ``start_simulator("--echo", ...)`` returns a running SimulatorProcess."""
    started: list[SimulatorProcess] = []

    def start(*args: str) -> SimulatorProcess:
        sim = SimulatorProcess(*args).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()
