"""The OTLP receiver and the recording backend of tests/adversarial/test_attack_telemetry.py,
as context managers a module-scoped fixture can hold."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.gateway.telemetry.test_export import _HttpReceiver
from tests.integration.gateway_proc import REPO_ROOT
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
