"""Pipelining and slow readers against a real ``tiergate serve`` (gateway/http/protocol.py).

Each test here failed before the fix it names, found by an attack review (2026-12-04):

* one connection sending tiny pipelined requests faster than it read the answers grew the
  gateway's memory without bound (every request in a read became a queued cycle);
* the end of a large body and the start of the next head in one read were counted as head
  bytes: a false 431 that also lost the answer in progress;
* a request behind a refused one (oversized head, bad bytes) still ran, unseen by the client;
* refusals (400, 431) and the 408 of a late body were written at once, ahead of (or inside)
  the answers owed to earlier requests;
* a client that stopped reading a stream held it, and the replica's slot, forever;
* body bytes trickling after an early answer kept the connection from its idle deadline.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from gateway.http.protocol import MAX_PIPELINE
from tests.adversarial.rawhttp import (
    closed_within,
    connect,
    metric_sum,
    rss_kib,
    shed_count,
    statuses,
)
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

TIMEOUT = 1.0  # head, body and write deadlines of the gateway under test
SLACK = 2.0  # the sweeper's tick plus a loaded 2-core machine
LIVEZ = b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A simulator that streams at its own pace (latency scale 1)."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1"
    ) as proc:
        yield proc


def _config(sim: SimulatorProcess) -> dict[str, object]:
    """Auth off; one-second head, body and write deadlines."""
    return {
        "auth": {"enabled": False},
        "server": {
            "head_timeout_s": TIMEOUT,
            "body_timeout_s": TIMEOUT,
            "write_timeout_s": TIMEOUT,
            "idle_timeout_s": 3.0,
        },
        "tiers": tiers_config([sim.url], [sim.url], max_tokens_cap=20000),
    }


@pytest.fixture(scope="module")
def gw(sim: SimulatorProcess) -> Iterator[GatewayProcess]:
    """In front of the paced simulator."""
    with GatewayProcess(_config(sim)) as proc:
        yield proc


@pytest.fixture(scope="module")
def fast_gw() -> Iterator[GatewayProcess]:
    """In front of a zero-latency simulator: a long stream outruns any reader."""
    with (
        SimulatorProcess(
            "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
        ) as sim,
        GatewayProcess(_config(sim)) as proc,
    ):
        yield proc


def _sum(gw: GatewayProcess, name: str) -> float:
    return metric_sum(gw.url, name)


def _shed(gw: GatewayProcess, reason: str) -> float:
    return shed_count(gw.url, reason)


def _chat(content: str, *, stream: bool = False, max_tokens: int = 4) -> bytes:
    body = {
        "model": "fast",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if max_tokens > 8:
        body["min_tokens"] = max_tokens
    return json.dumps(body).encode()


def _post(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


def test_a_deep_pipeline_is_answered_up_to_the_cap_then_closed(gw: GatewayProcess) -> None:
    """2,000 pipelined requests in one write: the first MAX_PIPELINE + 1 answered, then the
    connection closes; memory does not follow the requests sent."""
    before = _shed(gw, "pipeline_too_deep")
    with connect(gw.port) as sock:
        sock.sendall(LIVEZ * 2000)
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [200] * (MAX_PIPELINE + 1)
    assert data.count(b"connection: close") == 1
    assert _shed(gw, "pipeline_too_deep") == before + 1


def test_a_client_that_keeps_pipelining_cannot_grow_the_gateway(gw: GatewayProcess) -> None:
    """The attack as found: ~15 KB of tiny requests sent for every answer read. The gateway
    closes the connection instead of queueing them all (it had grown 400 MB in 1.5 s)."""
    rss_before = rss_kib(gw.pid)
    blob = LIVEZ * (15000 // len(LIVEZ))
    sent = 0
    with connect(gw.port) as sock:
        sock.settimeout(5)
        deadline = time.monotonic() + patience(5)
        try:
            sock.sendall(blob)
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                for _ in range(chunk.count(b"HTTP/1.1 ")):
                    sock.sendall(blob)
                    sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 100  # closed at the cap, long before the deadline
    assert rss_kib(gw.pid) - rss_before < 20 * 1024


def test_a_body_end_and_the_next_head_in_one_read_is_no_431(gw: GatewayProcess) -> None:
    """The last 20 KB of a body and the first bytes of the next request arrive together."""
    request = _post(_chat("x" * 20000))
    head_and_start = len(request) - 20000
    with connect(gw.port) as sock:
        sock.sendall(request[:head_and_start])
        time.sleep(0.2)
        sock.sendall(request[head_and_start:] + LIVEZ[:10])
        time.sleep(0.2)
        sock.sendall(LIVEZ[10:] + b"GET /livez HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [200, 200, 200], data[-300:]


def test_a_request_behind_a_refused_head_never_runs(gw: GatewayProcess) -> None:
    """An oversized head, then a chat request, in one write: only the 431 comes back and the
    chat request is never served (it used to run after the 431, unseen by the client)."""
    served = _sum(gw, "tiergate_requests_total")
    huge = b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    with connect(gw.port) as sock:
        sock.sendall(huge + _post(_chat("hello")))
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [431]
    time.sleep(0.5)
    assert _sum(gw, "tiergate_requests_total") == served


def test_refusals_come_in_turn_after_earlier_answers(gw: GatewayProcess) -> None:
    """Three good requests then bad bytes: three 200s, then an OpenAI-shaped 400, then close."""
    with connect(gw.port) as sock:
        sock.sendall(LIVEZ * 3 + b"GET /livez HTTP/1.1\r\nHo\x00st: t\r\n\r\n")
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [200, 200, 200, 400]
    last = data[data.rindex(b"HTTP/1.1 400") :]
    body = json.loads(last.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "invalid_http_request"


def test_an_unknown_transfer_coding_is_refused_with_501(gw: GatewayProcess) -> None:
    """``gzip, chunked``: llhttp frames the chunks, but the gzip would never be undone."""
    body = b"5\r\nhello\r\n0\r\n\r\n"
    with connect(gw.port) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
            b"Transfer-Encoding: gzip, chunked\r\n\r\n" + body
        )
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [501]
    assert b"unsupported_transfer_encoding" in data


def test_a_late_pipelined_body_does_not_cut_the_stream_before_it(gw: GatewayProcess) -> None:
    """A stream is being answered; a pipelined request's head arrives, its body never does.
    The stream completes whole (no 408 written into it); the late body then gets its 408."""
    stream = _post(_chat("tell me", stream=True, max_tokens=60))
    late_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 50\r\n\r\n"
    )
    with connect(gw.port) as sock:
        sock.sendall(stream)
        time.sleep(0.3)
        sock.sendall(late_head)
        closed, data = closed_within(sock, 30)
    assert closed
    first, _, rest = data.partition(b"\r\n0\r\n\r\n")  # the stream's last chunk
    assert b"data: [DONE]" in first
    assert b"HTTP/1.1 408" not in first
    assert statuses(rest) == [408]


def test_a_client_that_stops_reading_a_stream_is_cut(fast_gw: GatewayProcess) -> None:
    """A long stream to a client that reads nothing: cut after write_timeout_s once the
    buffers are full, and the replica's request ends (in-flight back to 0)."""
    gw = fast_gw
    before = _shed(gw, "write_timeout")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    try:
        # Each stream is ~1.5 MB; the kernel's send buffer takes up to 4 MB by default
        # (tcp_wmem) before the gateway's own writes pause.
        sock.sendall(_post(_chat("go on", stream=True, max_tokens=7000)) * 8)
        deadline = time.monotonic() + patience(40)
        while time.monotonic() < deadline and _shed(gw, "write_timeout") == before:
            time.sleep(0.5)
        assert _shed(gw, "write_timeout") == before + 1
    finally:
        sock.close()
    deadline = time.monotonic() + patience(5)
    while time.monotonic() < deadline:
        if _sum(gw, "tiergate_replica_in_flight") == 0:
            break
        time.sleep(0.2)
    assert _sum(gw, "tiergate_replica_in_flight") == 0


def test_body_trickling_after_an_early_answer_meets_the_idle_deadline(
    gw: GatewayProcess,
) -> None:
    """A 404 answered before its huge body; a byte every 0.5 s after it no longer keeps the
    connection open past the idle deadline (3 s here)."""
    with connect(gw.port) as sock:
        sock.sendall(b"POST /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000\r\n\r\nx")
        started = time.monotonic()
        closed = False
        sock.settimeout(0.5)
        while time.monotonic() - started < 12:
            try:
                sock.sendall(b"x")
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
    assert closed
    assert time.monotonic() - started < 3.0 + 2 * SLACK


def test_a_stalled_second_head_is_told_408(gw: GatewayProcess) -> None:
    """Keep-alive: one request answered, then half a head that never ends: 408, then close
    (the first head on a connection got its 408; a later one was closed without a word)."""
    with connect(gw.port) as sock:
        sock.sendall(LIVEZ)
        time.sleep(0.3)
        sock.sendall(b"GET /livez HT")
        closed, data = closed_within(sock, TIMEOUT + 2 * SLACK + 2)
    assert closed
    assert statuses(data) == [200, 408]


def _server_sockets(port: int) -> int:
    """Established TCP sockets whose local port is ``port`` (the gateway's side)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


def test_a_bad_chunk_in_a_queued_request_waits_for_the_answer_before_it(
    gw: GatewayProcess,
) -> None:
    """A is being answered; B, queued behind it, sends a malformed chunk in the same read as
    its head: A's whole answer comes first, then B's 400, then the close (the 400 used to be
    written at once, taken by the client as A's answer, and A was cancelled)."""
    bad = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
    )
    with connect(gw.port) as sock:
        sock.sendall(_post(_chat("tell me", max_tokens=40)) + bad)
        closed, data = closed_within(sock, 20)
    assert closed
    assert statuses(data) == [200, 400]
    first = data[: data.index(b"HTTP/1.1 400")]
    assert json.loads(first.partition(b"\r\n\r\n")[2])["usage"]["completion_tokens"] == 40


def test_bytes_after_a_refused_head_are_not_judged(gw: GatewayProcess) -> None:
    """An oversized head refused whole, then bad bytes: one 431, counted once."""
    before = _shed(gw, "head_too_large"), _shed(gw, "malformed_request")
    huge = b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    with connect(gw.port) as sock:
        sock.sendall(huge + b"GARBAGE \x00\r\n\r\n")
        closed, data = closed_within(sock, 10)
    assert closed
    assert statuses(data) == [431]
    assert (_shed(gw, "head_too_large"), _shed(gw, "malformed_request")) == (
        before[0] + 1,
        before[1],
    )


def test_a_client_that_reads_nothing_never_keeps_a_socket(fast_gw: GatewayProcess) -> None:
    """Non-streaming requests sent one after another by a client that never reads: the
    gateway stops answering once its writes pause (memory does not follow the requests), and
    the socket is gone after write_timeout_s; with bad bytes at the end too (a refusal used
    to release the connection from the guard and then wait on close() for unread bytes)."""
    gw = fast_gw
    rss_before = rss_kib(gw.pid)
    sockets_before = _server_sockets(gw.port)
    clients = []
    for tail in (b"", b"GARBAGE \x00\r\n\r\n"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", gw.port))
        sock.settimeout(0.2)
        clients.append(sock)
        request = _post(_chat("go on", max_tokens=7000))
        try:
            for _ in range(150):
                sock.sendall(request)
                time.sleep(0.01)
            sock.sendall(tail)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    try:
        deadline = time.monotonic() + TIMEOUT + 3 * SLACK
        while time.monotonic() < deadline and _server_sockets(gw.port) > sockets_before:
            time.sleep(0.2)
        assert _server_sockets(gw.port) <= sockets_before
        assert rss_kib(gw.pid) - rss_before < 30 * 1024
    finally:
        for sock in clients:
            sock.close()
