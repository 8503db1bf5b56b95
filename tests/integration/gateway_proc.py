"""Start the gateway as a real ``tiergate serve`` subprocess on a free port.

    with GatewayProcess({"auth": {"enabled": False}, "tiers": {...}}) as gw:
        ...  # gw.url, gw.pid, gw.log_text(), gw.stop()

``workers`` is passed as ``--workers`` (default 1: one process, whose pid is ``gw.pid``; with
more, ``gw.pid`` is the supervisor's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from tests.processes import free_port, http_answers, kill, terminate, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def fixed_rate_streamer(log_dir: Path, model: str, tokens: int) -> Iterator[str]:
    """The streams benchmark's fixed-rate SSE upstream (``bench/streams/upstream.py``) as a
    real process, answers of up to ``tokens`` paced per request; its base URL."""
    port = free_port()
    log = log_dir / "upstream.log"
    script = REPO_ROOT / "bench" / "streams" / "upstream.py"
    cmd = [sys.executable, str(script), "--port", str(port), "--model", model,
           "--tokens", str(tokens)]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                   what="stream upstream", log=log.read_text)  # fmt: skip
        yield url
    finally:
        terminate(proc)


def tiers_config(fast: list[str], precise: list[str], **tier_options: Any) -> dict[str, Any]:
    """A ``tiers`` mapping for the simulator's default served model names."""
    return {
        "fast": {"model": "tiergate-fast", "replicas": fast, **tier_options},
        "precise": {"model": "tiergate-precise", "replicas": precise, **tier_options},
    }


class GatewayProcess:
    """One ``tiergate serve`` process with a YAML config written to a temporary file."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        env: dict[str, str] | None = None,
        ready_timeout: float = 30.0,
        port: int | None = None,
        workers: int = 1,
        module: str = "gateway",
        output: int | None = None,
        session: bool = False,
    ) -> None:
        self.config = config
        self.output = output  # a file descriptor for stdout and stderr (default: the log file)
        self.session = session  # a session (and process group) of its own, as in a terminal
        self.module = module  # run as ``python -m <module> serve ...``
        self.workers = workers
        self.env = env or {}
        self.ready_timeout = ready_timeout
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory()
        self.config_path = Path(self._dir.name) / "tiergate.yaml"
        self.log_path = Path(self._dir.name) / "gateway.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayProcess:
        """Spawn the gateway and wait until ``/livez`` answers."""
        self.config_path.write_text(yaml.safe_dump(self.config), encoding="utf-8")
        env = {**os.environ, **self.env}
        env.pop("TIERGATE_CONFIG", None)
        command = [
            sys.executable,
            "-m",
            self.module,
            "serve",
            "--config",
            str(self.config_path),
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]
        log = self.log_path.open("wb") if self.output is None else self.output
        self._proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=log, env=env,
                                      start_new_session=self.session)  # fmt: skip
        wait_ready(
            self._proc,
            lambda: http_answers(self.url + "/livez"),
            timeout=self.ready_timeout,
            poll_s=0.1,
            what="gateway",
            log=self.log_text,
        )
        return self

    @property
    def pid(self) -> int:
        """The gateway's process id."""
        assert self._proc is not None
        return self._proc.pid

    def log_text(self) -> str:
        """Everything the process wrote so far (stdout and stderr; empty with ``output``)."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def access_lines(self) -> list[dict[str, Any]]:
        """The access lines (``request.finished``) logged so far, parsed."""
        lines = (json.loads(line) for line in self.log_text().splitlines() if line[:1] == "{")
        return [line for line in lines if line.get("event") == "request.finished"]

    def access_of(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The access line of the request sent with ``request_id`` (waited for)."""
        deadline = time.monotonic() + timeout
        while True:
            for entry in self.access_lines():
                if entry.get("request_id") == request_id:
                    return entry
            assert time.monotonic() < deadline, self.log_text()[-3000:]
            time.sleep(0.05)

    def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Wait until ``/readyz`` answers 200 (every tier has a healthy replica)."""
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, self.log_text()
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, wait, clean up."""
        terminate(self._proc)

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is settled or released) and reap."""
        kill(self._proc)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._dir.cleanup()
