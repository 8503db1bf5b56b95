"""Spans really leave the process: OTLP over HTTP and over gRPC to local receivers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from gateway.config.settings import TelemetrySettings
from gateway.telemetry.tracing import build_tracer_provider

Request = trace_service_pb2.ExportTraceServiceRequest
Received = list[tuple[str, Request]]  # (path, decoded export request)


class _HttpReceiver(BaseHTTPRequestHandler):
    received: ClassVar[Received] = []  # replaced per fixture by a subclass

    def do_POST(self) -> None:
        """Decode one export request and answer 200."""
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = Request()
        message.ParseFromString(body)
        self.received.append((self.path, message))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Quiet."""


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.received: list[Request] = []

    def Export(  # noqa: N802  # gRPC method name
        self, request: Request, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        """Keep the request."""
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP receiver on a free port: (endpoint, received requests)."""
    received: Received = []
    handler = type("Handler", (_HttpReceiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, _GrpcReceiver]]:
    """An OTLP/gRPC receiver on a free port."""
    servicer = _GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
    add(servicer, server)  # type: ignore[no-untyped-call]  # generated code, untyped
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", servicer
    server.stop(grace=None)


def _export_one_span(otel_env: dict[str, str]) -> None:
    provider = build_tracer_provider(TelemetrySettings(tracing=True, otel_env=otel_env))
    assert provider is not None
    provider.get_tracer("test").start_span("exported span").end()
    provider.shutdown()  # flushes the batch processor


def _names(requests: list[Request]) -> tuple[list[str], list[str]]:
    spans, services = [], []
    for request in requests:
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.append(attribute.value.string_value)
            for scope in resource_spans.scope_spans:
                spans += [span.name for span in scope.spans]
    return spans, services


def test_otlp_over_http_by_default(
    http_receiver: tuple[str, Received], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no protocol set, spans go as OTLP/HTTP protobuf to ``/v1/traces``."""
    endpoint, received = http_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)  # read by the SDK exporter
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    _export_one_span({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert [path for path, _ in received] == ["/v1/traces"]
    assert _names([message for _, message in received]) == (["exported span"], ["tiergate"])


def test_otlp_over_grpc_when_asked(
    grpc_receiver: tuple[str, _GrpcReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` exports over gRPC; OTEL_SERVICE_NAME is kept."""
    endpoint, servicer = grpc_receiver
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "gateway-eu-1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _export_one_span(env)
    assert _names(servicer.received) == (["exported span"], ["gateway-eu-1"])
