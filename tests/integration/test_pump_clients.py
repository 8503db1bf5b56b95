"""Clients of a pumped stream on a real gateway (the native server relays streams from the
backend connection's callback): an HTTP/1.0 client, pipelined requests after a stream on a
keep-alive connection, and a client that reads in small bites, against the streams
benchmark's fixed-rate streamer (``bench/streams/upstream.py``, a real process)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess, fixed_rate_streamer
from tests.processes import patience

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-pump-client-tests"
MODEL = "tiergate-fast"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway in front of the fixed-rate streamer."""
    with fixed_rate_streamer(tmp_path_factory.mktemp("streamer"), MODEL, 5000) as url:
        tier = {"model": MODEL, "replicas": [url], "max_concurrency": 8}
        config = {
            "auth": {"enabled": False, "admin_token": ADMIN},
            "server": {"stream_stall_s": 5.0},
            "tiers": {"fast": tier, "precise": dict(tier)},
        }
        with GatewayProcess(config) as gw:
            yield gw


def _request(tokens: int, pace: int, *, version: str = "1.1", pad: int = 0) -> bytes:
    body = json.dumps({
        "model": "fast", "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": f"pace {pace}/s pad {pad}B"}],
    }).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/{version}\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


def _connect(gw: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.settimeout(patience(20.0))
    return sock


def _read_until(sock: socket.socket, received: bytearray, end: bytes) -> None:
    while not received.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, f"closed early: {bytes(received[-200:])!r}"
        received += chunk


def _events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_end = data.index(b"\r\n")
        size = int(data[:size_end], 16)
        if size == 0:
            return bytes(out)
        out += data[size_end + 2 : size_end + 2 + size]
        assert data[size_end + 2 + size : size_end + 4 + size] == b"\r\n"
        data = data[size_end + 4 + size :]


def _content_events(body: bytes) -> int:
    return sum(1 for e in _events(body) if b'"content":"@' in e)


def test_an_http_1_0_client_gets_the_stream_unframed_and_whole(gateway: GatewayProcess) -> None:
    with _connect(gateway) as sock:
        sock.sendall(_request(200, 1000, version="1.0"))
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    assert body.endswith(b"data: [DONE]\n\n")
    assert _content_events(body) == 200


def test_pipelined_requests_after_a_stream_are_answered_in_order(
    gateway: GatewayProcess,
) -> None:
    """Two streams and a liveness probe sent at once on one keep-alive connection: each answer
    whole, in order, the stream's chunked body ended before the next answer's head."""
    with _connect(gateway) as sock:
        sock.sendall(
            _request(100, 1000) + _request(50, 1000)
            + b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
        )  # fmt: skip
        received = bytearray()
        deadline = time.monotonic() + patience(20.0)
        while received.count(b"HTTP/1.1 ") < 3 or not received.endswith(b"}"):
            assert time.monotonic() < deadline
            received += sock.recv(65536)
    answers = bytes(received).split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200", b"200", b"200"]
    first, second = (_dechunk(a.partition(b"\r\n\r\n")[2]) for a in answers[:2])
    assert (_content_events(first), _content_events(second)) == (100, 50)
    assert first.endswith(b"data: [DONE]\n\n")
    assert second.endswith(b"data: [DONE]\n\n")


def test_a_client_reading_in_small_bites_gets_every_event_in_order(
    gateway: GatewayProcess,
) -> None:
    """A fast stream of padded events to a client with a small receive buffer that reads 2 KiB
    at a time, pausing between reads: the gateway's writes pause and resume many times
    (shorter than the stall limit); every event arrives whole, in order, then [DONE]."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gateway.port))
    sock.settimeout(patience(30.0))
    with sock:
        sock.sendall(_request(1500, 1000, pad=512))
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(2048)
            assert chunk
            received += chunk
            time.sleep(0.0005)
    body = _dechunk(bytes(received).partition(b"\r\n\r\n")[2])
    assert body.endswith(b"data: [DONE]\n\n")
    stamps = [
        int(e.split(b'"content":"@', 1)[1].split(b" ", 1)[0])
        for e in _events(body)
        if b'"content":"@' in e
    ]
    assert len(stamps) == 1500
    assert stamps == sorted(stamps)
    view = httpx.get(gateway.url + "/admin/backends", headers={"authorization": f"Bearer {ADMIN}"})
    assert all(
        r["in_flight"] == 0 for tier in view.json()["tiers"].values() for r in tier["replicas"]
    )
