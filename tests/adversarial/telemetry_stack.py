"""The OTLP receiver and the recording backend of tests/adversarial/test_attack_telemetry.py,
and a content-capturing traced gateway in front of a scripted backend, as context managers a
module-scoped fixture can hold."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.gateway.telemetry.test_export import _HttpReceiver
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import free_port, http_answers, terminate, wait_ready

Received = list[tuple[str, trace_service_pb2.ExportTraceServiceRequest]]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """``http_receiver`` for a module-scoped fixture: (endpoint, received requests)."""
    received: Received = []
    handler = type("Handler", (_HttpReceiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def recording_upstream(directory: Path, *args: str) -> Iterator[tuple[str, Path]]:
    """``telemetry_upstream`` as a real process: its URL and the file of headers it got."""
    record = directory / "upstream-headers.jsonl"
    record.write_text("", encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "tests.adversarial.telemetry_upstream", "--port", str(port),
           "--record", str(record), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                   what="telemetry upstream", log=lambda: "")  # fmt: skip
        yield url, record
    finally:
        terminate(proc)


@contextmanager
def traced_gateway(
    backend: str, *args: str, tier: dict[str, Any] | None = None
) -> Iterator[tuple[GatewayProcess, Received]]:
    """The scripted backend ``tests.adversarial.<backend>`` (a real process) behind both
    tiers, and a real gateway (auth off) tracing every request to an OTLP receiver in this
    process with ``capture_content`` on: (gateway, received export requests)."""
    port = free_port()
    command = [sys.executable, "-m", f"tests.adversarial.{backend}", "--port", str(port), *args]
    url = f"http://127.0.0.1:{port}"
    with otlp_receiver() as (endpoint, received):
        proc = subprocess.Popen(command, cwd=REPO_ROOT)  # our own test server
        try:
            wait_ready(proc, lambda: http_answers(url + "/health"), timeout=10, poll_s=0.05,
                       what=backend, log=lambda: "")  # fmt: skip
            replicas = {"replicas": [url], **(tier or {})}
            config = {
                "auth": {"enabled": False},
                "tiers": {
                    "fast": {"model": "m", **replicas},
                    "precise": {"model": "m2", **replicas},
                },
                "telemetry": {"tracing": True, "capture_content": True, "log_format": "json"},
            }
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
            with GatewayProcess(config, env=env) as gateway:
                gateway.wait_until_ready()
                yield gateway, received
        finally:
            terminate(proc)
