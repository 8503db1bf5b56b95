"""Running the app under uvicorn (uvloop + httptools, one process)."""

from __future__ import annotations

import uvicorn

from gateway.app import create_app
from gateway.settings import Settings


def serve(settings: Settings) -> None:
    """Serve until interrupted; in-flight streams get ``shutdown_grace_s`` to finish."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_s),
        proxy_headers=False,
    )
    uvicorn.Server(config).run()
