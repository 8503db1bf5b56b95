"""Tracing: the tracer provider from settings and one :class:`RequestTrace` per request.

No global tracer provider is installed: each app builds its own provider and hands it down,
so tests can build several apps (each with an in-memory exporter) in one process. With
tracing off nothing here runs at all. When a request is sampled out, only the incoming or new
trace context is kept, to propagate ``traceparent`` (flag 00) to the backend; no attribute is
built. The stage spans (auth, validate, classify, rate limit) are recorded after the fact from
timestamps the request path marks, so the request path itself never opens or closes them.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config.settings import TelemetrySettings
from gateway.pipeline.events import AttemptEnd, AttemptStart
from gateway.telemetry import semconv as sc
from gateway.telemetry.output_parts import DEFAULT_MAX_CHARS
from gateway.telemetry.spans import AttemptSpan, StageRecorder, server_finish_attributes

if TYPE_CHECKING:
    from opentelemetry.util.types import Attributes

    from gateway.pipeline.context import RequestContext

_HTTP_PROTOBUF = "http/protobuf"
_UNSAMPLED = TraceFlags(TraceFlags.RANDOM_TRACE_ID)  # what the SDK's dropped spans carry
_CLEAN_OUTCOMES = frozenset({sc.OUTCOME_COMPLETE, sc.OUTCOME_CLIENT_DISCONNECT})
# How long a stopping process waits for its queued spans to be exported: a collector that
# accepts and never answers would otherwise hold it for the exporter's timeouts (10 s each,
# twice: the export under way, then the flush), 20 s with nothing in flight.
SPAN_FLUSH_TIMEOUT_S = 2.0
# A caller's ``tracestate`` longer than this is not honoured (not sent to the backends, not
# kept on the spans): W3C Trace Context asks a hop to pass on at least 512 characters and
# lets it drop the rest; 32 members of 256 characters would otherwise reach every backend.
MAX_TRACESTATE = 512


class TracingConfigError(ValueError):
    """An ``OTEL_*`` value the gateway cannot honour."""


def _span_is_current() -> bool:
    """A span is current in the OTel context (the SDK would make the request its child)."""
    return bool(get_current_span().get_span_context().is_valid)


class CallerFlagIgnored(Sampler):
    """Samples a caller's trace at ``ratio`` by a draw of its own, whatever the caller's
    sampled flag says. Not by the trace id, which the caller chose: one whose low bits are
    zero would be sampled every time."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def should_sample(  # noqa: PLR0917  # the SDK's Sampler signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        """Sampled at ``ratio``, the parent's trace state kept."""
        del trace_id, name, kind, links, trace_state
        parent = get_current_span(parent_context).get_span_context()
        sampled = random.random() < self.ratio  # noqa: S311  # a sampling draw, not a secret
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP,
            attributes if sampled else None,
            parent.trace_state if parent.is_valid else None,
        )

    def get_description(self) -> str:
        """The SDK's description of this sampler."""
        return f"CallerFlagIgnored{{{self.ratio}}}"


class RatioSampler(ParentBased):
    """``ParentBased(TraceIdRatioBased(ratio))``, its bound in the open: a new trace is sampled
    when its trace id's low 64 bits are below ``bound`` (the SDK's own rule), so the gateway
    can decide before calling the SDK. Unless callers are trusted, a remote parent's flag is
    not followed: its trace is sampled by :class:`CallerFlagIgnored` (a child of a span in
    this process still follows its parent)."""

    def __init__(self, ratio: float, *, trust_callers: bool = False) -> None:
        root = TraceIdRatioBased(ratio)
        if trust_callers:
            super().__init__(root)
        else:
            drawn = CallerFlagIgnored(ratio)
            super().__init__(root, remote_parent_sampled=drawn, remote_parent_not_sampled=drawn)
        self.bound = root.bound


class DrawnIds(RandomIdGenerator):
    """The SDK's random ids; the next trace id may be one the gateway already drew (to decide
    its sampling), so that the SDK's span carries it."""

    def __init__(self) -> None:
        self.next_trace_id = 0

    def generate_trace_id(self) -> int:
        """The trace id drawn for the span being started, else a random non-zero one."""
        trace_id, self.next_trace_id = self.next_trace_id, 0
        return trace_id or super().generate_trace_id()


def _service_resource(env: Mapping[str, str]) -> Resource:
    attributes: dict[str, str] = {}
    try:
        attributes["service.version"] = version("tiergate")
    except PackageNotFoundError:
        attributes["service.version"] = "unknown"
    named = "OTEL_SERVICE_NAME" in env or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named:
        attributes["service.name"] = "tiergate"
    return Resource.create(attributes)  # the SDK adds OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", _HTTP_PROTOBUF
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415  # grpc loads only when asked for
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()  # endpoint, headers, TLS, timeout: OTEL_EXPORTER_OTLP_* (SDK)
    if protocol == _HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415  # as above
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    raise TracingConfigError(f"unsupported OTLP protocol {protocol!r}: use grpc or http/protobuf")


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default, ``console``, ``none``)."""
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            exporters.append(_otlp_exporter(env))
        elif name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stdout))
        elif name != "none":
            raise TracingConfigError(f"unsupported OTEL_TRACES_EXPORTER {name!r}")
    return exporters


def build_tracer_provider(
    telemetry: TelemetrySettings, span_exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """The provider for these settings, or ``None`` when tracing is off.

    ``span_exporter`` (tests) is attached with a synchronous processor; otherwise exporters
    come from the standard ``OTEL_*`` variables behind a bounded :class:`BatchSpanProcessor`
    (``OTEL_BSP_MAX_QUEUE_SIZE``, default 2048: spans beyond it are dropped, never waited on).
    """
    env = telemetry.otel_env
    if not telemetry.tracing or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    provider = TracerProvider(
        sampler=RatioSampler(
            telemetry.trace_sample_ratio, trust_callers=telemetry.trust_caller_sampling
        ),
        id_generator=DrawnIds(),
        resource=_service_resource(env),
        shutdown_on_exit=False,
    )
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        return provider
    for exporter in exporters_from_env(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Tracing:
    """Starts request traces on one provider; W3C trace context in and out."""

    def __init__(
        self,
        provider: TracerProvider,
        *,
        capture_content: bool,
        stage_spans: bool = False,
        capture_content_max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE)
        self.propagator = TraceContextTextMapPropagator()
        self.capture_content = capture_content
        self.capture_content_max_chars = capture_content_max_chars
        self.stage_spans = stage_spans
        # New traces sampled out are decided here, without the SDK (which would spend ~20 µs
        # building a span nobody records): only with the sampler and ids built above, and
        # only when no span is current (the gateway makes none; an instrumented caller might).
        # The SDK's own span counters (internal metrics, off by default) no longer see them.
        sampler, ids = provider.sampler, provider.id_generator
        self._ids = ids if isinstance(ids, DrawnIds) else None
        self._bound = sampler.bound if isinstance(sampler, RatioSampler) else None

    def start(
        self, ctx: RequestContext, traceparent: str | None, tracestate: str | None
    ) -> RequestTrace | UnsampledTrace:
        """Open the server span (child of an incoming ``traceparent``): the request's trace."""
        ids, bound = self._ids, self._bound
        if traceparent or ids is None or bound is None or _span_is_current():
            return self._start(ctx, traceparent, tracestate)
        trace_id = ids.generate_trace_id()  # random: none is drawn ahead at this point
        if trace_id & TraceIdRatioBased.TRACE_ID_LIMIT >= bound:  # the SDK's rule: sampled out
            return UnsampledTrace(trace_id, ids.generate_span_id())
        ids.next_trace_id = trace_id
        try:
            return self._start(ctx, None, None)
        finally:
            ids.next_trace_id = 0

    def _start(
        self, ctx: RequestContext, traceparent: str | None, tracestate: str | None
    ) -> RequestTrace:
        parent: Context | None = None
        if traceparent:
            carrier = {"traceparent": traceparent}
            if tracestate and len(tracestate) <= MAX_TRACESTATE:
                carrier["tracestate"] = tracestate
            parent = self.propagator.extract(carrier)
        start_ns = time.time_ns() - int((time.perf_counter() - ctx.started) * 1e9)
        span = self.tracer.start_span(
            f"POST {ctx.route}", context=parent, kind=SpanKind.SERVER, start_time=start_ns
        )
        trace = RequestTrace(self, span, start_ns, ctx.started)
        if trace.recording:
            span.set_attributes(
                {
                    sc.HTTP_REQUEST_METHOD: "POST",
                    sc.HTTP_ROUTE: ctx.route,
                    sc.TG_REQUEST_ID: ctx.request_id,
                }
            )
        return trace

    def shutdown(self, timeout_s: float = SPAN_FLUSH_TIMEOUT_S) -> bool:
        """Flush what is queued and stop, waiting at most ``timeout_s``; whether it finished.

        The provider's shutdown runs on a daemon thread of its own: past ``timeout_s`` (an
        export still waiting on the collector) the process goes on stopping and the spans
        still queued are lost with it, as the exporters' own threads are.
        """
        helper = threading.Thread(
            target=self.provider.shutdown, name="tiergate-span-flush", daemon=True
        )
        helper.start()
        helper.join(timeout_s)
        return not helper.is_alive()


def trace_headers(context: SpanContext) -> dict[str, str]:
    """W3C ``traceparent`` (and ``tracestate``) naming ``context`` as the parent."""
    headers = {
        "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-"
        f"{context.trace_flags:02x}"
    }
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()
    return headers


class UnsampledTrace:
    """A new trace sampled out: its ids only, to propagate ``traceparent`` (not sampled) to
    the backend and correlate log lines, exactly as the SDK's non-recording span would."""

    __slots__ = ("_propagated", "_span_id", "_trace_id")

    def __init__(self, trace_id: int, span_id: int) -> None:
        self._trace_id = trace_id
        self._span_id = span_id
        self._propagated: dict[str, str] | None = None

    @property
    def trace_id(self) -> str:
        """The trace id in hex, for log correlation."""
        return format(self._trace_id, "032x")

    @property
    def span_id(self) -> str:
        """The (unrecorded) server span id in hex."""
        return format(self._span_id, "016x")

    def mark(self, stage: str) -> None:
        """Nothing is recorded."""

    def attempt_started(self, ctx: RequestContext, start: AttemptStart) -> Mapping[str, str]:
        """The ``traceparent`` every attempt sends: this trace, flags random id, not sampled."""
        propagated = self._propagated
        if propagated is None:
            context = SpanContext(
                self._trace_id, self._span_id, is_remote=False, trace_flags=_UNSAMPLED
            )
            propagated = self._propagated = trace_headers(context)
        return propagated

    def attempt_ended(self, ctx: RequestContext, end: AttemptEnd) -> None:
        """Nothing is recorded."""

    def on_event(self, event: bytes) -> None:
        """Nothing is recorded."""

    def finish(self, ctx: RequestContext, outcome: str) -> None:
        """Nothing to end."""


class RequestTrace:
    """One request's server span, its stage marks and its open upstream attempt.

    A sampled-out request keeps only its span context: the backend still gets a
    ``traceparent`` (not sampled), and no stage, route or client span is built.
    """

    __slots__ = (
        "_attempt",
        "_propagated",
        "open_attempt",
        "recording",
        "span",
        "stages",
        "tracing",
    )

    def __init__(self, tracing: Tracing, span: Span, start_ns: int, started: float) -> None:
        self.tracing = tracing
        self.span = span
        self.recording = span.is_recording()
        self.stages = (
            StageRecorder(
                tracing.tracer,
                set_span_in_context(span),
                start_ns,
                started,
                spans=tracing.stage_spans,
            )
            if self.recording
            else None
        )
        self.open_attempt: AttemptSpan | None = None
        self._attempt: AttemptSpan | None = None  # the attempt in flight
        self._propagated: dict[str, str] | None = None

    @property
    def trace_id(self) -> str:
        """The trace id in hex, for log correlation."""
        return format(self.span.get_span_context().trace_id, "032x")

    @property
    def span_id(self) -> str:
        """The server span id in hex."""
        return format(self.span.get_span_context().span_id, "016x")

    def mark(self, stage: str) -> None:
        """The request path finished ``stage`` now (recorded only when sampled)."""
        stages = self.stages
        if stages is not None:
            stages.mark(stage)

    def attempt_started(self, ctx: RequestContext, start: AttemptStart) -> Mapping[str, str]:
        """An upstream attempt starts: its ``traceparent`` and, if sampled, its spans."""
        stages = self.stages
        if stages is None:
            propagated = self._propagated
            if propagated is None:
                propagated = self._propagated = trace_headers(self.span.get_span_context())
            return propagated
        route = stages.route(start)
        span = AttemptSpan.start(
            self.tracing.tracer,
            stages.parent,
            ctx,
            start,
            capture=self.tracing.capture_content,
            limit=self.tracing.capture_content_max_chars,
            route=route,
        )
        self._attempt = span
        return trace_headers(span.span.get_span_context())

    def attempt_ended(self, ctx: RequestContext, end: AttemptEnd) -> None:
        """The attempt failed (its span ends with ``error.type``) or opened.

        A complete answer ends the client span now; a stream's ends with the request.
        """
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        if end.failure is not None:
            span.fail(end.failure)
            return
        span.opened(end, ctx)
        if end.body is None:
            self.open_attempt = span  # a stream: its client span ends with the request

    def on_event(self, event: bytes) -> None:
        """One SSE event relayed to the client (finish reasons, opt-in output text)."""
        attempt = self.open_attempt
        if attempt is not None:
            attempt.on_event(event)

    def finish(self, ctx: RequestContext, outcome: str) -> None:
        """End the open attempt, record the stage spans, end the server span."""
        stages = self.stages
        if stages is None:
            self.span.end()
            return
        attempt = self.open_attempt
        if attempt is not None:
            attempt.finish(ctx, outcome)
        span = self.span
        attrs = server_finish_attributes(ctx, outcome)
        stages.finish(ctx, outcome, attrs)
        span.set_attributes(attrs)
        aborted = ctx.status < 400 and outcome not in _CLEAN_OUTCOMES
        if ctx.status >= 500 or aborted:
            span.set_attribute(sc.ERROR_TYPE, outcome)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
