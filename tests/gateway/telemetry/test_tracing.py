"""Tracing without a network: provider from settings, sampling, propagation, content capture."""

from __future__ import annotations

import json
from typing import TypedDict, Unpack

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, use_span

from gateway.config.settings import TelemetrySettings
from gateway.pipeline.context import Failure, RequestContext
from gateway.pipeline.events import AttemptEnd, AttemptStart
from gateway.telemetry.tracing import (
    DrawnIds,
    RequestTrace,
    Tracing,
    TracingConfigError,
    UnsampledTrace,
    build_tracer_provider,
    exporters_from_env,
    trace_headers,
)
from policies.errors import AuthenticationFailed
from tests.gateway.telemetry.factories import summary

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ANSWER = {
    "id": "chatcmpl-1",
    "model": "tiergate-fast",
    "usage": {"prompt_tokens": 9, "completion_tokens": 2},
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hi there"},
        }
    ],
}
BODY = {
    "model": "tiergate-fast",
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 8,
    "temperature": 0.5,
    "user": "someone@example.com",
}


class _Options(TypedDict, total=False):
    """The telemetry settings a test varies."""

    trace_sample_ratio: float
    capture_content: bool
    stage_spans: bool
    trust_caller_sampling: bool


def _tracing(exporter: InMemorySpanExporter, **options: Unpack[_Options]) -> Tracing:
    settings = TelemetrySettings(tracing=True, otel_env={}, **options)
    provider = build_tracer_provider(settings, exporter)
    assert provider is not None
    return Tracing(
        provider, capture_content=settings.capture_content, stage_spans=settings.stage_spans
    )


async def _one_request(
    tracing: Tracing, traceparent: str | None = None, tracestate: str | None = None
) -> dict[str, str]:
    """Run a non-streaming request's telemetry around a fake upstream; return sent headers."""
    ctx = RequestContext("req-1", route="/v1/chat/completions")
    ctx.summary = summary()
    trace = ctx.trace = tracing.start(ctx, traceparent, tracestate)
    for stage in ("auth", "validate", "classify", "ratelimit"):
        trace.mark(stage)
    ctx.admitted = True
    start = AttemptStart(
        "fast", "127.0.0.1:9", "http://127.0.0.1:9", "round_robin", ctx.started, 0, None, "u1", BODY
    )
    ctx.attempts = 1
    sent = {"x-request-id": "req-1", **trace.attempt_started(ctx, start)}
    trace.attempt_ended(ctx, AttemptEnd(0.001, body=json.dumps(ANSWER).encode()))
    ctx.status = 200
    trace.finish(ctx, "complete")
    return sent


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_tracing_is_off_by_default() -> None:
    """Default settings build no provider at all (nothing runs, nothing is exported)."""
    assert build_tracer_provider(TelemetrySettings()) is None
    disabled = TelemetrySettings(tracing=True, otel_env={"OTEL_SDK_DISABLED": "true"})
    assert build_tracer_provider(disabled) is None


def test_exporters_follow_the_standard_environment_variables() -> None:
    """OTLP over HTTP by default, gRPC on request, console, none; unknown names are refused."""
    assert [type(e) for e in exporters_from_env({})] == [Http]
    grpc = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp"}
    assert [type(e) for e in exporters_from_env(grpc)] == [Grpc]
    both = {"OTEL_TRACES_EXPORTER": "console, none"}
    assert [type(e) for e in exporters_from_env(both)] == [ConsoleSpanExporter]
    with pytest.raises(TracingConfigError):
        exporters_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingConfigError):
        exporters_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


async def test_a_sampled_request_has_the_stage_and_client_spans() -> None:
    """With stage spans on, the server span parents every stage, the route and the GenAI
    client span."""
    exporter = InMemorySpanExporter()
    sent = await _one_request(_tracing(exporter, stage_spans=True))
    spans = _by_name(exporter.get_finished_spans())
    server = spans["POST /v1/chat/completions"]
    assert set(spans) == {
        "POST /v1/chat/completions",
        "tiergate.auth",
        "tiergate.validate",
        "tiergate.classify",
        "tiergate.ratelimit",
        "tiergate.route",
        "chat tiergate-fast",
    }
    for span in spans.values():
        if span is not server:
            assert span.parent is not None
            assert span.parent.span_id == server.context.span_id
    client = spans["chat tiergate-fast"]
    assert client.attributes is not None
    assert client.attributes["gen_ai.request.temperature"] == 0.5
    assert client.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert client.attributes["gen_ai.usage.output_tokens"] == 2
    assert "gen_ai.input.messages" not in client.attributes
    assert sent["traceparent"].split("-")[2] == format(client.context.span_id, "016x")


async def test_sampled_out_requests_still_propagate_but_export_nothing() -> None:
    """At ratio 0 the backend gets a not-sampled traceparent and no span is built."""
    exporter = InMemorySpanExporter()
    sent = await _one_request(_tracing(exporter, trace_sample_ratio=0.0))
    assert exporter.get_finished_spans() == ()
    version, trace_id, _, flags = sent["traceparent"].split("-")
    assert (version, len(trace_id)) == ("00", 32)
    assert int(flags, 16) & 1 == 0


def _start_many(tracing: Tracing, n: int) -> list[RequestTrace | UnsampledTrace]:
    traces = []
    for _ in range(n):
        ctx = RequestContext("req", route="/v1/chat/completions")
        trace = tracing.start(ctx, None, None)
        trace.finish(ctx, "complete")
        traces.append(trace)
    return traces


def test_new_traces_sampled_out_skip_the_sdk_and_keep_its_sampling_rule() -> None:
    """The gateway decides a new trace's sampling itself with TraceIdRatioBased's rule: the
    sampled share is the ratio, and every trace it keeps is one the SDK keeps (recorded,
    exported, with the trace id drawn for the decision)."""
    exporter = InMemorySpanExporter()
    tracing = _tracing(exporter, trace_sample_ratio=0.25)
    traces = _start_many(tracing, 8000)
    kept = [t for t in traces if isinstance(t, RequestTrace)]
    assert 0.22 < len(kept) / len(traces) < 0.28
    bound = round(0.25 * 2**64)
    for trace in traces:
        low = int(trace.trace_id, 16) & (2**64 - 1)
        assert (low < bound) == isinstance(trace, RequestTrace)
    assert all(t.recording for t in kept if isinstance(t, RequestTrace))
    exported = {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()}
    assert exported == {t.trace_id for t in kept}
    assert len({t.trace_id for t in traces}) == len(traces)


def test_a_trace_sampled_out_propagates_what_the_sdk_span_would() -> None:
    """Same traceparent shape as the SDK's non-recording span for the same trace id: version
    00, the trace id, a span id of its own, flags 02 (random trace id, not sampled)."""
    exporter = InMemorySpanExporter()
    tracing = _tracing(exporter, trace_sample_ratio=0.0)
    ctx = RequestContext("req", route="/v1/chat/completions")
    fast = tracing.start(ctx, None, None)
    assert isinstance(fast, UnsampledTrace)
    ids = tracing.provider.id_generator
    assert isinstance(ids, DrawnIds)
    ids.next_trace_id = int(fast.trace_id, 16)
    sdk = tracing.tracer.start_span("POST /v1/chat/completions")
    assert ids.next_trace_id == 0  # taken by that span
    expected = trace_headers(sdk.get_span_context())["traceparent"].split("-")
    start = AttemptStart(
        "fast", "127.0.0.1:9", "http://127.0.0.1:9", "round_robin", ctx.started, 0, None, "u1", BODY
    )
    sent = fast.attempt_started(ctx, start)["traceparent"].split("-")
    assert sent[:2] == expected[:2]
    assert sent[3] == expected[3] == "02"
    assert sent[2] == fast.span_id
    assert len(sent[2]) == 16
    assert int(sent[2], 16)
    fast.mark("auth")
    fast.finish(ctx, "complete")
    assert exporter.get_finished_spans() == ()


def test_a_provider_built_elsewhere_still_goes_through_the_sdk() -> None:
    """The shortcut needs the gateway's own sampler and ids; another provider's decide."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces = _start_many(Tracing(provider, capture_content=False), 5)
    assert all(isinstance(t, RequestTrace) for t in traces)
    assert len(exporter.get_finished_spans()) == 5


def test_a_span_already_current_is_the_parent_as_the_sdk_would_make_it() -> None:
    """Under a current span (an instrumented caller's), the request joins that trace through
    the SDK even when the ratio would drop a new one."""
    exporter = InMemorySpanExporter()
    tracing = _tracing(exporter, trace_sample_ratio=0.0)
    outer = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True)
    with use_span(NonRecordingSpan(outer)):
        trace = tracing.start(RequestContext("req", route="/v1/chat/completions"), None, None)
    assert isinstance(trace, RequestTrace)
    assert trace.trace_id == "0af7651916cd43dd8448eb211c80319c"


async def test_a_callers_sampling_flag_is_not_trusted_by_default() -> None:
    """A caller's sampled traceparent does not buy a trace at a ratio of 0 (any caller, a
    refused one included, could otherwise spend the tracing budget); the backend still gets
    the caller's trace id (continuity), not sampled."""
    exporter = InMemorySpanExporter()
    sent = await _one_request(_tracing(exporter, trace_sample_ratio=0.0), PARENT)
    assert exporter.get_finished_spans() == ()
    assert sent["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert sent["traceparent"].endswith("-00")


async def test_an_untrusted_callers_unsampled_flag_does_not_hide_its_request() -> None:
    """At a ratio of 1 every request is traced, a caller's "not sampled" flag included."""
    exporter = InMemorySpanExporter()
    unsampled_parent = PARENT[:-2] + "00"
    await _one_request(_tracing(exporter, trace_sample_ratio=1.0), unsampled_parent)
    server = _by_name(exporter.get_finished_spans())["POST /v1/chat/completions"]
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


async def test_an_incoming_sampled_parent_is_honoured_when_callers_are_trusted() -> None:
    """With trust_caller_sampling, a caller's sampled traceparent wins over a ratio of 0."""
    exporter = InMemorySpanExporter()
    sent = await _one_request(
        _tracing(exporter, trace_sample_ratio=0.0, trust_caller_sampling=True), PARENT
    )
    server = _by_name(exporter.get_finished_spans())["POST /v1/chat/completions"]
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert server.parent is not None
    assert format(server.parent.span_id, "016x") == "b7ad6b7169203331"
    assert sent["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize("ratio", [0.0, 1.0])
async def test_the_callers_tracestate_travels_on(ratio: float) -> None:
    """Vendor trace state from the caller reaches the backend, sampled or not."""
    exporter = InMemorySpanExporter()
    unsampled_parent = PARENT[:-2] + "00"
    sent = await _one_request(
        _tracing(exporter, trace_sample_ratio=ratio, trust_caller_sampling=True),
        unsampled_parent,
        "vendor=abc",
    )
    assert sent["tracestate"] == "vendor=abc"
    assert sent["traceparent"].endswith("-00")  # the (trusted) caller decided: not sampled
    assert exporter.get_finished_spans() == ()


async def test_content_is_captured_only_when_opted_in() -> None:
    """capture_content adds the input and output messages to the client span."""
    exporter = InMemorySpanExporter()
    await _one_request(_tracing(exporter, capture_content=True))
    client = _by_name(exporter.get_finished_spans())["chat tiergate-fast"]
    assert client.attributes is not None
    inputs = json.loads(str(client.attributes["gen_ai.input.messages"]))
    outputs = json.loads(str(client.attributes["gen_ai.output.messages"]))
    assert inputs == [{"role": "user", "parts": [{"type": "text", "content": "Say hi"}]}]
    assert outputs[0]["parts"][0]["content"] == "Hi there"
    assert outputs[0]["finish_reason"] == "stop"


def _auth_failure(*, stage_spans: bool) -> dict[str, ReadableSpan]:
    """The spans of a request refused at auth (401), by name."""
    exporter = InMemorySpanExporter()
    tracing = _tracing(exporter, stage_spans=stage_spans)
    ctx = RequestContext("req-2", route="/v1/completions")
    ctx.trace = tracing.start(ctx, None, None)
    ctx.status = 401
    ctx.failure = Failure.of(AuthenticationFailed("bad key"))
    ctx.trace.finish(ctx, "AuthenticationFailed")
    return _by_name(exporter.get_finished_spans())


def test_a_request_failing_in_a_stage_gets_that_stage_as_an_error_span() -> None:
    """An auth failure leaves a tiergate.auth span with error.type and no later stages."""
    spans = _auth_failure(stage_spans=True)
    assert set(spans) == {"POST /v1/completions", "tiergate.auth"}
    auth = spans["tiergate.auth"]
    assert auth.attributes is not None
    assert auth.attributes["error.type"] == "AuthenticationFailed"
    server = spans["POST /v1/completions"].attributes
    assert server is not None
    assert server["http.response.status_code"] == 401
    assert "error.type" not in server  # a 4xx is the caller's error, not the server's


async def test_by_default_stages_are_attributes_of_two_spans() -> None:
    """Stage spans off (the default): a server and a client span carry the same facts."""
    exporter = InMemorySpanExporter()
    sent = await _one_request(_tracing(exporter))
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"POST /v1/chat/completions", "chat tiergate-fast"}
    server, client = spans["POST /v1/chat/completions"], spans["chat tiergate-fast"]
    assert server.attributes is not None
    assert client.attributes is not None
    for stage in ("auth", "validate", "classify", "ratelimit"):
        duration = server.attributes[f"tiergate.stage.{stage}.duration_ms"]
        assert isinstance(duration, float)
        assert duration >= 0
    assert server.attributes["tiergate.ratelimit.outcome"] == "allowed"
    assert "tiergate.stage.failed" not in server.attributes
    assert client.attributes["tiergate.route.strategy"] == "round_robin"
    assert client.attributes["tiergate.route.prefix_blocks"] == 0
    assert client.attributes["tiergate.route.duration_ms"] >= 0  # type: ignore[operator]
    assert client.parent is not None
    assert client.parent.span_id == server.context.span_id
    assert sent["traceparent"].split("-")[2] == format(client.context.span_id, "016x")


def test_by_default_a_failed_stage_is_named_on_the_server_span() -> None:
    """An auth failure: ``tiergate.stage.failed`` is auth, with its duration; one span."""
    spans = _auth_failure(stage_spans=False)
    assert set(spans) == {"POST /v1/completions"}
    server = spans["POST /v1/completions"].attributes
    assert server is not None
    assert server["tiergate.stage.failed"] == "auth"
    assert "tiergate.stage.auth.duration_ms" in server
    assert "tiergate.ratelimit.outcome" not in server
    assert server["tiergate.outcome"] == "AuthenticationFailed"
