"""Span trees end to end: a real gateway socket, real simulator processes, in-memory export.

Each test checks the tree (server span → stage spans, route spans, one GenAI client span per
upstream attempt; or, by default, server span → client spans with the stages as attributes), the
attributes, and that the simulator received the client span's
``traceparent`` (so vLLM's own spans would nest under ours).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.composition import create_app
from gateway.config.settings import Settings
from tests.gateway.telemetry.served import ServedApp
from tests.processes import patience
from tests.simulator.procs import SimulatorFactory, SimulatorProcess

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STAGES = ("tiergate.auth", "tiergate.validate", "tiergate.classify", "tiergate.ratelimit")
CHAT = [{"role": "user", "content": "Name a colour."}]


def _settings(
    fast: list[str], precise: list[str], *, stage_spans: bool = True, **fast_options: Any
) -> Settings:
    return Settings.model_validate(
        {
            "auth": {"enabled": False},
            "tiers": {
                "fast": {"model": "tiergate-fast", "replicas": fast, **fast_options},
                "precise": {"model": "tiergate-precise", "replicas": precise},
            },
            "telemetry": {
                "tracing": True,
                "trace_sample_ratio": 1.0,
                "access_log": False,
                "stage_spans": stage_spans,
            },
        }
    )


@pytest.fixture
def traced(
    fast_sim: SimulatorProcess, precise_sim: SimulatorProcess
) -> Iterator[tuple[ServedApp, InMemorySpanExporter]]:
    """A traced gateway in front of both simulators, exporting to memory."""
    exporter = InMemorySpanExporter()
    app = create_app(_settings([fast_sim.url], [precise_sim.url]), span_exporter=exporter)
    with ServedApp(app) as served:
        yield served, exporter


def _tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The one server span and its children (checking they all share its trace).

    The server span ends in the request's after-work, which runs once the last byte is
    written: the client may read its answer first, so wait (bounded) for the span to end.
    """
    deadline = time.monotonic() + patience(5.0)
    spans = list(exporter.get_finished_spans())
    while not any(s.kind is SpanKind.SERVER for s in spans) and time.monotonic() < deadline:
        time.sleep(0.01)
        spans = list(exporter.get_finished_spans())
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    children = [s for s in spans if s is not server]
    for child in children:
        assert child.context.trace_id == server.context.trace_id
        assert child.parent is not None
        assert child.parent.span_id == server.context.span_id
    return server, children


def _names(spans: list[ReadableSpan]) -> list[str]:
    return sorted(s.name for s in spans)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _traceparent_of(span: ReadableSpan) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def test_non_streaming_request_span_tree(
    traced: tuple[ServedApp, InMemorySpanExporter], fast_sim: SimulatorProcess
) -> None:
    """Caller's traceparent honoured; stages, route and client span; traceparent to vLLM."""
    served, exporter = traced
    body = {"model": "fast", "messages": CHAT, "max_tokens": 6, "temperature": 0.2}
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    resp = httpx.post(served.url + "/v1/chat/completions", json=body, headers=headers)
    assert resp.status_code == 200
    answer = resp.json()
    server, children = _tree(exporter)
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE
    assert server.parent is not None
    assert f"{server.parent.span_id:016x}" == CALLER_SPAN
    assert server.name == "POST /v1/chat/completions"
    assert _attrs(server)["tiergate.request_id"] == resp.headers["x-request-id"]
    assert {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "tiergate.tier": "fast",
        "tiergate.route.reason": "explicit",
        "tiergate.attempts": 1,
        "tiergate.outcome": "complete",
    }.items() <= _attrs(server).items()
    assert _names(children) == sorted([*STAGES, "tiergate.route", "chat tiergate-fast"])
    (client,) = [s for s in children if s.kind is SpanKind.CLIENT]
    attrs = _attrs(client)
    assert {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "tiergate-fast",
        "gen_ai.request.max_tokens": 6,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.stream": False,
        "gen_ai.response.id": answer["id"],
        "gen_ai.response.model": answer["model"],
        "gen_ai.usage.input_tokens": answer["usage"]["prompt_tokens"],
        "gen_ai.usage.output_tokens": answer["usage"]["completion_tokens"],
        "server.address": fast_sim.host,
        "server.port": fast_sim.port,
    }.items() <= attrs.items()
    assert attrs["gen_ai.response.finish_reasons"] == (answer["choices"][0]["finish_reason"],)
    assert "gen_ai.input.messages" not in attrs
    assert fast_sim.stats()["last_traceparent"] == _traceparent_of(client)


def test_streaming_request_span_tree(
    traced: tuple[ServedApp, InMemorySpanExporter], precise_sim: SimulatorProcess
) -> None:
    """A stream's client span lasts to the end: TTFT, usage and finish reason are on it."""
    served, exporter = traced
    body = {"model": "precise", "messages": CHAT, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    server, children = _tree(exporter)
    assert server.parent is None
    assert _attrs(server)["tiergate.tier"] == "precise"
    (client,) = [s for s in children if s.kind is SpanKind.CLIENT]
    attrs = _attrs(client)
    assert client.name == "chat tiergate-precise"
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    assert attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["gen_ai.response.finish_reasons"] in (("stop",), ("length",))
    assert client.end_time is not None
    assert server.end_time is not None
    assert client.end_time <= server.end_time
    assert client.status.status_code is not StatusCode.ERROR
    assert precise_sim.stats()["last_traceparent"] == _traceparent_of(client)


def test_retry_gets_one_client_span_per_attempt(
    start_simulator: SimulatorFactory, precise_sim: SimulatorProcess
) -> None:
    """A 503 then a success: two route and two client spans, the first one an error."""
    args = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0")
    failing, healthy = start_simulator(*args), start_simulator(*args)
    failing.set_faults(fail_503=1.0)
    exporter = InMemorySpanExporter()
    settings = _settings([failing.url, healthy.url], [precise_sim.url], strategy="round_robin")
    with ServedApp(create_app(settings, span_exporter=exporter)) as served:
        body = {"model": "fast", "messages": CHAT, "max_tokens": 4}
        resp = httpx.post(served.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["x-tiergate-attempts"] == "2"
    server, children = _tree(exporter)
    assert _attrs(server)["tiergate.attempts"] == 2
    assert _names(children).count("tiergate.route") == 2
    first, second = sorted(
        (s for s in children if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0
    )
    assert _attrs(first)["error.type"] == "status_503"
    assert first.status.status_code is StatusCode.ERROR
    assert (_attrs(first)["tiergate.attempt"], _attrs(second)["tiergate.attempt"]) == (1, 2)
    assert _attrs(first)["server.port"] == failing.port
    assert _attrs(second)["server.port"] == healthy.port
    assert "error.type" not in _attrs(second)
    assert failing.stats()["last_traceparent"] == _traceparent_of(first)
    assert healthy.stats()["last_traceparent"] == _traceparent_of(second)


def test_default_tree_is_a_server_and_a_client_span_with_stage_durations(
    fast_sim: SimulatorProcess, precise_sim: SimulatorProcess
) -> None:
    """Without stage spans (the default) the same facts travel in two spans."""
    exporter = InMemorySpanExporter()
    settings = _settings([fast_sim.url], [precise_sim.url], stage_spans=False)
    with ServedApp(create_app(settings, span_exporter=exporter)) as served:
        body = {"model": "auto", "messages": CHAT, "max_tokens": 6}
        resp = httpx.post(served.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200
    server, children = _tree(exporter)
    (client,) = children
    assert client.kind is SpanKind.CLIENT
    attrs = _attrs(server)
    for stage in ("auth", "validate", "classify", "ratelimit"):
        assert attrs[f"tiergate.stage.{stage}.duration_ms"] >= 0
    assert attrs["tiergate.ratelimit.outcome"] == "allowed"
    assert attrs["tiergate.tier"] in {"fast", "precise"}
    assert attrs["tiergate.tier"] == resp.headers["x-tiergate-tier"]
    assert attrs["tiergate.route.reason"] == resp.headers["x-tiergate-route-reason"]
    assert 0.0 <= attrs["tiergate.route.score"] <= 1.0  # model "auto": the classifier scored it
    route = _attrs(client)
    assert route["tiergate.route.strategy"]
    assert route["tiergate.route.duration_ms"] >= 0
    assert "tiergate.route.prefix_blocks" in route
