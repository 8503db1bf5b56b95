"""The pump: a stream relayed from the backend connection's callback, over the request path's
own client and a scripted loopback backend.

What the client receives and how each stream ends is checked both ways, iterated and pumped,
by every test of ``test_relay.py`` and the stream-ending attacks (``relay_drive.DRIVES``).
These tests check what only the pump does: the request's task sleeps while events flow, a
client that stops reading holds the backend back, the request settles before ``[DONE]``, and a
client that leaves or stalls, or a failure inside the callback, ends the stream cleanly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from gateway.pipeline.events import Outcome, Usage
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.connection import HIGH_WATER, Connection
from gateway.upstream.pump import Pump
from gateway.upstream.relay import StreamRelay
from gateway.upstream.stream_cuts import Cut
from tests.gateway.relay_drive import Flood, Recorder, open_relay
from tests.processes import patience

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
FINAL = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"
Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _paced(tokens: int, *, end: bytes = FINAL + DONE) -> Script:
    """``tokens`` events, each in its own write and read, then ``end``."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        for _ in range(tokens):
            writer.write(_chunk(TOKEN))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(_chunk(end) + b"0\r\n\r\n")
        return True

    return respond


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each wait of a reader on an upstream connection began."""
    started: list[float] = []
    wait = Connection.wait

    async def counted(self: Connection) -> None:
        started.append(time.monotonic())
        await wait(self)

    monkeypatch.setattr(Connection, "wait", counted)
    return started


@pytest.fixture
def closed() -> list[tuple[str, Usage | None]]:
    """What ``on_close`` was called with (set on each relay by the tests)."""
    return []


def _watched(relay: StreamRelay, closed: list[tuple[str, Usage | None]]) -> StreamRelay:
    relay.on_close = lambda outcome, usage: closed.append((outcome, usage))
    return relay


async def test_the_task_sleeps_while_events_flow(
    upstream: UpstreamClient, waits: list[float], closed: list[tuple[str, Usage | None]]
) -> None:
    """200 events in 200 reads: each is written to the client from the connection's callback,
    and the request's task waits once for the lot (the end of the body wakes it), not once per
    event as an iterated relay does."""
    relay, pool, server = await open_relay(upstream, _paced(200))
    out = Recorder()
    try:
        assert await Pump(_watched(relay, closed))(out)
    finally:
        await server.stop()
    assert out.text.count(b'"content"') == 200
    assert out.text.endswith(DONE)
    assert len(out.chunks) > 100  # relayed as they came, not gathered
    assert len(waits) <= 3
    assert closed == [(Outcome.COMPLETE, relay.usage)]
    assert pool.replicas[0].in_flight == 0


async def test_a_client_that_stops_reading_holds_the_backend_back(
    upstream: UpstreamClient,
) -> None:
    """The client's buffer is full after the third write: nothing more is written to it, the
    backend's bytes wait in the connection up to its high-water mark and the backend's writes
    stop; once the client reads again it gets every token, in order, and the stream is
    complete. A pause three times the idle limit (0.2 s) is not the backend's stall."""
    flood = Flood(HEAD + _chunk(FIRST), TOKEN * 10, FINAL + DONE)
    relay, pool, server = await open_relay(upstream, flood)
    out = Recorder()
    out.on_write = lambda client: client.pause() if len(client.chunks) == 3 else None
    pumping = asyncio.create_task(Pump(relay)(out))
    try:
        await asyncio.sleep(0.6)
        assert await flood.held() < flood.writes  # the backend is held back
        assert len(out.chunks) == 3
        held = relay.exchange.opened.response.buffered  # type: ignore[union-attr]
        assert held <= HIGH_WATER + 256 * 1024  # the mark, plus one read (uvloop: 256 KiB)
        assert relay.cut is None
        out.on_write = None
        out.resume()
        assert await asyncio.wait_for(pumping, patience(20.0))
    finally:
        await server.stop()
    assert relay.complete
    assert out.text.count(b'"content"') == flood.writes * 10
    assert pool.replicas[0].in_flight == 0


async def test_the_request_settles_before_the_client_sees_done(upstream: UpstreamClient) -> None:
    """With ``settle``, the chunk with [DONE] waits until the request is settled."""
    relay, _pool, server = await open_relay(upstream, _paced(5))
    out = Recorder()
    seen_at_settle: list[bytes] = []

    async def settle() -> None:
        seen_at_settle.append(out.text)
        await asyncio.sleep(0.01)

    try:
        assert await Pump(relay, settle=settle)(out)
    finally:
        await server.stop()
    (text_then,) = seen_at_settle
    assert DONE not in text_then
    assert text_then.count(b'"content"') <= 5
    assert FINAL in out.text
    assert out.text.endswith(DONE)
    assert relay.complete


async def test_a_cut_stream_settles_once_after_its_error_event(upstream: UpstreamClient) -> None:
    """A stream the backend ends early: the error event, then the settlement, once."""
    relay, _pool, server = await open_relay(upstream, _paced(3, end=b""))
    out = Recorder()
    settled: list[bytes] = []

    async def settle() -> None:
        settled.append(out.text)

    try:
        assert await Pump(relay, settle=settle)(out)
    finally:
        await server.stop()
    assert settled == [out.text]
    assert b"ended the stream early" in out.text
    assert relay.outcome == Outcome.UPSTREAM_TRUNCATED


async def test_a_client_that_leaves_aborts_the_backend(
    upstream: UpstreamClient, closed: list[tuple[str, Usage | None]]
) -> None:
    """The request's task is cancelled mid-stream (the client left): the relay closes once,
    the backend's connection is aborted and its slot freed, and nothing is written after."""
    left = asyncio.Event()

    async def respond(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST) + _chunk(TOKEN))
        await writer.drain()
        while await reader.read(65536):  # until the gateway hangs up
            pass
        left.set()
        return False

    relay, pool, server = await open_relay(upstream, respond, idle_s=30.0)
    out = Recorder()
    token = asyncio.Event()
    out.on_write = lambda client: token.set() if b'"content"' in client.text else None
    pumping = asyncio.create_task(Pump(_watched(relay, closed))(out))
    try:
        await asyncio.wait_for(token.wait(), patience(2.0))
        out.gone = True
        pumping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pumping
        await asyncio.wait_for(left.wait(), patience(2.0))
    finally:
        await server.stop()
    assert closed == [(Outcome.CLIENT_DISCONNECT, relay.usage)]
    assert pool.replicas[0].in_flight == 0


async def test_a_client_cut_for_stalling_ends_the_pump(upstream: UpstreamClient) -> None:
    """The writer cut a client that read nothing for its stall limit: the pump says so and
    the backend's stream is aborted with the client-stall cut."""
    relay, pool, server = await open_relay(upstream, _paced(50), idle_s=30.0)
    out = Recorder()
    out.stalled = True
    out.on_stall = relay.stalled  # what the writer calls before it cuts the client
    out.on_write = lambda client: client.pause() if len(client.chunks) == 2 else None
    try:
        assert not await Pump(relay)(out)
    finally:
        await server.stop()
    assert relay.outcome == Outcome.CLIENT_DISCONNECT
    assert relay.cut == Cut.CLIENT_STALL
    assert relay.closed
    assert len(out.chunks) == 2
    assert pool.replicas[0].in_flight == 0


async def test_a_failure_inside_the_callback_ends_the_stream_readably(
    upstream: UpstreamClient,
) -> None:
    """An error while relaying an event in the connection's callback: the client gets the
    gateway's error event and no [DONE], the outcome is an internal error, and the backend's
    connection is closed."""
    relay, pool, server = await open_relay(upstream, _paced(20), idle_s=30.0)
    seen = 0

    def on_event(_event: bytes) -> None:
        nonlocal seen
        seen += 1
        if seen == 5:
            raise RuntimeError("a bug on an odd event")

    relay.on_event = on_event
    out = Recorder()
    try:
        assert await Pump(relay)(out)
    finally:
        await server.stop()
    assert out.text.endswith(b"\n\n")
    assert b"failed while relaying" in out.text
    assert DONE not in out.text
    assert relay.outcome == Outcome.INTERNAL_ERROR
    assert pool.replicas[0].in_flight == 0


async def test_a_client_that_stalls_on_the_last_chunk_is_cut_not_complete(
    upstream: UpstreamClient,
) -> None:
    """The client's buffer fills with the stream's last write and it reads no more: the
    stream waits for it like any other chunk, and its stall cut makes the stream a client
    disconnect, not complete (as the iterated relay reports it)."""
    relay, pool, server = await open_relay(upstream, _paced(5), idle_s=30.0)
    out = Recorder()
    out.on_stall = relay.stalled
    out.on_write = lambda client: client.pause() if client.text.endswith(DONE) else None
    out.stalled = True
    try:
        assert not await Pump(relay)(out)
    finally:
        await server.stop()
    assert out.text.endswith(DONE)
    assert relay.cut == Cut.CLIENT_STALL
    assert relay.outcome == Outcome.CLIENT_DISCONNECT
    assert pool.replicas[0].in_flight == 0


async def test_the_events_of_one_read_go_to_the_client_in_one_write(
    upstream: UpstreamClient,
) -> None:
    """A backend that falls behind and sends 50 events at once (one HTTP chunk each, one
    read): they reach the client in one write, not 50 (a write is a system call; a gateway
    behind on its reads must not pay one per event)."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"".join([_chunk(TOKEN)] * 50) + _chunk(FINAL + DONE) + b"0\r\n\r\n")
        return True

    relay, _pool, server = await open_relay(upstream, respond, idle_s=30.0)
    out = Recorder()
    try:
        assert await Pump(relay)(out)
    finally:
        await server.stop()
    assert out.text.count(b'"content"') == 50
    assert out.text.endswith(DONE)
    assert len(out.chunks) <= 3  # the first event, the burst (and the usage + [DONE] ending)
