"""Serve an in-process app on a real socket (uvicorn in a background thread).

Tests that need a real HTTP hop but also the app's in-process hooks (an in-memory span
exporter, a captured access logger) use this instead of a ``tiergate serve`` subprocess.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from litestar import Litestar

from tests.processes import free_port, patience


class ServedApp:
    """``with ServedApp(app) as served: httpx.get(served.url + ...)``."""

    def __init__(self, app: Litestar, *, ready_timeout: float = 20.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="served-app", daemon=True)
        self.ready_timeout = ready_timeout

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + patience(self.ready_timeout)
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the app did not start")
            time.sleep(0.02)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
