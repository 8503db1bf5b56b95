"""``GET /metrics`` in Prometheus text format, restricted to operators.

Two ways, by configuration: on the main port behind the admin token
(``Authorization: Bearer <auth.admin_token>``), or, when ``telemetry.metrics_port`` is set, on
a separate port (meant to be reachable only from the monitoring network) and not on the main
port at all. With authentication disabled (development) and no admin token, the main-port
endpoint is open, like every other route in that mode.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.exposition import start_http_server

from gateway.access.admin_keys import authorization
from policies.errors import AuthenticationFailed, PermissionDenied


def _check(authorization: str | None, admin_token: str | None, open_access: bool) -> None:
    if admin_token is None:
        if open_access:
            return
        raise PermissionDenied(
            "Metrics need the admin token (auth.admin_token) or a separate telemetry.metrics_port."
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), admin_token.encode()
    ):
        raise AuthenticationFailed("The metrics endpoint needs the admin token.")


def metrics_handler(
    registry: CollectorRegistry, admin_token: str | None, *, open_access: bool
) -> HTTPRouteHandler:
    """The main-port ``/metrics`` route for ``registry``."""

    @get("/metrics", sync_to_thread=False, include_in_schema=False)
    def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
        _check(authorization(request), admin_token, open_access)
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
