"""Attacks on the natively served inference endpoints (gateway/http/native.py) as a hostile client.

A real ``tiergate serve`` in front of a slow simulator, spoken to over raw loopback sockets:
pipelining mixed with the framework path, clients leaving at every phase, odd framing. The
backend request must be aborted when the client leaves, and the connection must not leak.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.adversarial.rawhttp import closed_within, connect, status_of
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
from tests.stack import Backends, Stack, running_stack

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

CHAT = [{"role": "user", "content": "Tell me a long story."}]
STREAM = {"model": "fast", "messages": CHAT, "max_tokens": 200, "stream": True}


def _body_limit_1_mib(config: dict[str, Any], _backends: Backends) -> None:
    del config["telemetry"]  # the access log on, the default
    config["server"] = {"max_body_bytes": 1 << 20}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """A gateway whose both tiers point at one slow simulator (auth off): slow enough to leave
    mid-request, ~0.3 s to first token, 80 ms a token."""
    slow = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "20", "--seed", "5")
    with running_stack(sims=[slow], configure=_body_limit_1_mib) as stack:
        yield stack


@pytest.fixture(scope="module")
def slow_sim(stack: Stack) -> SimulatorProcess:
    """The slow simulator."""
    return stack.fast


@pytest.fixture(scope="module")
def gw(stack: Stack) -> GatewayProcess:
    """The gateway in front of it."""
    return stack.gateway


def _post(body: dict[str, Any], *extra: str, pad: int = 0) -> bytes:
    raw = json.dumps(body).encode() + b" " * pad
    head = ["POST /v1/chat/completions HTTP/1.1", "Host: t", f"Content-Length: {len(raw)}"]
    return ("\r\n".join([*head, *extra]) + "\r\n\r\n").encode() + raw


def _wait_idle(sim: SimulatorProcess, aborts: int, timeout: float = 5.0) -> dict[str, Any]:
    """Poll the simulator until its abort counter passes ``aborts`` and nothing runs."""
    deadline = time.monotonic() + patience(timeout)
    stats = sim.stats()
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["aborts_total"] > aborts and stats["running"] == 0:
            break
        time.sleep(0.05)
    return stats


def _settled(sim: SimulatorProcess, timeout: float = 10.0) -> dict[str, Any]:
    """Wait until nothing runs and the abort counter holds still (earlier tests' aborts)."""
    deadline = time.monotonic() + patience(timeout)
    stats = sim.stats()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = sim.stats()
        if now["running"] == 0 and now["aborts_total"] == stats["aborts_total"]:
            return now
        stats = now
    return stats


def _running(sim: SimulatorProcess, timeout: float = 10.0) -> None:
    """Wait until the simulator is generating a request."""
    deadline = time.monotonic() + patience(timeout)
    while sim.stats()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_leaving_with_a_request_pipelined_behind_a_stream_aborts_it(
    gw: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """A client that pipelines a request behind a stream and then leaves aborts the stream."""
    before = _settled(slow_sim)["aborts_total"]
    with connect(gw.port) as sock:
        sock.sendall(_post(STREAM) + b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5.0)
        first = sock.recv(65536)
        assert status_of(first) == 200
    stats = _wait_idle(slow_sim, before)
    assert stats["aborts_total"] == before + 1
    assert stats["running"] == 0


def test_leaving_with_a_post_pipelined_behind_a_wait_aborts_it(
    gw: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """A non-streaming request with another POST pipelined behind it is aborted on leaving."""
    before = _settled(slow_sim)["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 100}
    with connect(gw.port) as sock:
        sock.sendall(_post(body) + _post(body))
        _running(slow_sim)  # the first is generating, the second waits behind it
    stats = _wait_idle(slow_sim, before)
    assert stats["aborts_total"] == before + 1
    assert stats["running"] == 0


def test_mixed_pipeline_native_framework_native_in_order(gw: GatewayProcess) -> None:
    """POST chat, GET /v1/models, POST chat on one connection: three answers, in order."""
    body = {"model": "fast", "messages": CHAT, "max_tokens": 2}
    with connect(gw.port) as sock:
        sock.sendall(
            _post(body, "X-Request-Id: a")
            + b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Request-Id: b\r\n\r\n"
            + _post(body, "X-Request-Id: c", "Connection: close")
        )
        closed, data = closed_within(sock, 15.0)
    assert closed
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 3
    order = [data.index(b"x-request-id: a"), data.index(b'"object":"list"')]
    assert order[0] < order[1] < data.index(b"x-request-id: c")


def test_no_fd_leak_when_clients_leave_at_every_phase(gw: GatewayProcess) -> None:
    """Clients leaving mid-head, mid-body, while waiting and mid-stream leak no socket."""
    base = _open_fds(gw.pid)
    raw = json.dumps(STREAM).encode()
    full = _post(STREAM)
    cuts = [b"POST /v1/chat/comp", full[: len(full) - len(raw) // 2], full, full]
    for _ in range(5):
        for number, cut in enumerate(cuts):
            sock = connect(gw.port)
            sock.sendall(cut)
            if number == 3:
                sock.settimeout(5.0)
                sock.recv(65536)  # the stream's head: leave mid-stream
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
    deadline = time.monotonic() + patience(5.0)
    while _open_fds(gw.pid) > base + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _open_fds(gw.pid) <= base + 2


def test_leaving_after_a_body_over_64_kib_aborts_the_backend_request(
    gw: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """A client that sent a large body (the protocol paused reading) and left is noticed."""
    before = _settled(slow_sim)["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 100}
    with connect(gw.port) as sock:
        sock.sendall(_post(body, pad=100_000))  # JSON whitespace: a large body, a short prompt
        _running(slow_sim)  # the backend is generating
    stats = _wait_idle(slow_sim, before)
    assert stats["aborts_total"] == before + 1
    assert stats["running"] == 0


def test_requests_sent_behind_a_waiting_pipelined_one_are_served_in_order(
    gw: GatewayProcess,
) -> None:
    """Bytes read while a pipelined request waits its turn are parsed and served after it."""
    body = {"model": "fast", "messages": CHAT, "max_tokens": 3}
    with connect(gw.port) as sock:
        sock.sendall(_post(body, "X-Request-Id: a") + _post(body, "X-Request-Id: b"))
        time.sleep(0.2)  # the first is with the backend, the second waits behind it
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.sendall(_post(body, "X-Request-Id: c", "Connection: close"))
        closed, data = closed_within(sock, 20.0)
    assert closed
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 4
    marks = [b"x-request-id: a", b"x-request-id: b", b'"object":"list"', b"x-request-id: c"]
    assert [data.index(m) for m in marks] == sorted(data.index(m) for m in marks)
