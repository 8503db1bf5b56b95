"""The spans of one sampled request: stage spans, route spans and GenAI client spans.

Attributes come from an allowlist (``semconv``): ids, tiers, reasons, numbers and model names.
Prompt and completion text are added only when ``telemetry.capture_content`` is on; keys and
``Authorization`` never reach this module.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from gateway.pipeline.events import UNREADABLE_JSON, AttemptEnd, AttemptStart
from gateway.telemetry import semconv as sc
from gateway.telemetry.output_parts import (
    MAX_BACKEND_STRING,
    OutputParts,
    Room,
    backend_string,
)

if TYPE_CHECKING:
    from gateway.pipeline.context import RequestContext

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')
_STAGE_ORDER = ("auth", "validate", "classify", "ratelimit")
_DATA = b"data: "
MAX_FINISH_REASONS = 128


def _decode(raw: bytes) -> Any:
    try:
        return _decoder.decode(raw)
    except UNREADABLE_JSON:
        return None


def _part(p: Mapping[str, Any] | str, room: Room) -> dict[str, Any]:
    if isinstance(p, str):  # a completions prompt's text, or a message's whole content
        return {"type": "text", "content": room.take(p)}
    if p.get("type") == "text":
        text = p.get("text")
        return {"type": "text", "content": room.take(text if isinstance(text, str) else "")}
    return {"type": str(p.get("type"))[:MAX_BACKEND_STRING]}


def _parts(content: object, room: Room) -> list[dict[str, Any]]:
    items = [content] if isinstance(content, str) else content
    out: list[dict[str, Any]] = []
    if isinstance(items, list):
        for p in items:
            if isinstance(p, dict | str):
                if not room.enter():
                    break
                out.append(_part(p, room))
    return out


def input_messages(body: Mapping[str, Any], room: Room) -> str:
    """``gen_ai.input.messages`` (opt-in content capture) as JSON: as much text as ``room``
    takes, in the messages' order, in as many messages and parts as it has entries for
    (``MAX_ENTRIES``)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _encoder.encode(
            [{"role": "user", "parts": _parts(body.get("prompt"), room)}]
        ).decode()
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, dict):
            if not room.enter():
                break
            role = str(m.get("role"))[:MAX_BACKEND_STRING]
            out.append({"role": role, "parts": _parts(m.get("content"), room)})
    return _encoder.encode(out).decode()


def server_finish_attributes(ctx: RequestContext, outcome: str) -> dict[str, Any]:
    """The server span's attributes known at the end of the request."""
    attrs: dict[str, Any] = {
        sc.HTTP_RESPONSE_STATUS_CODE: ctx.status,
        sc.TG_OUTCOME: outcome,
        sc.TG_ATTEMPTS: ctx.attempts,
    }
    decision = ctx.decision
    if decision is not None:
        attrs[sc.TG_TIER] = ctx.tier or decision.tier
        attrs[sc.TG_ROUTE_REASON] = decision.reason
        if decision.score is not None:
            attrs[sc.TG_ROUTE_SCORE] = decision.score
    if ctx.replica is not None:
        attrs[sc.TG_REPLICA] = ctx.replica
    principal = ctx.principal
    if principal is not None:
        attrs[sc.TG_KEY_ID] = principal.key_id
        attrs[sc.TG_TENANT] = principal.tenant
    return attrs


class StageRecorder:
    """Marks of the request path's stages, turned into child spans when the request ends
    (``spans``), or else into duration attributes of the server span."""

    __slots__ = ("marks", "parent", "spans", "start_ns", "started", "tracer")

    def __init__(
        self, tracer: Tracer, parent: Context, start_ns: int, started: float, *, spans: bool
    ) -> None:
        self.tracer = tracer
        self.parent = parent
        self.start_ns = start_ns
        self.started = started
        self.spans = spans
        self.marks: list[tuple[str, float]] = []

    def ns(self, perf: float) -> int:
        """A ``perf_counter`` reading as epoch nanoseconds on this request's time line."""
        return self.start_ns + int((perf - self.started) * 1e9)

    def mark(self, stage: str) -> None:
        """``stage`` ended now."""
        self.marks.append((stage, time.perf_counter()))

    def route(self, start: AttemptStart) -> dict[str, Any]:
        """One replica choice (from ``start.routed_at`` until now): a route span, or else the
        attributes the attempt's client span carries instead."""
        attrs: dict[str, Any] = {
            sc.TG_TIER: start.tier,
            sc.TG_REPLICA: start.replica,
            sc.TG_ROUTE_STRATEGY: start.strategy,
            sc.TG_ROUTE_PREFIX_BLOCKS: start.prefix_blocks,
        }
        if start.prefix_match is not None:
            attrs[sc.TG_ROUTE_PREFIX_MATCH] = start.prefix_match
        if not self.spans:
            attrs[sc.TG_ROUTE_DURATION] = _ms(time.perf_counter() - start.routed_at)
            return attrs
        span = self.tracer.start_span(
            sc.SPAN_ROUTE,
            context=self.parent,
            start_time=self.ns(start.routed_at),
            attributes=attrs,
        )
        span.end()
        return {}

    def _stage(self, ctx: RequestContext, stage: str, begin: float, end: float) -> Span:
        attrs: dict[str, Any] = {}
        if stage == "classify" and ctx.decision is not None:
            decision = ctx.decision
            attrs[sc.TG_TIER] = decision.tier
            attrs[sc.TG_ROUTE_REASON] = decision.reason
            if decision.score is not None:
                attrs[sc.TG_ROUTE_SCORE] = decision.score
        elif stage == "auth" and ctx.principal is not None:
            attrs[sc.TG_KEY_ID] = ctx.principal.key_id
            attrs[sc.TG_TENANT] = ctx.principal.tenant
        elif stage == "ratelimit":
            attrs[sc.TG_RATELIMIT_OUTCOME] = (
                sc.RATELIMIT_ALLOWED if ctx.admitted else sc.RATELIMIT_REJECTED
            )
        return self.tracer.start_span(
            sc.STAGE_SPANS[stage], context=self.parent, start_time=self.ns(begin), attributes=attrs
        )

    def finish(self, ctx: RequestContext, outcome: str, server: dict[str, Any]) -> None:
        """One span per completed stage, plus the stage that failed, if one did; without
        stage spans, their durations and the failed stage go into ``server`` (the server
        span's attributes; they already hold each stage span's own attributes)."""
        stages, failed = self._walk(ctx)
        if not self.spans:
            self._durations(ctx, server, stages, failed)
            return
        for stage, begin, end in stages:
            self._stage(ctx, stage, begin, end).end(end_time=self.ns(end))
        if failed is not None:
            stage, begin = failed
            span = self._stage(ctx, stage, begin, time.perf_counter())
            span.set_attribute(sc.ERROR_TYPE, outcome)
            span.set_status(Status(StatusCode.ERROR))
            span.end()

    def _walk(
        self, ctx: RequestContext
    ) -> tuple[list[tuple[str, float, float]], tuple[str, float] | None]:
        """Each completed stage with its start and end, and the stage that failed (with its
        start) when the request failed before any upstream attempt."""
        begin = self.started
        stages: list[tuple[str, float, float]] = []
        for stage, at in self.marks:
            stages.append((stage, begin, at))
            begin = at
        if ctx.failure is None or ctx.attempts:
            return stages, None
        done = {stage for stage, _ in self.marks}
        failed = next((s for s in _STAGE_ORDER if s not in done), None)
        return stages, (failed, begin) if failed is not None else None

    @staticmethod
    def _durations(
        ctx: RequestContext,
        server: dict[str, Any],
        stages: list[tuple[str, float, float]],
        failed: tuple[str, float] | None,
    ) -> None:
        for stage, begin, end in stages:
            server[sc.TG_STAGE_DURATION.format(stage)] = _ms(end - begin)
        ratelimit_done = any(stage == "ratelimit" for stage, _, _ in stages)
        if ratelimit_done or (failed is not None and failed[0] == "ratelimit"):
            server[sc.TG_RATELIMIT_OUTCOME] = (
                sc.RATELIMIT_ALLOWED if ctx.admitted else sc.RATELIMIT_REJECTED
            )
        if failed is not None:
            stage, begin = failed
            server[sc.TG_STAGE_FAILED] = stage
            server[sc.TG_STAGE_DURATION.format(stage)] = _ms(time.perf_counter() - begin)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


class AttemptSpan:
    """The GenAI client span of one upstream attempt."""

    __slots__ = ("capture", "output", "reasons", "secrets", "slack", "span", "started")

    def __init__(
        self,
        span: Span,
        capture: bool,
        secrets: tuple[str, ...],
        limit: int,
    ) -> None:
        self.span = span
        self.capture = capture
        # The upstream keys, blanked in what the backend wrote (its answer's id, model and
        # finish reasons; with capture, its output)
        self.secrets = secrets
        self.started = time.perf_counter()
        self.reasons: list[str] = []
        self.slack = max(map(len, secrets), default=0)
        self.output = OutputParts(limit, slack=self.slack)

    @classmethod
    def start(
        cls,
        tracer: Tracer,
        parent: Context,
        ctx: RequestContext,
        start: AttemptStart,
        *,
        capture: bool,
        limit: int,
        route: Mapping[str, Any] | None = None,
    ) -> AttemptSpan:
        """Open the client span with the request's allowlisted attributes (and ``route``'s:
        the replica choice, when it has no span of its own)."""
        body = start.body
        summary = ctx.summary
        chat = summary is None or summary.kind == "chat"
        operation = sc.OPERATION_CHAT if chat else sc.OPERATION_TEXT_COMPLETION
        model = str(body.get("model", ""))
        url = urlsplit(start.url)
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: operation,
            sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_VLLM,
            sc.GEN_AI_REQUEST_MODEL: model,
            sc.GEN_AI_REQUEST_STREAM: bool(body.get("stream")),
            sc.SERVER_ADDRESS: url.hostname or "",
            sc.SERVER_PORT: url.port or (443 if url.scheme == "https" else 80),
            sc.TG_TIER: start.tier,
            sc.TG_REPLICA: start.replica,
            sc.TG_ATTEMPT: ctx.attempts,
        }
        for field, name in sc.REQUEST_PARAMETERS:
            value = body.get(field)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attrs[name] = value
        if route:
            attrs.update(route)
        if capture:
            room = Room(limit)
            attrs[sc.GEN_AI_INPUT_MESSAGES] = input_messages(body, room)
            if room.clipped:
                attrs[sc.TG_CONTENT_CLIPPED] = True
        span = tracer.start_span(
            f"{operation} {model}", context=parent, kind=SpanKind.CLIENT, attributes=attrs
        )
        return cls(span, capture, start.secrets, limit)

    def fail(self, kind: str) -> None:
        """The attempt failed: ``error.type`` is the failure kind."""
        self.span.set_attribute(sc.ERROR_TYPE, kind)
        self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()

    def _response(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        for field, name in (("id", sc.GEN_AI_RESPONSE_ID), ("model", sc.GEN_AI_RESPONSE_MODEL)):
            value = data.get(field)
            if isinstance(value, str):
                self.span.set_attribute(name, backend_string(value, self.secrets, self.slack))

    def opened(self, end: AttemptEnd, ctx: RequestContext) -> None:
        """The backend answered; a complete (non-streaming) answer ends the span now."""
        body = end.body
        if body is None:  # a stream: the first event is already read
            if ctx.first_chunk_s is not None:
                offset = self.started - ctx.started
                self.span.set_attribute(
                    sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, max(0.0, ctx.first_chunk_s - offset)
                )
            first = end.first_event
            if first.startswith(_DATA):
                self._response(_decode(first[len(_DATA) :]))
            return
        data = _decode(body)
        self._response(data)
        if isinstance(data, dict):
            choices = data.get("choices")
            if isinstance(choices, list):
                for choice in choices:
                    if isinstance(choice, dict):
                        self._choice(choice)
            usage = data.get("usage")
            if isinstance(usage, dict):
                self._usage(usage)
        self._end_response(None)

    def _choice(self, choice: Mapping[str, Any]) -> None:
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and len(self.reasons) < MAX_FINISH_REASONS:
            self.reasons.append(backend_string(reason, self.secrets, self.slack))
        if self.capture:
            self.output.add(choice)

    def _usage(self, usage: Mapping[str, Any]) -> None:
        for field, name in (
            ("prompt_tokens", sc.GEN_AI_USAGE_INPUT_TOKENS),
            ("completion_tokens", sc.GEN_AI_USAGE_OUTPUT_TOKENS),
        ):
            if isinstance(usage.get(field), int):
                self.span.set_attribute(name, usage[field])
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]
            self.span.set_attribute(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cached)

    def on_event(self, event: bytes) -> None:
        """A relayed SSE event: collect finish reasons (and text, when capturing)."""
        if self.capture and event.startswith(_DATA):
            data = _decode(event[len(_DATA) :])
            choices = data.get("choices") if isinstance(data, dict) else None
            if isinstance(choices, list):
                for choice in choices:
                    if isinstance(choice, dict):
                        self._choice(choice)
            return
        if b'"finish_reason"' in event and len(self.reasons) < MAX_FINISH_REASONS:
            found = [m.decode() for m in _FINISH_REASON.findall(event)]
            self.reasons.extend(found[: MAX_FINISH_REASONS - len(self.reasons)])

    def _end_response(self, error: str | None) -> None:
        span = self.span
        if self.reasons:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, self.reasons)
        if self.capture:
            messages = self.output.encoded(self.reasons, self.secrets)
            span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, messages)
            if self.output.clipped:
                span.set_attribute(sc.TG_CONTENT_CLIPPED, True)
        if error is not None:
            span.set_attribute(sc.ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def finish(self, ctx: RequestContext, outcome: str) -> None:
        """A stream ended with ``outcome``: usage, finish reasons, and the error if any."""
        usage = ctx.usage
        if usage is not None:
            span = self.span
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
            if usage.cached_tokens:
                span.set_attribute(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, usage.cached_tokens)
        self._end_response(None if outcome == sc.OUTCOME_COMPLETE else outcome)
