"""Running the app: uvicorn as the process runner (uvloop), our own bounded HTTP protocol."""

from __future__ import annotations

import functools
import socket
import sys
from collections.abc import Callable

import structlog
import uvicorn
from litestar import Litestar

from gateway.config.settings import ServerSettings, Settings
from gateway.http.accept import DrainingServer
from gateway.http.connections import (
    ConnectionGuard,
    ConnectionLimits,
    connection_cap,
    fd_limit,
    raise_fd_limit,
)
from gateway.http.listen import listen
from gateway.http.native import Handler
from gateway.http.protocol import GuardedHttpToolsProtocol
from gateway.telemetry.lifecycle import ServerEvents
from gateway.telemetry.logging import configure_logging
from gateway.upstream.worker_share import WorkerRole

_log = structlog.get_logger("tiergate.server")
# How long a thread may hold the GIL while another waits for it. The event loop shares the GIL
# with the span exporter's thread, whose batches are pure-Python protobuf encoding (about 15 ms
# of CPU for 512 spans). At CPython's default of 5 ms, a request arriving during an export waits
# up to 5 ms at each await that gives the GIL up; at 0.5 ms, up to a tenth of that. In steady
# state at 10 % sampling the interleaved A/B shows no change (bench/results/gil-switch.md).
GIL_SWITCH_INTERVAL_S = 0.0005


def connection_limits(server: ServerSettings) -> ConnectionLimits:
    """The connection bounds of ``server:``, the cap kept below the fd limit."""
    fds = fd_limit()
    cap = connection_cap(server.max_connections, fds)
    if server.max_connections is not None and cap < server.max_connections:
        _log.warning(
            "server.connection_cap_lowered",
            configured=server.max_connections,
            cap=cap,
            fd_limit=fds,
        )
    return ConnectionLimits(
        max_head_bytes=server.max_head_bytes,
        head_timeout_s=server.head_timeout_s,
        body_timeout_s=server.body_timeout_s,
        body_min_rate=server.body_min_rate_bytes_s,
        idle_timeout_s=server.idle_timeout_s,
        write_timeout_s=server.write_timeout_s,
        max_connections=cap,
        over_cap_reserve=server.max_connections_reserve,
    )


# What the server serves over one connection guard: the app and the native inference endpoints
# (built by the composition root: ``gateway.composition.served``).
# (``None`` for the handler: every request goes to the app, as the edge contract tests run it).
Served = Callable[[Settings, ConnectionGuard, "WorkerRole | None"], tuple[Litestar, Handler | None]]


def run(
    settings: Settings,
    served: Served,
    *,
    worker: WorkerRole | None = None,
    sock: socket.socket | None = None,
    logging_ready: Callable[[], None] | None = None,
) -> None:
    """Serve until interrupted; in-flight streams get ``shutdown_grace_s`` to finish.

    A ``worker`` of a group serves on the inherited ``sock`` (see :mod:`gateway.http.workers`).
    ``logging_ready`` runs once logging is configured: start-up lines decided before then
    (``server.workers_defaulted``) are logged there, in the configured format and place.
    """
    own = sock is None
    if sock is None:
        sock = listen(settings.server.host, settings.server.port)
    try:
        _run(settings, served, sock, worker, logging_ready)
    finally:
        if own:
            sock.close()


def _run(
    settings: Settings,
    served: Served,
    sock: socket.socket,
    worker: WorkerRole | None,
    logging_ready: Callable[[], None] | None = None,
) -> None:
    raise_fd_limit()
    limits = connection_limits(settings.server)
    guard = ConnectionGuard(limits)
    app, native = served(settings, guard, worker)  # the composition root builds them
    # After the app: Litestar sets up logging too.
    logs = configure_logging(
        settings.telemetry, worker=worker.index if worker is not None else None
    )
    if logging_ready is not None:
        logging_ready()
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http=functools.partial(GuardedHttpToolsProtocol, guard=guard, native=native),  # type: ignore[arg-type]  # a protocol factory
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,  # uvicorn's records go through our structlog setup
        log_level="warning",
        server_header=False,
        date_header=False,
        # Not armed by the guarded protocol (the guard sweeps idle connections); kept in step.
        timeout_keep_alive=max(1, round(limits.idle_timeout_s)),
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_s),
        proxy_headers=False,
        backlog=2048,
    )
    default_interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        events = ServerEvents(settings, announce=worker is None)
        # A worker leaves SIGINT to its supervisor (see DrainingServer).
        server = DrainingServer(config, events, before_exit=logs.flush, sigint=worker is None)
        server.run(sockets=[sock])
    finally:
        sys.setswitchinterval(default_interval)
        logs.close()
