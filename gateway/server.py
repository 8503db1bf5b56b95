"""Running the app under uvicorn (uvloop + httptools, one process)."""

from __future__ import annotations

import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from gateway.telemetry.logging import configure_logging


def serve(settings: Settings) -> None:
    """Serve until interrupted; in-flight streams get ``shutdown_grace_s`` to finish."""
    app = create_app(settings)
    logs = configure_logging(settings.telemetry)  # after the app: Litestar sets up logging too
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,  # uvicorn's records go through our structlog setup
        log_level="warning",
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_s),
        proxy_headers=False,
    )
    try:
        uvicorn.Server(config).run()
    finally:
        logs.close()
