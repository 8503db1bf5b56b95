"""Attacks on the pump (:mod:`gateway.upstream.pump`): a stream relayed from the backend
connection's callback must give the client what the iterated relay gives, in order, and end
each way the iterated relay ends, over a scripted loopback backend."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from gateway.pipeline.events import Outcome
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.pump import Pump
from gateway.upstream.relay import StreamRelay
from tests.gateway.raw_upstream import Respond
from tests.gateway.relay_drive import DRIVES, Recorder, drive, open_relay
from tests.processes import patience

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
FINAL = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _token(i: int) -> bytes:
    return (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"t%d"},'
        b'"finish_reason":null}]}\n\n' % i
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _numbers(text: bytes) -> list[int]:
    return [int(part.split(b'"', 1)[0]) for part in text.split(b'"content":"t')[1:]]


def _bursts(bursts: int, per: int) -> Respond:
    """``bursts`` writes of ``per`` chunked pieces each (one read holds many pieces)."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        await writer.drain()
        i = 0
        for _ in range(bursts):
            writer.write(b"".join(_chunk(_token(i + k)) for k in range(per)))
            i += per
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(_chunk(FINAL + DONE) + b"0\r\n\r\n")
        return True

    return respond


async def test_a_client_that_fills_mid_read_gets_the_rest_of_that_read_in_order(
    upstream: UpstreamClient,
) -> None:
    """Each backend read carries 20 chunked pieces; the client's buffer is full after the
    5th write and again every 7 writes after it: every token arrives, once, in order."""
    relay, pool, server = await open_relay(upstream, _bursts(10, 20), idle_s=30.0)
    out = Recorder()

    def on_write(client: Recorder) -> None:
        if len(client.chunks) % 7 == 5:
            client.pause()
            asyncio.get_running_loop().call_later(0.01, client.resume)

    out.on_write = on_write
    try:
        assert await asyncio.wait_for(Pump(relay)(out), patience(10.0))
    finally:
        await server.stop()
    assert _numbers(out.text) == list(range(200))
    assert out.text.endswith(DONE)
    assert relay.complete
    assert pool.replicas[0].in_flight == 0


@pytest.mark.parametrize("how", DRIVES)
async def test_crlf_stream_split_between_cr_and_lf_while_diverted(
    upstream: UpstreamClient, how: str
) -> None:
    """A llama.cpp-style CRLF stream whose events are split between ``\\r`` and ``\\n``
    across chunked pieces and reads: every event arrives, in order, LF-framed."""
    crlf = [e.replace(b"\n", b"\r\n") for e in [FIRST, *(_token(i) for i in range(30)), FINAL]]

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(crlf[0]))
        await writer.drain()
        body = b"".join(crlf[1:]) + DONE.replace(b"\n", b"\r\n")
        # cut every piece right after a \r
        pieces, start = [], 0
        for at in range(len(body)):
            if body[at : at + 1] == b"\r" and at - start > 40:
                pieces.append(body[start : at + 1])
                start = at + 1
        pieces.append(body[start:])
        for piece in pieces:
            writer.write(_chunk(piece))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        return True

    relay, pool, server = await open_relay(upstream, respond, idle_s=30.0)
    try:
        text = await drive(relay, how)
    finally:
        await server.stop()
    assert b"\r" not in text
    assert _numbers(text) == list(range(30))
    assert text.endswith(DONE)
    assert relay.complete
    assert pool.replicas[0].in_flight == 0


@pytest.mark.parametrize("how", DRIVES)
async def test_a_second_answer_after_the_body_in_the_same_read(
    upstream: UpstreamClient, how: str
) -> None:
    """A backend that writes a second answer right after the stream's end, in the same
    read: the stream is complete, the connection is not reused, no slot leaks."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(
            _chunk(_token(0))
            + _chunk(FINAL + DONE)
            + b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        )
        await writer.drain()
        return False

    relay, pool, server = await open_relay(upstream, respond, idle_s=30.0)
    try:
        text = await drive(relay, how)
        await asyncio.sleep(0.05)
    finally:
        await server.stop()
    assert text.endswith(DONE)
    assert b"hello" not in text
    assert relay.complete
    assert pool.replicas[0].in_flight == 0


@pytest.mark.parametrize("how", DRIVES)
async def test_a_client_that_leaves_while_done_is_held_is_not_complete(
    upstream: UpstreamClient, how: str
) -> None:
    """With settle-first admission the chunk with [DONE] waits for the settlement; a client
    that leaves during it (its task is cancelled) never gets [DONE]: both ways, the stream's
    outcome is the client's disconnect (the access line's), not ``complete``."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(_chunk(_token(0) + FINAL + DONE) + b"0\r\n\r\n")
        return True

    relay, pool, server = await open_relay(upstream, respond, idle_s=30.0)
    settling = asyncio.Event()

    async def settle() -> None:
        settling.set()
        await asyncio.sleep(10)

    out = Recorder()
    stream = relay.__aiter__()

    async def iterate() -> None:  # what the Litestar path does (proxy._settled_before_end)
        async for chunk in stream:
            if relay.done:
                await settle()
            out.write(chunk)

    task = asyncio.create_task(Pump(relay, settle=settle)(out) if how == "pump" else iterate())
    try:
        await asyncio.wait_for(settling.wait(), patience(2.0))
        out.gone = True
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator
        await relay.close()
        await server.stop()
    assert DONE not in out.text
    assert relay.outcome == Outcome.CLIENT_DISCONNECT
    assert pool.replicas[0].in_flight == 0


@pytest.mark.parametrize("settling", [False, True])
async def test_a_pumped_relay_is_freed_by_reference_counting(
    upstream: UpstreamClient, settling: bool
) -> None:
    """The pump, its relay and the connection's sink leave no cycle once the stream ended
    (the garbage collector's full collections are what the pump is there to spare)."""
    seen: list[object] = []

    async def settle() -> None:
        seen.append("settled")

    async def pumped() -> weakref.ref[StreamRelay]:
        relay, _pool, server = await open_relay(upstream, _bursts(3, 5), idle_s=30.0)
        relay.on_close = lambda _outcome, _usage: seen.append(relay.cut)
        pump = Pump(relay, settle=settle if settling else None)
        try:
            assert await pump(Recorder())
        finally:
            await server.stop()
        return weakref.ref(relay)  # the pump holds it: freed with the pump

    gc.collect()
    gc.disable()
    try:
        freed = await pumped()
        assert seen == (["settled", None] if settling else [None])  # settled before [DONE]
        assert freed() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("how", DRIVES)
@pytest.mark.parametrize("body_framing", ["content-length", "until-eof"])
async def test_a_stream_body_not_chunked_is_relayed_whole(
    upstream: UpstreamClient, how: str, body_framing: str
) -> None:
    """A stream whose body is delimited by its length or by the connection's close (an
    HTTP/1.0-style backend), sent in many small writes: complete, in order, both ways."""
    body = b"".join(_token(i) for i in range(40)) + FINAL + DONE

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        length = b"Content-Length: %d\r\n" % (len(FIRST) + len(body))
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += length if body_framing == "content-length" else b"Connection: close\r\n"
        writer.write(head + b"\r\n" + FIRST)
        await writer.drain()
        for at in range(0, len(body), 97):
            writer.write(body[at : at + 97])
            await writer.drain()
            await asyncio.sleep(0.001)
        return body_framing == "content-length"

    relay, pool, server = await open_relay(upstream, respond, idle_s=30.0)
    try:
        text = await drive(relay, how)
    finally:
        await server.stop()
    assert _numbers(text) == list(range(40))
    assert text.endswith(DONE)
    assert relay.complete
    assert pool.replicas[0].in_flight == 0


async def test_an_event_sent_a_byte_a_chunk_costs_the_pump_no_more_than_iterating(
    upstream: UpstreamClient,
) -> None:
    """A backend that sends one 192 KB event as one-byte chunks: the pump is handed each
    chunk on its own (not a read's worth at once), and must not copy the event's start again
    for every one of them (quadratic: about 17 s of a blocked event loop here, every client
    of the gateway frozen, where iterating takes a fraction of a second)."""
    size = 192_000
    big = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"'
        + b"y" * size
        + b'"},"finish_reason":null}]}\n\n'
    )

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"".join(b"1\r\n%c\r\n" % byte for byte in big))
        writer.write(_chunk(FINAL + DONE) + b"0\r\n\r\n")
        await writer.drain()
        return True

    took: dict[str, float] = {}
    for how in DRIVES:
        relay, pool, server = await open_relay(upstream, respond, idle_s=60.0)
        started = time.perf_counter()
        try:
            text = await drive(relay, how)
        finally:
            await server.stop()
        took[how] = time.perf_counter() - started
        assert text.count(b"y" * 1000) == size // 1000
        assert relay.complete
        assert pool.replicas[0].in_flight == 0
    assert took["pump"] < 5 * took["iterate"] + 1.0, took
