"""Attacks on the gateway's own upstream client (gateway/upstream/connection.py), by a backend.

A scripted raw server on loopback that never ends its answer's head, or never ends an SSE
event: the gateway must give up after a bounded number of bytes, not buffer the backend's
output until a timeout (httptools grows a header by concatenation: memory and CPU).
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import Outcome, Usage
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.connection import UpstreamConnectionError
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, Respond

PATH = "/v1/chat/completions"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
OK = b"HTTP/1.1 200 OK\r\n"
PIECE = 64 * 1024
BOUND = 8 << 20  # far above any limit, far below what a loopback backend sends in seconds


def _endless(prefix: bytes, piece: bytes, written: list[int]) -> Respond:
    """Write ``prefix`` then ``piece`` forever, counting bytes, until the client leaves."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(prefix)
        written.append(len(prefix))
        try:
            while written[0] < 4 * BOUND:
                writer.write(piece)
                written[0] += len(piece)
                await writer.drain()
        except ConnectionError:
            pass
        return False

    return respond


async def test_an_endless_answer_head_is_refused_after_a_bound() -> None:
    """A backend whose header never ends fails the request before 8 MiB, not at a timeout."""
    written: list[int] = []
    server = await RawUpstream(_endless(b"HTTP/1.1 200 OK\r\nX-A: ", b"a" * PIECE, written)).start()
    pool = UpstreamPool()
    try:
        async with asyncio.timeout(10):
            with pytest.raises(UpstreamConnectionError):
                await pool.post(server.url + PATH, b"{}", {})
    finally:
        await pool.close()
        await server.stop()
    assert written[0] < BOUND


async def test_an_endless_sse_event_mid_stream_fails_the_stream(upstream: UpstreamClient) -> None:
    """A backend that never ends an event after the first is cut off: an error, no buffering."""
    written: list[int] = []
    chunk = b"%x\r\n%s\r\n" % (PIECE, b"a" * PIECE)
    start = HEAD + b"%x\r\n%s\r\n" % (len(FIRST) + 6, FIRST + b"data: ")
    server = await RawUpstream(_endless(start, chunk, written)).start()
    pool = ReplicaPool("fast", [server.url], 8, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(), "m")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    closed: list[tuple[str, Usage | None]] = []
    sent = b""
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        forwarded = await forwarder.forward(PATH, body, ["fast"])
        relay = StreamRelay(
            forwarded.exchange,
            strip_usage=False,
            idle_s=5.0,
            on_close=lambda outcome, usage: closed.append((outcome, usage)),
        )
        async with asyncio.timeout(20):
            async for piece in relay:
                sent += piece
    finally:
        await server.stop()
    assert written[0] < BOUND
    assert closed[0][0] == Outcome.UPSTREAM_ERROR
    assert b'"error"' in sent.splitlines()[-2]
    assert b"[DONE]" not in sent


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nxx",
        OK + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n",
        OK + b"Content-Length: 2\r\n\r\nok" + OK + b"Content-Length: 4\r\n\r\nevil",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["upgrade", "length-and-chunked", "bad-chunk", "smuggled-second", "short", "garbage"],
)
async def test_a_broken_answer_is_a_connection_error_not_a_crash(
    answer: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Invalid framing from a backend fails the request cleanly, never with a second body."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        await writer.drain()
        return False

    server = await RawUpstream(respond).start()
    pool = UpstreamPool()
    body = b""
    try:
        async with asyncio.timeout(5):
            try:
                response = await pool.post(server.url + PATH, b"{}", {})
                body = await response.read()
                response.release()
            except UpstreamConnectionError:
                body = b"<failed>"
    finally:
        await pool.close()
        await server.stop()
    assert body in (b"ok", b"<failed>")
    assert "Fatal error" not in caplog.text
