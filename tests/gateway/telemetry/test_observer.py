"""The observer: one access-log line per request with ids, routing, latencies and tokens."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.config.settings import TelemetrySettings
from gateway.pipeline.context import Usage
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.observer import TelemetryObserver
from gateway.telemetry.tracing import Tracing, build_tracer_provider
from tests.gateway.telemetry.factories import finished_context, summary


class CapturedLog:
    """Records ``info`` calls like a structlog logger would receive them."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        """Keep one line."""
        self.lines.append((event, fields))


def _observer(log: CapturedLog, tracing: Tracing | None = None) -> TelemetryObserver:
    metrics = GatewayMetrics(CollectorRegistry(), {}, precise_tier="precise", target_share=0.3)
    return TelemetryObserver(metrics, tracing, access_log=True, logger=log)


def test_one_access_line_with_ids_routing_latencies_and_tokens() -> None:
    """The line says who, where, how it went and how long, and nothing of the content."""
    log = CapturedLog()
    observer = _observer(log)
    ctx = finished_context(stream=True, usage=Usage(12, 5, 0), first_chunk_s=0.05)
    ctx.upstream_s = 0.04
    observer.finished(ctx, "complete")
    ((event, fields),) = log.lines
    assert event == "request.finished"
    assert fields["request_id"] == "req-1"
    assert fields["key_id"] == "auth-disabled"
    assert (fields["tier"], fields["reason"], fields["status"]) == ("fast", "classifier", 200)
    assert (fields["prompt_tokens"], fields["completion_tokens"]) == (12, 5)
    assert fields["ttft_ms"] == 50.0
    assert fields["duration_ms"] >= fields["overhead_ms"] >= 0
    assert fields["trace_id"] is None
    assert not {"prompt", "messages", "authorization", "content"} & set(fields)


def test_the_access_line_carries_trace_and_span_ids_when_tracing() -> None:
    """With tracing on, the line's trace and span ids are the exported server span's."""
    log = CapturedLog()
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider(TelemetrySettings(tracing=True, otel_env={}), exporter)
    assert provider is not None
    observer = _observer(log, Tracing(provider, capture_content=False))
    ctx = finished_context()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx.trace = observer.started(ctx, {"traceparent": parent})
    observer.finished(ctx, "complete")
    (server,) = exporter.get_finished_spans()
    fields = log.lines[0][1]
    assert fields["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert fields["span_id"] == format(server.context.span_id, "016x")


def test_access_log_can_be_switched_off() -> None:
    """telemetry.access_log false: no line, metrics still recorded."""
    log = CapturedLog()
    metrics = GatewayMetrics(CollectorRegistry(), {}, precise_tier="precise", target_share=0.3)
    observer = TelemetryObserver(metrics, None, access_log=False, logger=log)
    observer.finished(finished_context(), "complete")
    assert log.lines == []
    labels = {"route": "/v1/chat/completions", "tier": "fast", "status_class": "2xx"}
    assert metrics.registry.get_sample_value("tiergate_requests_total", labels) == 1.0


def test_the_access_line_quotes_at_most_128_characters_of_the_model() -> None:
    """docs/security.md: the caller's ``model`` is cut to 128 characters in the access log."""
    log = CapturedLog()
    ctx = finished_context()
    ctx.summary = summary(model="m" * 100_000)
    _observer(log).finished(ctx, "complete")
    ((_, fields),) = log.lines
    assert fields["model"] == "m" * 128
