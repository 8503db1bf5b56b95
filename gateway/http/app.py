"""The Litestar app: ``create_app(settings)`` wires what the composition root built.

Every long-lived object is built by :func:`gateway.composition.build_gateway`; this module
adds the two inference endpoints and the start-up and shutdown hooks (which set up the
garbage-collector schedule of :mod:`gateway.http.collector`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import Context
from dataclasses import dataclass
from typing import Any, TypeVar

from litestar import Litestar, Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.response import Stream

from gateway.access.auth import Access
from gateway.config.settings import Settings
from gateway.http import collector
from gateway.http.edge import (
    TOO_LARGE_MESSAGE,
    client_gone,
    header_view,
    refuse_declared_length,
    refuse_read_length,
    run_after_work,
)
from gateway.http.native import CHAT_PATH, COMPLETIONS_PATH
from gateway.http.ops import Readiness
from gateway.http.proxy import ProxyService
from gateway.pipeline.errors import exception_handlers
from gateway.pipeline.replies import Reply
from gateway.routing.accounting import Accounting
from gateway.telemetry import Telemetry
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder
from gateway.upstream.health import HealthMonitor
from policies.errors import PayloadTooLarge

T = TypeVar("T")


class _FrameworkInbound:
    """An inference request as Litestar received it (the app's own routes, the test client)."""

    __slots__ = ("headers", "limit", "request")

    def __init__(self, request: Request[Any, Any, Any], limit: int) -> None:
        self.request = request
        self.limit = limit
        # The edge's header view, as on the native path: one Authorization, merged.
        self.headers: Mapping[str, str] = header_view(request.scope["headers"])

    @property
    def client_host(self) -> str | None:
        """The client's address (asked only when a refusal is logged)."""
        client = self.request.client
        return client.host if client is not None else None

    async def read_body(self) -> bytes:
        """The body, read up to the edge's limit (413 past it, declared or read)."""
        limit = self.limit
        refuse_declared_length(self.headers, limit)
        body = bytearray()
        try:
            async for chunk in self.request.stream():
                body += chunk
                refuse_read_length(len(body), limit)
        except HTTPException as exc:  # Litestar's own check of the same limit
            if exc.status_code == 413:
                raise PayloadTooLarge(TOO_LARGE_MESSAGE) from None
            raise
        return bytes(body)

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """Await ``work`` in this task; if the client leaves first, cancel it.

        One watcher task listens for ``http.disconnect`` and cancels the handler's own task,
        which is cheaper than running ``work`` in a second task and waiting on both.
        """
        handler = asyncio.current_task()
        assert handler is not None  # noqa: S101  # always called from a request task
        gone = False
        receive = self.request.receive

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            handler.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            return await work
        except asyncio.CancelledError:
            if gone:
                handler.uncancel()
                raise client_gone() from None
            raise
        finally:
            watcher.cancel()


async def _after_work(reply: Reply) -> None:
    """A reply's after-work, as Litestar's background task, under the edge's policy."""
    await run_after_work(reply.finish, reply.after)


def _response(reply: Reply) -> Response[Any]:
    """A :class:`Reply` as Litestar's response."""
    has_after = reply.finish is not None or reply.after is not None
    background = BackgroundTask(_after_work, reply) if has_after else None
    if reply.stream is not None:
        return Stream(
            reply.stream,
            status_code=reply.status,
            media_type=reply.media_type,
            headers=reply.headers,
            background=background,
        )
    return Response(
        content=reply.body,
        status_code=reply.status,
        media_type=reply.media_type,
        headers=reply.headers,
        background=background,
    )


@dataclass(frozen=True)
class Gateway:
    """Every long-lived object of one gateway app, built by :func:`build_gateway`."""

    upstream: UpstreamClient
    monitor: HealthMonitor
    readiness: Readiness
    access: Access
    telemetry: Telemetry
    accounting: Accounting
    forwarder: Forwarder
    service: ProxyService
    handlers: Sequence[Any]  # every route but the two inference endpoints


@dataclass
class _Lifecycle:
    """Start-up and shutdown of what the handlers share: the upstream session, health, access."""

    gateway: Gateway
    busy_connections: Callable[[], int]
    collector: asyncio.Task[None] | None = None
    thresholds: tuple[int, int, int] | None = None  # the collector's before start-up

    async def startup(self) -> None:
        gateway = self.gateway
        gateway.monitor.start(gateway.upstream.open())
        await gateway.access.startup()
        await gateway.accounting.startup()
        self.thresholds = collector.settle_at_start()
        self.collector = asyncio.get_running_loop().create_task(
            collector.collect_periodically(self.busy_connections), context=Context()
        )

    async def shutdown(self) -> None:
        gateway = self.gateway
        if self.collector is not None:
            self.collector.cancel()
            self.collector = None
        if self.thresholds is not None:
            collector.unsettle(self.thresholds)
            self.thresholds = None
        await gateway.accounting.shutdown()
        await gateway.monitor.stop()
        await gateway.upstream.close()
        await gateway.access.shutdown()


def app_for(
    gateway: Gateway, settings: Settings, busy_connections: Callable[[], int] = lambda: 0
) -> Litestar:
    """The Litestar app over an already built :class:`Gateway` (the server keeps the gateway
    too: it serves the inference endpoints natively, see :mod:`gateway.http.native`).

    ``busy_connections`` counts the server's connections with a request in progress: full
    garbage collections wait for a quiet moment (:mod:`gateway.http.collector`).
    """
    service = gateway.service
    limit = settings.server.max_body_bytes
    lifecycle = _Lifecycle(gateway, busy_connections)
    telemetry = gateway.telemetry

    @post(CHAT_PATH, status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        return _response(await service.handle(_FrameworkInbound(request, limit), "chat", CHAT_PATH))

    @post(COMPLETIONS_PATH, status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        reply = await service.handle(
            _FrameworkInbound(request, limit), "completion", COMPLETIONS_PATH
        )
        return _response(reply)

    return Litestar(
        route_handlers=[chat, completions, *gateway.handlers],
        exception_handlers=exception_handlers(telemetry.refusals.refused),
        on_startup=[lifecycle.startup, telemetry.startup],
        on_shutdown=[lifecycle.shutdown, telemetry.shutdown],
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        debug=False,
    )
