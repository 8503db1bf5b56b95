"""Per-request state shared by the stages of one request, and the response headers it yields."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.pipeline.events import AttemptEnd, AttemptStart, Usage
from gateway.pipeline.ids import fresh_id
from policies.errors import RateLimited, TierGateError
from policies.principal import Principal
from policies.redaction import looks_like_secret
from policies.requests import RequestSummary
from policies.tiering import RouteDecision

__all__ = [  # Usage is re-exported: the context's token counts
    "Failure",
    "RequestContext",
    "Trace",
    "Usage",
    "request_id_from",
]


class Trace(Protocol):
    """What the request path asks of a request's trace (``telemetry.tracing.RequestTrace``).

    A port, so that the context does not import the telemetry package (which imports it).
    """

    @property
    def trace_id(self) -> str:
        """The trace id in hex."""
        ...

    @property
    def span_id(self) -> str:
        """The server span's id in hex."""
        ...

    def mark(self, stage: str) -> None:
        """The request path finished ``stage``."""
        ...

    def on_event(self, event: bytes) -> None:
        """One SSE event relayed to the client."""
        ...

    def attempt_started(self, ctx: RequestContext, start: AttemptStart) -> Mapping[str, str]:
        """An upstream attempt starts; the trace context to send with it."""
        ...

    def attempt_ended(self, ctx: RequestContext, end: AttemptEnd) -> None:
        """The upstream attempt started last ended (its client span ends, unless a stream)."""
        ...

    def finish(self, ctx: RequestContext, outcome: str) -> None:
        """End the request's spans."""
        ...


_MAX_REQUEST_ID = 128


def request_id_from(header: str | None) -> str:
    """Echo a caller's request id when it is sane, otherwise make one (also in place of one
    shaped like a credential: the id is logged here and by every backend)."""
    if (
        header
        and len(header) <= _MAX_REQUEST_ID
        and header.isprintable()
        and not looks_like_secret(header)
    ):
        return header
    return fresh_id()


@dataclass(frozen=True, slots=True)
class Failure:
    """What a request ended with, as plain values.

    The exception itself is never kept: its traceback holds the frames of the request (and
    so its body), and an exception stored on the context it is raised through forms a
    reference cycle that only a full garbage collection would free.
    """

    kind: str
    status: int
    code: str | None = None
    limit: str | None = None
    # A rate-limit refusal (RateLimited or a subclass: the key limiter and budgets raise
    # subclasses, so the class name alone does not say it).
    rate_limited: bool = False

    @classmethod
    def of(cls, exc: TierGateError) -> Failure:
        """The values of ``exc`` the telemetry needs."""
        limit = getattr(exc, "limit", None)
        return cls(
            type(exc).__name__,
            exc.status,
            exc.code,
            limit if isinstance(limit, str) else None,
            rate_limited=isinstance(exc, RateLimited),
        )


@dataclass(slots=True)
class RequestContext:
    """Everything one request accumulates on its way through the gateway."""

    request_id: str
    route: str
    started: float = field(default_factory=time.perf_counter)
    upstream_s: float = 0.0
    principal: Principal | None = None
    summary: RequestSummary | None = None
    decision: RouteDecision | None = None
    tier: str | None = None
    replica: str | None = None
    attempts: int = 0
    status: int = 0
    usage: Usage | None = None
    first_chunk_s: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    upstream_request_id: str = ""
    # Telemetry: the trace (None unless tracing is on), the error the request ended with,
    # whether it passed the rate limits, the overhead when the response headers were built.
    trace: Trace | None = None
    failure: Failure | None = None
    admitted: bool = False
    overhead_s: float | None = None
    prefix_match: bool | None = None
    # Why a started stream did not reach the caller complete (``gateway.upstream.stream_cuts.Cut``).
    stream_cut: str | None = None

    def mark(self, stage: str) -> None:
        """The request path finished ``stage`` (auth, validate, classify, ratelimit)."""
        trace = self.trace
        if trace is not None:
            trace.mark(stage)

    def overhead_ms(self) -> float:
        """Gateway time so far, upstream waiting excluded, in milliseconds."""
        return max(0.0, (time.perf_counter() - self.started - self.upstream_s) * 1000.0)

    def headers(self) -> dict[str, str]:
        """The ``x-tiergate-*`` response headers for what is known now."""
        out = {"x-request-id": self.request_id}
        decision = self.decision
        if decision is not None:
            out["x-tiergate-tier"] = self.tier or decision.tier
            out["x-tiergate-route-reason"] = decision.reason
            if decision.score is not None:
                out["x-tiergate-route-score"] = f"{decision.score:.4f}"
        if self.attempts:
            out["x-tiergate-attempts"] = str(self.attempts)
        out.update(self.extra_headers)
        overhead_ms = self.overhead_ms()
        if self.overhead_s is None:
            self.overhead_s = overhead_ms / 1000.0
        out["x-tiergate-overhead-ms"] = f"{overhead_ms:.3f}"
        return out


class RequestObserver(Protocol):
    """Receives each finished request (telemetry: access log, metrics, spans)."""

    def started(self, ctx: RequestContext, headers: Mapping[str, str]) -> Trace | None:
        """Called once per request, first (binds log context); the request's trace, if any."""
        ...

    def finished(self, ctx: RequestContext, outcome: str) -> None:
        """Called once per request, after its last byte or its error."""
        ...
