"""Reading answers on the request path's own client: body framings, reads, flow control, aborts.

Real loopback sockets throughout: a scripted raw server (tests/gateway/raw_upstream.py) and,
for a real SSE stream, the simulator's app.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.upstream.connection import HIGH_WATER, Connection, ConnectionLost
from gateway.upstream.pool import UpstreamPool
from simulator.app import build_app
from simulator.profiles import FAST
from simulator.state import SimConfig, SimState
from tests.gateway.raw_upstream import RawUpstream, Respond, answer

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json"}
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"
)


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    """An open pool, closed after the test."""
    client = UpstreamPool()
    try:
        yield client
    finally:
        await client.close()


def _writes(payload: bytes, *, keep: bool = True) -> Respond:
    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(payload)
        await writer.drain()
        return keep

    return respond


async def _read_once(pool: UpstreamPool, respond: Respond) -> tuple[bytes, RawUpstream]:
    server = await RawUpstream(respond).start()
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        body = await response.read()
        response.release()
    finally:
        await server.stop()
    return body, server


async def test_a_content_length_body_is_read_whole(pool: UpstreamPool) -> None:
    """Content-Length framing: exactly the body."""
    body, _ = await _read_once(pool, _writes(answer(b"x" * 100_000)))
    assert body == b"x" * 100_000


async def test_a_chunked_body_is_read_whole_and_the_connection_kept(pool: UpstreamPool) -> None:
    """Chunked framing: the chunks joined; the connection goes back to the pool."""
    server = await RawUpstream(_writes(CHUNKED)).start()
    try:
        for _ in range(2):
            response = await pool.post(server.url + PATH, b"{}", HEADERS)
            assert await response.read() == b"hello, world"
            response.release()
    finally:
        await server.stop()
    assert server.connections == 1


async def test_a_body_delimited_by_eof_ends_at_the_close(pool: UpstreamPool) -> None:
    """No length and no chunking: the body is what came before the server closed."""
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    body, _ = await _read_once(pool, _writes(head + b"until the end", keep=False))
    assert body == b"until the end"


async def test_a_body_of_a_204_is_empty(pool: UpstreamPool) -> None:
    """A 204 has no body, whatever its headers say."""
    body, _ = await _read_once(pool, _writes(b"HTTP/1.1 204 No Content\r\n\r\n"))
    assert body == b""


async def test_readuntil_splits_events_across_pieces_and_enforces_max_size(
    pool: UpstreamPool,
) -> None:
    """Events split over writes come back whole; one over max_size raises ValueError."""

    async def events(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"data: a\n", b"\ndata: b\n\nda", b"ta: " + b"c" * 200 + b"\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        return True

    server = await RawUpstream(events).start()
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        assert await response.readuntil(b"\n\n", 100) == b"data: a\n\n"
        assert await response.readuntil(b"\n\n", 100) == b"data: b\n\n"
        with pytest.raises(ValueError, match="size limit"):
            await response.readuntil(b"\n\n", 100)
        response.close()
    finally:
        await server.stop()


async def test_readany_ends_with_empty_bytes_and_read_at_most_bounds(pool: UpstreamPool) -> None:
    """readany gives b"" at the end; read_at_most returns no more than asked."""
    server = await RawUpstream(_writes(answer(b"0123456789"))).start()
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        assert await response.read_at_most(4) == b"0123"
        assert await response.readany() == b""
        response.release()
    finally:
        await server.stop()


async def test_reading_pauses_above_the_high_water_mark(pool: UpstreamPool) -> None:
    """A big body not being read stays bounded in the client; read on, it arrives whole."""
    size = 8 * 1024 * 1024
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
    server = await RawUpstream(_writes(head + b"y" * size)).start()
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        await asyncio.sleep(0.3)  # the server writes as fast as it can meanwhile
        assert HIGH_WATER < response.buffered <= 2 * HIGH_WATER
        total = 0
        while data := await response.readany():
            assert response.buffered <= 2 * HIGH_WATER
            total += len(data)
        response.release()
    finally:
        await server.stop()
    assert total == size


async def test_cancelling_mid_answer_closes_the_upstream_connection(pool: UpstreamPool) -> None:
    """A reader cancelled mid-body closes the connection: the server sees the client leave."""

    async def endless(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await server.wait_peer_closed(reader)
        return False

    server = await RawUpstream(endless).start()
    try:
        response = await pool.post(server.url + PATH, b"{}", HEADERS)
        assert await response.readany() == b"first"

        async def read_on() -> None:
            try:
                await response.readany()
            finally:
                response.close()

        task = asyncio.create_task(read_on())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.peer_closed.wait(), 2.0)
    finally:
        await server.stop()


async def test_cancelling_before_the_head_closes_the_connection(pool: UpstreamPool) -> None:
    """A post cancelled while waiting for the answer's head closes its connection."""

    async def silent(_n: int, reader: asyncio.StreamReader, _w: asyncio.StreamWriter) -> bool:
        await server.wait_peer_closed(reader)
        return False

    server = await RawUpstream(silent).start()
    try:
        task = asyncio.create_task(pool.post(server.url + PATH, b"{}", HEADERS))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.peer_closed.wait(), 2.0)
    finally:
        await server.stop()


async def test_a_malformed_answer_is_a_lost_connection(pool: UpstreamPool) -> None:
    """Bytes that are not HTTP: ConnectionLost, not a parser error."""
    server = await RawUpstream(_writes(b"SSH-2.0-OpenSSH\r\n\r\n")).start()
    try:
        with pytest.raises(ConnectionLost):
            await pool.post(server.url + PATH, b"{}", HEADERS)
    finally:
        await server.stop()


async def test_a_simulator_stream_is_read_event_by_event(pool: UpstreamPool) -> None:
    """The simulator's SSE answer: events up to [DONE], then the end of the body."""
    config = SimConfig(
        profile=FAST, model="m", replica="r", latency_scale=0.01, jitter=0.0, output_tokens=4
    )
    runner = web.AppRunner(build_app(SimState(config)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    try:
        response = await pool.post(f"http://{host}:{port}{PATH}", body, HEADERS)
        assert response.status == 200
        assert (response.header("content-type") or "").startswith("text/event-stream")
        events = []
        while event := await response.readuntil(b"\n\n", 1 << 20):
            events.append(event)
        response.release()
    finally:
        await runner.cleanup()
    assert events[0].startswith(b"data: {")
    assert events[-1] == b"data: [DONE]\n\n"


async def test_a_closed_connection_leaves_no_reference_cycles(pool: UpstreamPool) -> None:
    """The parser holds the connection's callbacks and the transport the connection: once it
    is closed (here by the backend, after the answer) neither holds it, so it dies by reference
    counting, not in a full garbage collection (which a busy server defers:
    gateway/http/collector.py)."""
    gc.collect()
    gc.disable()
    try:
        body, _ = await _read_once(
            pool, _writes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", keep=False)
        )
        assert body == b"ok"
        await asyncio.sleep(0.05)  # the close reaches the connection
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, Connection)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
