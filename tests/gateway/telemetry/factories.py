"""Small builders of request contexts for the telemetry unit tests."""

from __future__ import annotations

from gateway.pipeline.context import RequestContext, Usage
from policies.principal import DEVELOPMENT_PRINCIPAL
from policies.requests import RequestSummary
from policies.tiering import RouteDecision


def summary(*, stream: bool = False, model: str = "auto") -> RequestSummary:
    """A validated chat request."""
    return RequestSummary(
        kind="chat",
        model=model,
        stream=stream,
        max_tokens=16,
        include_usage=False,
        prompt_chars=40,
        has_tools=False,
        response_format=None,
    )


def finished_context(
    *,
    tier: str = "fast",
    stream: bool = False,
    status: int = 200,
    usage: Usage | None = None,
    first_chunk_s: float | None = None,
    reason: str = "classifier",
) -> RequestContext:
    """A context as the proxy leaves it after a request routed to ``tier``."""
    ctx = RequestContext("req-1", route="/v1/chat/completions")
    ctx.principal = DEVELOPMENT_PRINCIPAL
    ctx.summary = summary(stream=stream)
    ctx.decision = RouteDecision(tier, reason, 0.42 if reason == "classifier" else None)
    ctx.tier = tier
    ctx.replica = "127.0.0.1:8101"
    ctx.attempts = 1
    ctx.status = status
    ctx.admitted = True
    ctx.usage = usage
    ctx.first_chunk_s = first_chunk_s
    return ctx
