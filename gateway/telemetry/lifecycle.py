"""The server's own life in the log: ``server.started``, ``server.draining``, ``server.stopped``.

``server.started`` says where the gateway listens, how many workers serve, which tiers it
routes to (model and replica count: never a URL, which may carry credentials) and which key
store and rate-limit backend it uses; secrets (keys, the admin token, passwords) are never
among its fields. On SIGTERM, ``server.draining`` counts the requests in flight and
``server.stopped`` how many of them finished within ``server.shutdown_grace_s`` (drained) and
how many were cancelled at the deadline (cut). With several workers the supervisor writes
``server.started`` once and each worker ``server.worker_started`` when it serves (again, after
a restart) and its own ``server.draining`` and ``server.stopped``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Collection
from typing import Any

import structlog

from gateway.config.pricing import price_warnings
from gateway.config.settings import Settings
from gateway.telemetry import semconv as sc

_log = structlog.get_logger("tiergate.server")


def started_fields(settings: Settings, *, port: int, workers: int) -> dict[str, Any]:
    """The fields of ``server.started``: no URL, key, token or password among them."""
    auth = settings.auth
    metrics_port = settings.telemetry.metrics_port
    return {
        "host": settings.server.host,
        "port": port,
        "workers": workers,
        "pid": os.getpid(),
        "tiers": {
            name: {"model": tier.model, "replicas": len(tier.replicas)}
            for name, tier in settings.tiers.items()
        },
        "auth": auth.store if auth.enabled else "off",
        "admin_api": auth.enabled and (auth.admin_token or auth.admin_token_file) is not None,
        "ratelimit": settings.ratelimit.backend,
        "metrics": "main_port" if metrics_port is None else metrics_port,
        "shutdown_grace_s": settings.server.shutdown_grace_s,
    }


def log_started(settings: Settings, *, port: int, workers: int) -> None:
    """Write ``server.started``, then a warning for each price that makes the fast tier dearer
    than the precise one (``tiergate config check`` flags the same)."""
    _log.info(sc.EV_SERVER_STARTED, **started_fields(settings, port=port, workers=workers))
    for warning in price_warnings(settings.tiers, settings.router):
        _log.warning(
            sc.EV_PRICES_INVERTED,
            setting=warning.setting,
            price=warning.price,
            value=warning.value,
            precise_value=warning.precise_value,
            message=warning.message(),
        )


class ServerEvents:
    """What one serving process logs as it starts and as it drains."""

    def __init__(self, settings: Settings, *, announce: bool) -> None:
        self.settings = settings
        self.announce = announce  # False in a worker: the supervisor announces the group
        self._in_flight: list[asyncio.Task[Any]] = []
        self._since = 0.0

    def started(self, port: int) -> None:
        """The server accepts connections on ``port``."""
        if self.announce:
            log_started(self.settings, port=port, workers=1)
        else:  # one of several workers (also one restarted after a crash)
            _log.info(sc.EV_WORKER_STARTED, port=port, pid=os.getpid())

    def draining(self, tasks: Collection[asyncio.Task[Any]], connections: int) -> None:
        """Shutdown began: ``tasks`` are the requests being answered."""
        self._in_flight = list(tasks)
        self._since = time.monotonic()
        _log.info(
            sc.EV_SERVER_DRAINING,
            in_flight=len(self._in_flight),
            connections=connections,
            grace_s=self.settings.server.shutdown_grace_s,
        )

    def stopped(self) -> None:
        """Shutdown ended: requests in flight at its start finished (drained) or not (cut)."""
        drained = sum(1 for t in self._in_flight if t.done() and not t.cancelled())
        _log.info(
            sc.EV_SERVER_STOPPED,
            drained=drained,
            cut=len(self._in_flight) - drained,
            drain_s=round(time.monotonic() - self._since, 3),
        )
        self._in_flight = []
