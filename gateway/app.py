"""The Litestar app: ``create_app(settings)`` wires what the composition root built.

Every long-lived object is built by :func:`gateway.composition.build_gateway`; this module
adds the two inference endpoints, the start-up and shutdown hooks, and the garbage-collector
settings of a long-running server.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from contextvars import Context
from dataclasses import dataclass
from typing import Any

from litestar import Litestar, Request, Response, post
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.registry import Collector

from gateway.composition import Gateway, Overrides, build_gateway
from gateway.errors import EXCEPTION_HANDLERS
from gateway.proxy import RequestObserver
from gateway.settings import Settings
from gateway.worker_share import WorkerRole
from policies.ports import Authenticator, RequestLimiter

_GC_GEN0_THRESHOLD = 10_000
# With start-up objects frozen and the young generation collected less often, a reference
# cycle that reached the old generation could wait a long time for a full collection; one runs
# at least this often, so garbage cycles cost time, never memory that is not given back.
_FULL_COLLECTION_INTERVAL_S = 10.0


async def _collect_garbage_periodically(interval_s: float) -> None:
    """A full garbage collection every ``interval_s`` (start-up objects are frozen: it is short)."""
    while True:
        await asyncio.sleep(interval_s)
        gc.collect()


@dataclass
class _Lifecycle:
    """Start-up and shutdown of what the handlers share: the upstream session, health, access."""

    gateway: Gateway
    collector: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        gateway = self.gateway
        session = gateway.upstream.open()
        gateway.monitor.start(session)
        await gateway.access.startup()
        await gateway.accounting.startup()
        # Everything built so far lives as long as the process: move it out of the collector's
        # reach so full collections stay short (fewer latency spikes under load), and collect
        # the young generation less often (request objects mostly die by reference counting).
        gc.collect()
        gc.freeze()
        gc.set_threshold(_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        self.collector = asyncio.get_running_loop().create_task(
            _collect_garbage_periodically(_FULL_COLLECTION_INTERVAL_S), context=Context()
        )

    async def shutdown(self) -> None:
        gateway = self.gateway
        if self.collector is not None:
            self.collector.cancel()
        await gateway.accounting.shutdown()
        await gateway.monitor.stop()
        await gateway.upstream.close()
        await gateway.access.shutdown()


def create_app(
    settings: Settings,
    *,
    auth: Authenticator | None = None,
    limiter: RequestLimiter | None = None,
    observer: RequestObserver | None = None,
    span_exporter: SpanExporter | None = None,
    collectors: Sequence[Collector] = (),
    worker: WorkerRole | None = None,
) -> Litestar:
    """Build the gateway application for ``settings`` (:func:`build_gateway`) and wire it.

    ``observer`` replaces the telemetry observer; ``span_exporter`` (tests) receives every
    finished span instead of the ``OTEL_*``-configured exporters; ``collectors`` join the
    app's metrics registry (the server's connection counters); ``worker`` says which of
    several workers this process is (one prober, metrics of the whole group).
    """
    overrides = Overrides(auth, limiter, observer, span_exporter, collectors, worker)
    gateway = build_gateway(settings, overrides)
    service = gateway.service
    lifecycle = _Lifecycle(gateway)
    telemetry = gateway.telemetry

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "chat", "/v1/chat/completions")

    @post("/v1/completions", status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "completion", "/v1/completions")

    return Litestar(
        route_handlers=[chat, completions, *gateway.handlers],
        exception_handlers=EXCEPTION_HANDLERS,
        on_startup=[lifecycle.startup, telemetry.startup],
        on_shutdown=[lifecycle.shutdown, telemetry.shutdown],
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        debug=False,
    )
