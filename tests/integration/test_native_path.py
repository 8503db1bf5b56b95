"""The inference endpoints served natively by ``tiergate serve`` (gateway/http/native.py).

A real gateway process and real simulators, spoken to over raw sockets: the HTTP details the
framework used to handle (pipelining, ``Expect: 100-continue``, chunked uploads, HTTP/1.0,
the body limit, other methods) must still be right, and every answer must match what the
Litestar layer gives for the same request (compared through Litestar's own test client).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from gateway.composition import create_app
from gateway.config.settings import Settings
from gateway.http.native import LINGER_S, reply_head
from gateway.pipeline.replies import Reply
from tests.adversarial.rawhttp import closed_within, connect, json_body, status_of
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MAX_BODY = 65536


def _config(sim: SimulatorProcess) -> dict[str, Any]:
    return {
        "auth": {"enabled": False},
        "server": {"max_body_bytes": MAX_BODY},
        "tiers": tiers_config([sim.url], [sim.url], max_tokens_cap=1000),
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A zero-latency simulator serving both tiers' model names."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as process:
        yield process


@pytest.fixture(scope="module")
def gw(sim: SimulatorProcess) -> Iterator[GatewayProcess]:
    """A gateway in front of the simulator, auth off, a 64 KiB body limit."""
    with GatewayProcess(_config(sim)) as process:
        yield process


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Responses:
    """Reads Content-Length responses off one socket, keeping what follows each one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> tuple[bytes, bytes]:
        """The next response: (head, body)."""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += self._recv()
        self.buffer = rest[length:]
        return head, rest[:length]

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise AssertionError("the connection closed mid-response")
        return data


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response on a connection that carries no other."""
    return _Responses(sock).next()


def test_pipelined_requests_are_answered_in_order(gw: GatewayProcess) -> None:
    """Three requests written at once on one connection get three answers, in order."""
    bodies = [json.dumps({**CHAT, "user": f"u{i}"}).encode() for i in range(3)]
    with connect(gw.port) as sock:
        sock.sendall(
            b"".join(
                _post("/v1/chat/completions", b, f"X-Request-Id: r{i}")
                for i, b in enumerate(bodies)
            )
        )
        responses = _Responses(sock)
        heads = [responses.next()[0] for _ in bodies]
    assert [status_of(h) for h in heads] == [200, 200, 200]
    assert [b"x-request-id: r%d" % i in h for i, h in enumerate(heads)] == [True] * 3


def test_expect_continue_gets_100_before_the_body(gw: GatewayProcess) -> None:
    """A client that waits for ``100 Continue`` gets it, then its answer."""
    body = json.dumps(CHAT).encode()
    with connect(gw.port) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        head, answer = _read_response(sock)
    assert status_of(head) == 200
    assert json.loads(answer)["object"] == "chat.completion"


def test_chunked_upload_is_read_whole(gw: GatewayProcess) -> None:
    """A body sent with ``Transfer-Encoding: chunked`` in several chunks is served."""
    body = json.dumps(CHAT).encode()
    parts = [body[:10], body[10:25], body[25:]]
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    with connect(gw.port) as sock:
        sock.sendall(head + chunked)
        response, answer = _read_response(sock)
    assert status_of(response) == 200
    assert json.loads(answer)["choices"][0]["message"]["role"] == "assistant"


def test_declared_oversized_body_is_refused_without_reading_it(gw: GatewayProcess) -> None:
    """A Content-Length over the limit gets 413 before the body is sent; the connection then
    closes (after the gateway has read and dropped what followed for a bounded time)."""
    with connect(gw.port) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
            b"Content-Length: %d\r\n\r\n{" % (MAX_BODY * 100)
        )
        sock.settimeout(2.0)
        early = sock.recv(65536)  # answered at once, not after a body that never comes
        sock.sendall(b"x" * 100_000)  # a client still sending meets no reset
        closed, rest = closed_within(sock, LINGER_S + 3)
    assert closed
    assert status_of(early) == 413
    assert b"connection: close" in early.lower()
    assert json_body(early + rest)["error"]["code"] == "request_too_large"


def test_streamed_oversized_body_is_refused(gw: GatewayProcess) -> None:
    """A chunked body that grows past the limit is refused with 413 and closed."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"a" * 32768
    with connect(gw.port) as sock:
        sock.sendall(head)
        try:
            for _ in range(8):
                sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway may close while the rest is still being written
        closed, data = closed_within(sock, LINGER_S + 3)
    assert closed
    assert status_of(data) == 413


def _http10_exchange(gw: GatewayProcess, chat: dict[str, object]) -> tuple[bool, bytes]:
    """An HTTP/1.0 chat request: (the gateway closed within 5 s, what it sent)."""
    body = json.dumps(chat).encode()
    request = b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )
    with connect(gw.port) as sock:
        sock.sendall(request)
        return closed_within(sock, 5.0)


def test_http_10_request_is_answered_then_closed(gw: GatewayProcess) -> None:
    """An HTTP/1.0 client gets its answer and the connection ends after it."""
    closed, data = _http10_exchange(gw, CHAT)
    assert closed
    assert status_of(data) == 200
    assert b"connection: close" in data.lower()


def test_http_10_stream_is_not_chunked(gw: GatewayProcess) -> None:
    """HTTP/1.0 knows no chunked coding (RFC 9112 7.1): a stream to an HTTP/1.0 client is
    its SSE bytes as they come, ended by the close."""
    closed, data = _http10_exchange(gw, {**CHAT, "stream": True})
    assert closed
    head, _, payload = data.partition(b"\r\n\r\n")
    assert status_of(data) == 200
    assert b"transfer-encoding" not in head.lower()
    assert payload.startswith(b"data: {")
    assert payload.endswith(b"data: [DONE]\n\n")


def test_query_and_trailing_slash_reach_the_endpoint(gw: GatewayProcess) -> None:
    """``/v1/completions/?x=1`` is the completions endpoint, as on the framework's router."""
    body = {"model": "fast", "prompt": "hi", "max_tokens": 2}
    resp = httpx.post(gw.url + "/v1/completions/?x=1", json=body, timeout=10)
    assert resp.status_code == 200
    assert resp.json()["object"] == "text_completion"


def test_stream_is_chunked_and_ends_with_done(gw: GatewayProcess) -> None:
    """A streamed answer arrives as SSE over chunked encoding and ends with [DONE]."""
    body = {**CHAT, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=10) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert resp.headers["transfer-encoding"] == "chunked"
        text = b"".join(resp.iter_raw()).decode()
    assert text.rstrip().endswith("data: [DONE]")


# Requests whose answer must not depend on which layer serves them.
_SAME_ANSWER: list[tuple[str, str, bytes]] = [
    ("POST", "/v1/chat/completions", b"{bad"),
    ("POST", "/v1/chat/completions", b""),
    ("POST", "/v1/chat/completions", b'{"model": "nope", "messages": []}'),
    ("POST", "/v1/chat/completions", b'{"model": "fast", "messages": "x"}'),
    ("POST", "/v1/completions", b'{"model": "fast"}'),
    ("POST", "/v1/chat/completions", b"[" * 200 + b"]" * 200),
    ("POST", "/v1/chat/completions", b"x" * (MAX_BODY + 1)),
    ("GET", "/v1/chat/completions", b""),
    ("PUT", "/v1/completions", b"{}"),
]


@pytest.mark.parametrize(("method", "path", "body"), _SAME_ANSWER)
def test_native_and_framework_layers_answer_alike(
    gw: GatewayProcess,
    sim: SimulatorProcess,
    method: str,
    path: str,
    body: bytes,
) -> None:
    """Status, error type and code, and content type are the same on both layers."""
    native = httpx.request(method, gw.url + path, content=body, timeout=10)
    settings = Settings.model_validate(_config(sim))
    with TestClient(app=create_app(settings)) as client:
        framework = client.request(method, path, content=body)
    assert native.status_code == framework.status_code
    assert native.headers["content-type"] == framework.headers["content-type"]
    assert native.json()["error"]["code"] == framework.json()["error"]["code"]
    assert native.json()["error"]["type"] == framework.json()["error"]["type"]


def test_reply_head_never_splits_a_header() -> None:
    """A header value with CR/LF (a backend's error code) cannot add a header or a body."""
    reply = Reply(502, {"x-tiergate-fallback-reason": "bad\r\nset-cookie: a=b"})
    head = reply_head(reply, keep_alive=True, length=0)
    lines = head.split(b"\r\n")
    assert not any(line.lower().startswith(b"set-cookie") for line in lines)
    assert head.endswith(b"\r\n\r\n")
    assert head.count(b"\r\n\r\n") == 1


@pytest.mark.parametrize("value", ["a\nset-cookie: x", "a\rset-cookie: x", "\r\n\r\n", "\n"])
def test_reply_head_keeps_one_line_per_header_whatever_the_break(value: str) -> None:
    """A lone CR or LF in any one of several values is blanked too; the others are kept."""
    reply = Reply(200, {"x-request-id": "r1", "x-tiergate-fallback-reason": value, "x-b": "2"})
    head = reply_head(reply, keep_alive=True, length=0).decode("latin-1")
    lines = head.split("\r\n")
    assert lines[1] == "x-request-id: r1"
    assert lines[2].startswith("x-tiergate-fallback-reason: ")
    assert lines[3] == "x-b: 2"
    assert "\n" not in "".join(lines)
    assert "\r" not in "".join(lines)
    assert head.endswith("\r\n\r\n")
    assert head.count("\r\n\r\n") == 1
