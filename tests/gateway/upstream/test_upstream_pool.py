"""The request path's own HTTP client: pooling, keep-alive, stale connections, limits, errors.

Every case runs against a real loopback socket: a scripted raw server (tests/gateway/
raw_upstream.py) or the simulator's app.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import msgspec
import pytest

from gateway.pipeline.events import FailureKind
from gateway.upstream.attempt import AttemptFailed, attempt
from gateway.upstream.connection import (
    ConnectFailed,
    ConnectionLost,
    ConnectTimedOut,
    UpstreamConnectionError,
)
from gateway.upstream.pool import UpstreamPool, header_block
from tests.gateway.raw_upstream import RawUpstream, answer, reset

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json"}


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    """An open pool, closed after the test."""
    client = UpstreamPool()
    try:
        yield client
    finally:
        await client.close()


async def _serve(respond: object) -> RawUpstream:
    server = RawUpstream(respond)  # type: ignore[arg-type]  # a Respond, typed at call sites
    return await server.start()


async def _post_ok(pool: UpstreamPool, server: RawUpstream) -> None:
    """One POST whose answer is ``ok``, read whole and released to the pool."""
    response = await pool.post(server.url + PATH, b"{}", HEADERS)
    assert await response.read() == b"ok"
    response.release()


async def _ok(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Answer every request with ``ok`` and keep the connection."""
    writer.write(answer(b"ok", extra=b"X-Answer: Yes\r\n"))
    return True


async def test_the_request_carries_host_length_and_the_callers_headers_only(
    pool: UpstreamPool,
) -> None:
    """POST with Host, Content-Length and the given headers; no User-Agent or encodings."""
    server = await _serve(_ok)
    try:
        response = await pool.post(server.url + PATH + "?a=1", b"{}", {"Authorization": "Bearer k"})
        assert await response.read() == b"ok"
        response.release()
    finally:
        await server.stop()
    (sent,) = server.requests
    port = server.url.rsplit(":", 1)[1]
    assert sent.startswith(b"POST /v1/chat/completions?a=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n".encode() in sent
    assert b"Authorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}" in sent
    assert b"User-Agent" not in sent
    assert b"Accept-Encoding" not in sent


async def test_headers_are_looked_up_case_insensitively(pool: UpstreamPool) -> None:
    """Status and any header by any case; a missing header is None."""
    server = await _serve(_ok)
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        assert response.status == 200
        assert response.header("x-answer") == response.header("X-ANSWER") == "Yes"
        assert response.header("Retry-After") is None
        await response.read()
        response.release()
    finally:
        await server.stop()


async def test_a_keep_alive_connection_is_reused(pool: UpstreamPool) -> None:
    """Two requests one after the other go over the same connection."""
    server = await _serve(_ok)
    try:
        for _ in range(2):
            await _post_ok(pool, server)
    finally:
        await server.stop()
    assert server.connections == 1
    assert len(server.requests) == 2


async def test_an_unread_body_closes_the_connection_instead_of_pooling_it(
    pool: UpstreamPool,
) -> None:
    """Released before its body was read: the next request opens a new connection."""
    server = await _serve(_ok)
    try:
        (await pool.post(server.url + PATH, b"{}", HEADERS)).release()
        await _post_ok(pool, server)
    finally:
        await server.stop()
    assert server.connections == 2


async def test_connection_close_is_honoured(pool: UpstreamPool) -> None:
    """An answer saying Connection: close is never followed by another request on it."""

    async def closing(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(b"ok", extra=b"Connection: close\r\n"))
        return True  # the server would even keep it: the client must not

    server = await _serve(closing)
    try:
        for _ in range(2):
            await _post_ok(pool, server)
    finally:
        await server.stop()
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    pool: UpstreamPool,
) -> None:
    """The server hangs up after answering: the next request opens a new connection."""

    async def once(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(b"ok"))
        await writer.drain()
        return False

    server = await _serve(once)
    try:
        for _ in range(2):
            await _post_ok(pool, server)
            await asyncio.sleep(0.05)  # the close reaches the client
    finally:
        await server.stop()
    assert server.connections == 2


async def test_a_stale_reused_connection_is_retried_once_on_a_new_one(pool: UpstreamPool) -> None:
    """A reused connection that closes before any answer byte: the request goes on a fresh one."""

    async def drop_second(n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if n == 2:
            return False  # the keep-alive race: closed without an answer
        writer.write(answer(b"ok"))
        return True

    server = await _serve(drop_second)
    try:
        for _ in range(2):
            await _post_ok(pool, server)
    finally:
        await server.stop()
    assert server.connections == 2
    assert len(server.requests) == 3


async def test_a_reused_connection_closing_after_answer_bytes_is_not_retried(
    pool: UpstreamPool,
) -> None:
    """Part of an answer came back before the close: the backend's failure, not resent."""

    async def half_head(n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if n == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-")
            await writer.drain()
            return False
        writer.write(answer(b"ok"))
        return True

    server = await _serve(half_head)
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        await response.read()
        response.release()
        with pytest.raises(ConnectionLost):
            await pool.post(server.url + PATH, b"{}", HEADERS)
    finally:
        await server.stop()
    assert len(server.requests) == 2


async def test_a_new_connection_closing_without_an_answer_is_not_retried(
    pool: UpstreamPool,
) -> None:
    """On a fresh connection the same failure is the backend's: ConnectionLost, one request."""

    async def hang_up(_n: int, _r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        return False

    server = await _serve(hang_up)
    try:
        with pytest.raises(ConnectionLost):
            await pool.post(server.url + PATH, b"{}", HEADERS)
    finally:
        await server.stop()
    assert len(server.requests) == 1


async def test_idle_connections_close_after_the_keep_alive_timeout() -> None:
    """Idle longer than keepalive_s: the pool closes it and the next request opens anew."""
    pool = UpstreamPool(keepalive_s=0.1)
    server = await _serve(_ok)
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        await response.read()
        response.release()
        await asyncio.wait_for(server.peer_closed.wait(), 2.0)
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        await response.read()
        response.release()
    finally:
        await pool.close()
        await server.stop()
    assert server.connections == 2


async def test_the_per_host_limit_queues_requests_on_one_connection() -> None:
    """limit_per_host=1: concurrent requests wait for the one connection and all succeed."""
    pool = UpstreamPool(limit_per_host=1)
    server = await _serve(_ok)

    async def one() -> bytes:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        body = await response.read()
        response.release()
        return body

    try:
        assert await asyncio.gather(*(one() for _ in range(5))) == [b"ok"] * 5
    finally:
        await pool.close()
        await server.stop()
    assert server.connections == 1


def _refusing_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_refused_port_is_a_connect_failure(pool: UpstreamPool) -> None:
    """Nothing listens: ConnectFailed, and attempt reports FailureKind.CONNECT."""
    url = _refusing_url() + PATH
    with pytest.raises(ConnectFailed):
        await pool.post(url, b"{}", HEADERS)
    with pytest.raises(AttemptFailed) as caught:
        await attempt(pool, url, b"{}", HEADERS, stream=False, timeout_s=5.0)
    assert caught.value.kind == FailureKind.CONNECT


async def test_a_full_accept_queue_is_a_connect_timeout(pool: UpstreamPool) -> None:
    """A loopback listener whose backlog is full never accepts: CONNECT_TIMEOUT at connect_s."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.settimeout(2.0)
        filler.connect(("127.0.0.1", port))  # takes the one queue slot; never accepted
        url = f"http://127.0.0.1:{port}{PATH}"
        with pytest.raises(ConnectTimedOut):
            await pool.post(url, b"{}", HEADERS, connect_s=0.2)
        with pytest.raises(AttemptFailed) as caught:
            await attempt(pool, url, b"{}", HEADERS, stream=False, timeout_s=5.0, connect_s=0.2)
    assert caught.value.kind == FailureKind.CONNECT_TIMEOUT


async def test_a_reset_mid_body_is_a_reset(pool: UpstreamPool) -> None:
    """Half a Content-Length body then a TCP reset: the read fails, attempt says RESET."""

    async def half(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)
        return False

    server = await _serve(half)
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        with pytest.raises(ConnectionError):
            await response.read()
        response.close()
        with pytest.raises(AttemptFailed) as caught:
            await attempt(pool, server.url + PATH, b"{}", HEADERS, stream=False, timeout_s=5.0)
    finally:
        await server.stop()
    assert caught.value.kind == FailureKind.RESET


async def test_an_error_status_becomes_a_status_failure_with_retry_after(
    pool: UpstreamPool,
) -> None:
    """A 503 with a JSON error and Retry-After: status_503, its message and the cool-down."""
    error = msgspec.json.encode({"error": {"message": "engine busy", "code": 503}})

    async def busy(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(error, status=503, extra=b"retry-after: 2\r\n"))
        return True

    server = await _serve(busy)
    try:
        with pytest.raises(AttemptFailed) as caught:
            await attempt(pool, server.url + PATH, b"{}", HEADERS, stream=False, timeout_s=5.0)
    finally:
        await server.stop()
    failure = caught.value
    assert (failure.kind, failure.status, failure.retry_after) == ("status_503", 503, 2.0)
    assert failure.message == "engine busy"


async def test_a_slow_answer_is_a_timeout_and_closes_the_connection(pool: UpstreamPool) -> None:
    """No answer within timeout_s: TIMEOUT, and the server sees the connection close."""

    async def silent(_n: int, reader: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        await server.wait_peer_closed(reader)
        return False

    server = await _serve(silent)
    try:
        with pytest.raises(AttemptFailed) as caught:
            await attempt(pool, server.url + PATH, b"{}", HEADERS, stream=False, timeout_s=0.1)
        await asyncio.wait_for(server.peer_closed.wait(), 2.0)
    finally:
        await server.stop()
    assert caught.value.kind == FailureKind.TIMEOUT


def test_a_header_with_a_line_break_is_refused() -> None:
    """Header injection: a CR or LF in a value raises instead of writing a second header."""
    assert header_block({"A": "b"}) == b"A: b\r\n"
    with pytest.raises(ValueError, match="line break"):
        header_block({"A": "b\r\nEvil: 1"})
    with pytest.raises(ValueError, match="line break"):
        header_block({"A": "b\nc"})


async def test_a_closed_pool_refuses_requests() -> None:
    """After close, a request fails as a connect failure."""
    pool = UpstreamPool()
    await pool.close()
    with pytest.raises(ConnectFailed):
        await pool.post("http://127.0.0.1:9" + PATH, b"{}", HEADERS)


async def test_a_get_sends_no_body_and_keeps_its_connection(pool: UpstreamPool) -> None:
    """GET (health probes, ops): the caller's headers and Host, no Content-Length; a body read
    to its end leaves the connection for the next request."""
    server = await _serve(_ok)
    try:
        for _ in range(2):
            status, body = await pool.get(
                server.url + "/health", {"Authorization": "Bearer k"}, limit=1024
            )
            assert (status, body) == (200, b"ok")
    finally:
        await server.stop()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:")
    assert first.endswith(b"Authorization: Bearer k\r\n\r\n")
    assert b"Content-Length" not in first


async def test_a_get_reads_at_most_its_limit_and_drops_the_connection(pool: UpstreamPool) -> None:
    """A body longer than the limit is cut there; the rest is not waited for and the
    connection is closed instead of pooled."""

    async def endless(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 20)
        await server.wait_peer_closed(reader)
        return False

    server = await _serve(endless)
    try:
        status, body = await pool.get(server.url + "/metrics", limit=10)
        await asyncio.wait_for(server.peer_closed.wait(), 30)
    finally:
        await server.stop()
    assert (status, body) == (200, b"x" * 10)
    assert server.peer_closed.is_set()


async def test_a_get_shares_the_failure_vocabulary(pool: UpstreamPool) -> None:
    """Nothing listening: the same ConnectFailed a POST raises (an UpstreamConnectionError);
    a caller's deadline on a silent server: TimeoutError, and the connection is closed."""
    with pytest.raises(UpstreamConnectionError):
        await pool.get(_refusing_url() + "/health", limit=10)

    async def silent(_n: int, reader: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        await server.wait_peer_closed(reader)
        return False

    server = await _serve(silent)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.get(server.url + "/health", limit=10)
        await asyncio.wait_for(server.peer_closed.wait(), 30)
    finally:
        await server.stop()
    assert server.peer_closed.is_set()
