"""The request observer: opens each request's trace and, when it ends, records everything once.

``finished`` runs exactly once per request (after the last byte of a stream or the error) and
does three cheap things: update the pre-bound metric children, end the spans (only when the
request was sampled), and write the one access-log line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog

from gateway.pipeline.context import RequestContext
from gateway.telemetry import semconv as sc
from gateway.telemetry.logging import access_logger
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import RequestTrace, Tracing, UnsampledTrace

_bind = structlog.contextvars.bind_contextvars


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def access_fields(
    ctx: RequestContext, outcome: str, total_s: float, overhead_s: float
) -> dict[str, Any]:
    """The access-log line's fields: ids, routing, status, latencies, tokens; never content."""
    principal, decision, summary, usage = ctx.principal, ctx.decision, ctx.summary, ctx.usage
    trace = ctx.trace
    return {
        "request_id": ctx.request_id,
        "trace_id": trace.trace_id if trace is not None else None,
        "span_id": trace.span_id if trace is not None else None,
        "key_id": principal.key_id if principal is not None else None,
        "tenant": principal.tenant if principal is not None else None,
        "route": ctx.route,
        "model": summary.model[:128] if summary is not None else None,  # caller-chosen
        "stream": summary.stream if summary is not None else None,
        "tier": ctx.tier or (decision.tier if decision is not None else None),
        "reason": decision.reason if decision is not None else None,
        "score": decision.score if decision is not None else None,
        "fallback_from": ctx.extra_headers.get("x-tiergate-fallback-from"),
        "replica": ctx.replica,
        "status": ctx.status,
        "outcome": outcome,
        "stream_cut": ctx.stream_cut,
        "attempts": ctx.attempts,
        # The x-request-id of the last attempt, as the backend logged it (one per attempt).
        "upstream_request_id": ctx.upstream_request_id if ctx.attempts else None,
        "duration_ms": _ms(total_s),
        "overhead_ms": _ms(overhead_s),
        "upstream_ms": _ms(ctx.upstream_s),
        "ttft_ms": _ms(ctx.first_chunk_s),
        "prompt_tokens": usage.prompt_tokens if usage is not None else None,
        "completion_tokens": usage.completion_tokens if usage is not None else None,
        "cached_tokens": usage.cached_tokens if usage is not None else None,
    }


class TelemetryObserver:
    """Metrics, spans and the access log of every request."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        tracing: Tracing | None,
        *,
        access_log: bool,
        logger: Any = None,
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.access_log = access_log
        self.log = logger  # resolved on first use: logging is configured after the app is built

    def started(
        self, ctx: RequestContext, headers: Mapping[str, str]
    ) -> RequestTrace | UnsampledTrace | None:
        """Bind the request id to this request's log lines; its trace if tracing is on."""
        tracing = self.tracing
        if tracing is None:
            _bind(request_id=ctx.request_id)
            return None
        trace = tracing.start(ctx, headers.get("traceparent"), headers.get("tracestate"))
        _bind(request_id=ctx.request_id, trace_id=trace.trace_id)
        return trace

    def finished(self, ctx: RequestContext, outcome: str) -> None:
        """Record one finished request (called exactly once per request)."""
        total_s = time.perf_counter() - ctx.started
        overhead_s = ctx.overhead_s
        if overhead_s is None:
            overhead_s = max(0.0, total_s - ctx.upstream_s)
        self.metrics.record(ctx, outcome, total_s, overhead_s)
        trace = ctx.trace
        if trace is not None:
            trace.finish(ctx, outcome)
        if self.access_log:
            log = self.log
            if log is None:
                log = self.log = access_logger()
            log.info(sc.EVENT_ACCESS, **access_fields(ctx, outcome, total_s, overhead_s))
