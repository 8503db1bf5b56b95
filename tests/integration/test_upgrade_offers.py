"""Requests that offer a protocol upgrade (``Upgrade: h2c``, as ``curl --http2`` sends on
http:// URLs) are served as HTTP/1.1, over raw sockets against a real gateway.

httptools stops parsing at the end of a head that offers an upgrade; the gateway takes over
from where llhttp says the head ended, counts the body off its Content-Length and parses what
follows as the next request (gateway/http/protocol.py, ``_feed``). So an offer in any layout is
served with its body, and no bytes of a body are ever read as a request: bodies full of
header-like lines, sent after the gateway has already answered, produce no extra answer (an
extra answer on a connection a proxy reuses would be request smuggling).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.adversarial.rawhttp import connect, status_of, statuses
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

CHAT = json.dumps(
    {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
).encode()
H2C = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)
GET = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"
CLOSE_GET = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
# A request the simulator at latency scale 1 answers slowly (300 tokens at its own pace).
SLOW = json.dumps(
    {
        "model": "fast",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 300,
        "min_tokens": 300,
    }
).encode()
UPGRADE = b"\r\nupgrade:"  # 10 bytes


def smuggling_body(smuggled: bytes) -> bytes:
    """A body of header-like lines ending in a complete request: bytes that must stay body."""
    assert len(smuggled) % 10 == 0
    return UPGRADE * (len(smuggled) // 10) + b"x" * 16 + smuggled


def smuggled_get(tag: str) -> bytes:
    """``GET /v1/models`` padded to a multiple of 10 bytes, with a request id to spot it."""
    line = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Request-Id: " + tag.encode()
    for pad in range(10):
        req = line + b"p" * pad + b"\r\n\r\n"
        if len(req) % 10 == 0:
            return req
    raise AssertionError


def _gateway(latency_scale: str) -> Iterator[GatewayProcess]:
    """A gateway in front of a simulator at ``latency_scale``, auth off, a 64 KiB body limit;
    forked from a pre-imported fork server (tests/integration/forked_gateway.py): no test here
    is about its start."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", latency_scale
    ) as sim:
        config: dict[str, Any] = {
            "auth": {"enabled": False},
            "server": {"max_body_bytes": 65536},
            "tiers": tiers_config([sim.url], [sim.url], max_tokens_cap=1000),
        }
        with ForkedGateway(config) as process:
            yield process


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayProcess]:
    """In front of a zero-latency simulator."""
    yield from _gateway("0")


@pytest.fixture(scope="module")
def slow_gw() -> Iterator[GatewayProcess]:
    """In front of a simulator that takes its time, so requests queue behind one."""
    yield from _gateway("1")


def read_all(sock: socket.socket, quiet: float = 1.5) -> bytes:
    """Everything the server sends until it is quiet for ``quiet`` seconds (or closes)."""
    sock.settimeout(quiet)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            return data
        if not chunk:
            return data
        data += chunk


def _exchange(port: int, *writes: bytes, pause: float = 0.3) -> bytes:
    """Send each write on one connection, ``pause`` apart; everything the server answers."""
    with connect(port) as sock:
        for i, write in enumerate(writes):
            if i:
                time.sleep(pause)
            sock.sendall(write)
        return read_all(sock)


def _post(body: bytes, extra: bytes = H2C) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def test_an_offer_is_served_with_its_body_and_the_connection_goes_on(gw: GatewayProcess) -> None:
    """curl --http2's POST: 200 with the answer (not 101, not 400), then another request."""
    data = _exchange(gw.port, _post(CHAT), _post(CHAT, b""))
    assert statuses(data) == [200, 200], data.decode(errors="replace")
    assert b'"chat.completion"' in data


def test_an_offer_with_the_body_in_later_writes(gw: GatewayProcess) -> None:
    """The head alone, then the body in two pieces: the body is counted off as it comes."""
    request = _post(CHAT)
    cut = request.index(b"\r\n\r\n") + 4
    data = _exchange(
        gw.port, request[:cut], request[cut : cut + 7], request[cut + 7 :] + GET, pause=0.2
    )
    assert statuses(data) == [200, 200], data.decode(errors="replace")


def test_an_offering_body_full_of_header_lines_is_one_request(gw: GatewayProcess) -> None:
    """An offer whose own body holds header-like lines and a request: one answer (400, not
    JSON), nothing smuggled."""
    body = smuggling_body(smuggled_get("smuggled-offer"))
    with connect(gw.port) as sock:
        sock.sendall(_post(body))
        data = read_all(sock)
    assert statuses(data) == [400], data.decode(errors="replace")
    assert b"smuggled-offer" not in data


def test_a_chunked_body_behind_an_offer_is_refused_clearly(gw: GatewayProcess) -> None:
    """Transfer-Encoding: chunked with an offer: 400 naming what to change, then close."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
        + H2C
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    with connect(gw.port) as sock:
        sock.sendall(head + chunked)
        data = read_all(sock)
    assert status_of(data) == 400
    assert b"--http1.1" in data
    assert statuses(data) == [400]


def test_connect_is_refused_and_what_follows_never_parsed(gw: GatewayProcess) -> None:
    """CONNECT (a tunnel request) gets 405 and the connection closes: the bytes behind it,
    here a complete request, are never answered."""
    with connect(gw.port) as sock:
        sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n" + GET)
        data = read_all(sock)
    assert statuses(data) == [405], data.decode(errors="replace")


def test_many_offers_in_one_write_are_all_answered(gw: GatewayProcess) -> None:
    """30 pipelined GETs, each offering an upgrade, in one write: 30 answers (the pipeline
    depth cap, tests/adversarial/test_pipelining.py, is above that)."""
    one = b"GET /livez HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n"
    with connect(gw.port) as sock:
        sock.sendall(one * 30)
        data = read_all(sock, quiet=3.0)
    assert statuses(data) == [200] * 30


def test_body_after_an_early_native_answer_is_only_a_body(gw: GatewayProcess) -> None:
    """The native path answers 415 (Content-Encoding) before reading the body; the body that
    follows, full of header-like lines, is read off as that request's body: one answer."""
    smuggled = smuggled_get("smuggled-native")
    body = smuggling_body(smuggled)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with connect(gw.port) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        assert status_of(first) == 415
        sock.sendall(body)
        rest = read_all(sock)
    assert statuses(first + rest) == [415], (first + rest).decode(errors="replace")


def test_body_after_an_early_litestar_answer_is_only_a_body(gw: GatewayProcess) -> None:
    """The same through the ASGI path: Litestar answers 404 without reading the body."""
    smuggled = smuggled_get("smuggled-asgi")
    body = smuggling_body(smuggled)
    head = b"POST /no/such/path HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    with connect(gw.port) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        assert status_of(first) in (404, 405)
        sock.sendall(body)
        rest = read_all(sock)
    assert len(statuses(first + rest)) == 1, (first + rest).decode(errors="replace")


def test_large_body_in_one_write_after_an_early_answer(gw: GatewayProcess) -> None:
    """Head and a 4 MiB body in one write (as a buffering proxy forwards it), answered 415
    after the first read: the rest is still body, one answer."""
    smuggled = smuggled_get("smuggled-onewrite")
    body = b" " * (4 * 1024 * 1024) + smuggling_body(smuggled)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with connect(gw.port) as sock:
        sock.sendall(head + body)
        data = read_all(sock)
    assert statuses(data) == [415], data.decode(errors="replace")


def test_pipelined_body_resumed_after_the_previous_answer(gw: GatewayProcess) -> None:
    """Request 2's head arrives while request 1 is answered, its body after request 1's answer
    is out: two framed requests, two answers."""
    first = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    smuggled = smuggled_get("smuggled-pipelined")
    body = smuggling_body(smuggled)
    second_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    data = _exchange(gw.port, first + second_head, body, pause=0.5)
    # Two requests framed by the client: two answers (415, then 400 for the non-JSON body).
    assert len(statuses(data)) == 2, data.decode(errors="replace")


def test_head_terminator_split_across_reads(gw: GatewayProcess) -> None:
    """The blank line split over two reads (``...\\r\\n`` | ``\\r\\n`` + body): one answer."""
    smuggled = smuggled_get("smuggled-split")
    body = b"x" + smuggling_body(smuggled)  # not starting with CRLF: no blank line at all
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(body)
    data = _exchange(gw.port, head, b"\r\n" + body)
    assert len(statuses(data)) == 1, data.decode(errors="replace")


def test_upgrade_header_at_the_start_of_a_later_read(gw: GatewayProcess) -> None:
    """The head in two writes, the second starting with ``Upgrade:``."""
    head1 = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
    head2 = b"Upgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n" % len(CHAT)
    data = _exchange(gw.port, head1, head2 + CHAT, GET)
    assert statuses(data) == [200, 200], data.decode(errors="replace")


def test_upgrade_name_split_across_reads(gw: GatewayProcess) -> None:
    """The header's name split across two reads (``Upg`` | ``rade: h2c``)."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" + H2C
    head += b"Content-Length: %d\r\n\r\n" % len(CHAT)
    cut = head.index(b"Upgrade: h2c") + 3
    data = _exchange(gw.port, head[:cut], head[cut:] + CHAT, GET)
    assert statuses(data) == [200, 200], data.decode(errors="replace")


def test_offer_in_the_second_of_two_pipelined_requests_in_one_write(gw: GatewayProcess) -> None:
    """The offer in a request pipelined behind another in the same write."""
    data = _exchange(gw.port, GET + _post(CHAT), GET, pause=0.5)
    assert statuses(data) == [200, 200, 200], data.decode(errors="replace")


def test_offer_behind_leading_empty_lines(gw: GatewayProcess) -> None:
    """Empty lines before the request line (RFC 9112 2.2 lets a server skip them)."""
    data = _exchange(gw.port, b"\r\n\r\n" + _post(CHAT), GET)
    assert statuses(data) == [200, 200], data.decode(errors="replace")


@pytest.mark.parametrize("offer", [b"", H2C], ids=["plain", "offer"])
def test_after_an_offer_the_connection_parses_as_before(gw: GatewayProcess, offer: bytes) -> None:
    """A ``Connection: close`` request with another behind it, after a first request, in a
    later write and in the same write: the same answers with and without an offer (the parser
    that takes over after an offer is as lenient as uvicorn's own)."""
    assert statuses(_exchange(gw.port, _post(CHAT, offer), CLOSE_GET + GET)) == [200, 200]
    assert statuses(_exchange(gw.port, _post(CHAT, offer) + CLOSE_GET + GET)) == [200, 200]


def test_a_refusal_is_answered_in_its_turn(gw: GatewayProcess) -> None:
    """A plain POST, then a chunked POST with an offer, in one write: 200 first, then 400."""
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
        + H2C
        + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    )
    data = _exchange(gw.port, _post(CHAT, b"") + chunked)
    assert statuses(data) == [200, 400], data.decode(errors="replace")


@pytest.mark.parametrize("offer", [b"", H2C], ids=["plain", "offer"])
def test_offers_held_behind_a_slow_request(slow_gw: GatewayProcess, offer: bytes) -> None:
    """A slow request, then more than the hold limit (64 KiB) of requests with bodies behind
    it: every one answered, in order, with and without offers."""
    padded = (
        b'{"model":"fast",'
        + b" " * 30000
        + b'"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    )
    with connect(slow_gw.port) as sock:
        sock.sendall(_post(SLOW, offer) + GET)
        time.sleep(0.2)
        for _ in range(4):
            sock.sendall(_post(padded, offer))
        sock.sendall(GET)
        data = read_all(sock, 5)
    assert statuses(data) == [200] * 7
