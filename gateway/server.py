"""Running the app under uvicorn (uvloop + httptools, one process)."""

from __future__ import annotations

import errno
import socket

import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from gateway.telemetry.logging import configure_logging


class ListenError(OSError):
    """The gateway cannot listen where it was told to (port in use, unknown address...)."""


def listen(host: str, port: int) -> socket.socket:
    """A bound socket for ``host:port``, or :class:`ListenError` saying why not."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ListenError(f"cannot listen on {where}: unknown address ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise ListenError(f"cannot listen on {where}: {reason}") from None
    return sock


def serve(settings: Settings) -> None:
    """Serve until interrupted; in-flight streams get ``shutdown_grace_s`` to finish."""
    sock = listen(settings.server.host, settings.server.port)
    try:
        _run(settings, sock)
    finally:
        sock.close()


def _run(settings: Settings, sock: socket.socket) -> None:
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
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        logs.close()
