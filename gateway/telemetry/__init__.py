"""Observability: traces (OpenTelemetry), metrics (Prometheus) and logs (structlog).

``build_telemetry`` is called by ``create_app`` and returns everything the app wires in: the
request observer, the ``/metrics`` route (or a separate metrics port) and the start-up and
shutdown hooks. Names live in :mod:`gateway.telemetry.semconv`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry

from gateway.config.router_settings import RouterSettings
from gateway.config.settings import TelemetrySettings
from gateway.telemetry import semconv as sc
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.metrics_endpoint import MetricsServer, metrics_handler
from gateway.telemetry.observer import TelemetryObserver
from gateway.telemetry.refusals import AuthRefusals
from gateway.telemetry.tracing import SPAN_FLUSH_TIMEOUT_S, Tracing, build_tracer_provider
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.worker_share import GroupMetrics, WorkerRole

__all__ = ["Telemetry", "TelemetryObserver", "build_telemetry"]

_log = structlog.get_logger("tiergate.telemetry")


@dataclass
class Telemetry:
    """The telemetry of one app."""

    observer: TelemetryObserver
    registry: CollectorRegistry
    metrics: GatewayMetrics
    tracing: Tracing | None
    refusals: AuthRefusals
    handlers: list[Any] = field(default_factory=list)
    metrics_server: MetricsServer | None = None
    group: GroupMetrics | None = None

    async def startup(self) -> None:
        """Open the separate metrics port, if configured; share metrics with other workers."""
        if self.metrics_server is not None:
            self.metrics_server.start()
        if self.group is not None:
            self.group.start()

    async def shutdown(self) -> None:
        """Close the metrics port; flush queued spans without blocking the loop (at most
        ``SPAN_FLUSH_TIMEOUT_S``: a collector that never answers does not hold the stop)."""
        if self.group is not None:
            await self.group.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.tracing is not None and not await asyncio.to_thread(self.tracing.shutdown):
            _log.warning(sc.EV_SPANS_UNFLUSHED, timeout_s=SPAN_FLUSH_TIMEOUT_S)


def build_telemetry(
    t: TelemetrySettings,
    pools: Mapping[str, ReplicaPool],
    *,
    router: RouterSettings,
    metrics_host: str,
    admin_token: str | None,
    open_metrics: bool,
    span_exporter: SpanExporter | None = None,
    access_logger: Any = None,
    worker: WorkerRole | None = None,
) -> Telemetry:
    """Metrics registry, tracer provider and observer for the telemetry settings ``t``.

    ``router`` names the precise tier and its target share (a gauge); the metrics port, if
    any, listens on ``metrics_host``; ``/metrics`` on the main port needs ``admin_token``
    unless ``open_metrics`` (auth off). ``span_exporter`` replaces the ``OTEL_*``-configured
    exporters (tests use an in-memory one); ``access_logger`` replaces the structlog
    ``tiergate.access`` logger. With a ``worker`` of several, ``/metrics`` serves every
    worker's samples (labelled ``worker``), and only the leader opens a separate metrics port.
    """
    registry = CollectorRegistry(auto_describe=True)
    metrics = GatewayMetrics(
        registry,
        pools,
        precise_tier=router.precise_tier,
        target_share=router.target_precise_share,
    )
    provider = build_tracer_provider(t, span_exporter)
    tracing = (
        Tracing(
            provider,
            capture_content=t.capture_content,
            stage_spans=t.stage_spans,
            capture_content_max_chars=t.capture_content_max_chars,
        )
        if provider
        else None
    )
    observer = TelemetryObserver(metrics, tracing, access_log=t.access_log, logger=access_logger)
    telemetry = Telemetry(observer, registry, metrics, tracing, AuthRefusals(metrics.auth_refusals))
    exposed = registry
    if worker is not None and worker.count > 1:
        telemetry.group = GroupMetrics(worker, registry)
        exposed = CollectorRegistry(auto_describe=False)
        exposed.register(telemetry.group)
    if t.metrics_port is not None:
        if worker is None or worker.leader:
            telemetry.metrics_server = MetricsServer(exposed, metrics_host, t.metrics_port)
    else:
        telemetry.handlers.append(metrics_handler(exposed, admin_token, open_access=open_metrics))
    return telemetry
