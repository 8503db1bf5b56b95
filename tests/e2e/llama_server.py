"""A real llama.cpp inference server (``llama_cpp.server``) as a subprocess, for the e2e suite.

    with LlamaServer(python, model, alias="smollm2-fast") as server:
        ...  # server.url, server.pid, server.log_text(), server.kill(), server.connections()

The server runs from its own virtualenv (``.e2e/venv``, built by ``scripts/e2e.sh``), serves
one GGUF model under ``alias``, and is ready once ``/v1/models`` answers.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from tests.processes import free_port, http_answers, kill, terminate, wait_ready

# Tiny contexts keep start-up and memory small; the suite's prompts are short.
_CONTEXT_TOKENS = 1024


class LlamaServer:
    """One ``python -m llama_cpp.server`` process serving ``model`` as ``alias``."""

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        alias: str,
        ready_timeout: float = 60.0,
        interrupt_requests: bool = False,
        context_tokens: int = _CONTEXT_TOKENS,
    ) -> None:
        # interrupt_requests: the server's own default (True) ends a running stream with
        # [DONE] when another request waits; the suite turns it off unless a test needs it.
        self.interrupt_requests = interrupt_requests
        self.context_tokens = context_tokens
        self.python = python
        self.model = model
        self.alias = alias
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115  # closed in stop()
            prefix=f"llama-{alias}-", suffix=".log"
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The server's command line."""
        return [
            str(self.python),
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--model_alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.context_tokens),
            "--n_threads",
            "1",
            # When True, a queued request makes the server end the running stream early.
            "--interrupt_requests",
            str(self.interrupt_requests),
        ]

    def start(self) -> LlamaServer:
        """Spawn the server and wait until it lists its model."""
        if self._proc is not None:
            raise RuntimeError("this llama server was started already")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        wait_ready(
            self._proc,
            lambda: http_answers(self.url + "/v1/models", timeout=2),
            timeout=self.ready_timeout,
            poll_s=0.2,
            what="llama server",
            log=self.log_text,
        )
        return self

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self._proc is not None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        """Everything the server printed so far."""
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def established_peers(self) -> list[int]:
        """Client ports of the TCP connections established to this server right now."""
        wanted = f"{self.port:04X}"
        peers: list[int] = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                local, remote, state = fields[1], fields[2], fields[3]
                if state == "01" and local.rsplit(":", 1)[1] == wanted:  # 01: ESTABLISHED
                    peers.append(int(remote.rsplit(":", 1)[1], 16))
        return peers

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        kill(self._proc)

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL if needed."""
        terminate(self._proc)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._log.close()
