"""Attacks on the HTTP edge (gateway/http/protocol.py, asgi.py) by a hostile or careless client.

Each test here failed before the fix it names (attack review of the own protocol, 2026-12-06).
What held without a fix is listed in the branch's report, not tested twice here: smuggling
shapes (Content-Length with Transfer-Encoding, two Content-Lengths, obs-fold, bare LF, a
chunk size past 64 bits) are refused 400 by llhttp on both paths.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.adversarial.rawhttp import closed_within, connect, statuses
from tests.gateway.http.test_asgi_cycle import exchange, serving
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayProcess]:
    """Auth off, in front of a zero-latency simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as sim:
        config = {"auth": {"enabled": False}, "tiers": tiers_config([sim.url], [sim.url])}
        with GatewayProcess(config) as proc:
            yield proc


@pytest.mark.parametrize("path", [b"/no-such-path", b"/v1/models"])
def test_an_answer_before_an_expected_body_closes_the_connection(
    gw: GatewayProcess, path: bytes
) -> None:
    """A Litestar route that answers (404, 405) a request waiting on ``Expect: 100-continue``
    never asked for its body. A client may then skip the body (RFC 9110, 10.1.1) and send its
    next request, which the gateway read as the rest of the old body: the next request was
    lost, unanswered. The answer now closes the connection, as the native path's 413 does."""
    sock = connect(gw.port)
    sock.sendall(
        b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: 20\r\n\r\n"
    )
    closed, data = closed_within(sock, 5.0)
    sock.close()
    assert statuses(data) in ([404], [405]), data
    assert b"connection: close" in data.lower(), data
    assert closed, data


def test_a_native_answer_before_an_expected_body_closes_the_connection(
    gw: GatewayProcess,
) -> None:
    """The same on the native path: a refusal decided from the head alone (415 for a
    compressed body here; 401 for a missing key is the common one) came before any
    ``100 Continue``, on a connection kept alive, so the next request was read as the body."""
    sock = connect(gw.port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Encoding: gzip\r\nContent-Length: 20\r\n\r\n"
    )
    closed, data = closed_within(sock, 10.0)
    sock.close()
    assert statuses(data) == [415], data
    assert b"connection: close" in data.lower(), data
    assert closed, data


def test_an_http_10_client_never_hears_100_continue(gw: GatewayProcess) -> None:
    """A server must not send a 1xx answer to an HTTP/1.0 client, and ignores its
    ``Expect: 100-continue`` (RFC 9110, 10.1.1 and 15.2): such a client takes the
    ``100 Continue`` for the answer itself. The native path sent it."""
    body = b'{"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    sock = connect(gw.port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.0\r\nExpect: 100-continue\r\nContent-Type: "
        b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    time.sleep(0.2)  # as an HTTP/1.0 client would: it sends the body without waiting
    sock.sendall(body)
    closed, data = closed_within(sock, 10.0)
    sock.close()
    assert closed, data
    assert len(statuses(data)) == 1, data
    assert 100 not in statuses(data), data


@pytest.mark.parametrize(
    ("path", "answers"),
    [
        (b"/v1/chat/completions", ([431],)),
        (b"/no-such-path", ([431], [404])),  # Litestar may answer 404 before the body ends
    ],
)
def test_trailers_count_against_the_head_limit(
    gw: GatewayProcess, path: bytes, answers: tuple[list[int], ...]
) -> None:
    """Trailer lines after a chunked body were kept, one per line, with no limit until the
    body deadline: one connection sending 373 MB of them in 2 s took the gateway from 112 MB
    to 525 MB resident. They now count with the head against ``max_head_bytes`` (431)."""
    sock = connect(gw.port)
    sock.sendall(
        b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n"
    )
    trailer = b"X-T: " + b"y" * 1000 + b"\r\n"
    sent = 0
    try:
        while sent < 64 * 1024 * 1024:  # 64 MiB of trailers, 4,000 times the head limit
            sock.sendall(trailer * 64)
            sent += len(trailer) * 64
    except OSError:  # refused and closed
        pass
    closed, data = closed_within(sock, 10.0)
    sock.close()
    assert closed
    assert sent < 64 * 1024 * 1024, "every trailer was read"
    assert statuses(data) in answers, data[:300]


def test_one_endless_trailer_counts_against_the_head_limit(gw: GatewayProcess) -> None:
    """One trailer line that never ends reached the protocol only once complete: cut by the
    body deadline alone (10 s), after 80 MB sent and 129 MB more resident. The bytes fed
    after the last chunk's size line now count as trailer bytes as they arrive (431)."""
    sock = connect(gw.port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n2\r\n{}\r\n0\r\nX-T: "
    )
    sent = 0
    try:
        while sent < 16 * 1024 * 1024:
            sock.sendall(b"y" * 65536)
            sent += 65536
    except OSError:  # refused and closed
        pass
    closed, data = closed_within(sock, 10.0)
    sock.close()
    assert closed
    assert sent < 16 * 1024 * 1024, "the whole trailer was read"
    assert statuses(data) == [431], data[:300]


@pytest.mark.parametrize("chunk", [1, 70_000])
def test_chunked_bodies_in_small_and_large_chunks_are_served(
    gw: GatewayProcess, chunk: int
) -> None:
    """The trailer count never takes a chunk's own data for trailers (a size line and its
    data in separate reads)."""
    body = b'{"model": "fast", "messages": [{"role": "user", "content": "%b"}], "max_tokens": 2}'
    body %= b"hi " * 300
    sock = connect(gw.port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        sock.sendall(b"%x\r\n" % len(piece))
        sock.sendall(piece + b"\r\n")
    sock.sendall(b"0\r\nX-Trailer: 1\r\n\r\n")
    _, data = closed_within(sock, 30.0)
    sock.close()
    assert statuses(data) == [200], data[:600]


async def _bad_header_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app whose answer carries a header value with a line break (a response split)."""
    try:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"a\nb")]})
    except RuntimeError:  # as a framework does: answer 500 instead
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"oops"})


def test_an_app_answer_with_a_bad_header_can_still_be_answered_500() -> None:
    """The cycle refused the bad header only after marking the answer started, so the app's
    own 500 was refused too and the client got a closed socket with no answer."""

    async def scenario() -> bytes:
        async with serving(_bad_header_app) as port:
            return await exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")

    data = asyncio.run(scenario())
    assert statuses(data) == [500], data
    assert b"a\nb" not in data
