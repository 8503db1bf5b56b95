"""``GET /metrics`` in Prometheus text format, restricted to operators.

Two ways, by configuration: on the main port behind the admin token
(``Authorization: Bearer <auth.admin_token>``), or, when ``telemetry.metrics_port`` is set, on
a separate port (meant to be reachable only from the monitoring network) and not on the main
port at all. With authentication disabled (development) and no admin token, the main-port
endpoint is open, like every other route in that mode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIServer

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.exposition import start_http_server

from gateway.access.admin_keys import AdminGuard, authorization
from policies.errors import PermissionDenied


def _guard(admin_token: str | None, open_access: bool) -> Callable[[str | None], None]:
    """The check of a caller's Authorization: the admin API's (same codes: 401
    ``missing_admin_token`` / ``invalid_admin_token``, 403 ``admin_required`` for an API key)."""
    if admin_token is not None:
        return AdminGuard(admin_token).check
    if open_access:
        return lambda _: None

    def refuse(_: str | None) -> None:
        raise PermissionDenied(
            "Metrics need the admin token (auth.admin_token) or a separate telemetry.metrics_port."
        )

    return refuse


def metrics_handler(
    registry: CollectorRegistry, admin_token: str | None, *, open_access: bool
) -> HTTPRouteHandler:
    """The main-port ``/metrics`` route for ``registry``."""
    check = _guard(admin_token, open_access)

    @get("/metrics", sync_to_thread=False, include_in_schema=False)
    def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
        check(authorization(request))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


class MetricsServer:
    """A separate plain-HTTP port serving ``registry`` from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def bound_port(self) -> int:
        """The port actually bound (useful with port 0)."""
        if self._server is None:
            return self.port
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind and serve in the background."""
        self._server, self._thread = start_http_server(
            self.port, addr=self.host, registry=self.registry
        )

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
