"""The stream relay's outcomes over the request path's own client, against scripted streams.

A Forwarder opens each stream (its first event read in the attempt) from a raw loopback server
that then completes, resets, stalls or ends the stream early; the relay must say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

import pytest

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import Outcome, Usage
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.connection import HIGH_WATER
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, Respond, reset
from tests.gateway.relay_drive import DRIVES, Flood, drive, open_relay

PATH = "/v1/chat/completions"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
FINAL = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":8}}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _stream(ending: str, left: asyncio.Event) -> Respond:
    """The stream's script; ``left`` is set once the client closed a stalled stream."""

    async def respond(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST) + _chunk(TOKEN))
        await writer.drain()
        await asyncio.sleep(0.02)
        if ending == "done":
            writer.write(_chunk(TOKEN + FINAL + DONE) + b"0\r\n\r\n")
            return True
        if ending == "interrupted":  # llama-cpp-python's interrupt: [DONE] mid-answer
            writer.write(_chunk(TOKEN + DONE) + b"0\r\n\r\n")
            return True
        if ending == "final_no_done":  # a server that never sends [DONE]
            writer.write(_chunk(TOKEN + FINAL) + b"0\r\n\r\n")
            return True
        if ending == "reset":
            reset(writer)
            return False
        if ending == "early":
            writer.write(b"0\r\n\r\n")  # a well-formed end without [DONE]
            return True
        if ending == "pings":  # generation stopped; keep-alive comments go on
            with contextlib.suppress(ConnectionError):
                while not reader.at_eof():
                    writer.write(_chunk(b": ping\n\n"))
                    await writer.drain()
                    await asyncio.sleep(0.05)
        else:
            while await reader.read(65536):  # stall until the client leaves
                pass
        left.set()
        return False

    return respond


async def _relay(upstream: UpstreamClient, ending: str) -> tuple[bytes, str]:
    """The stream ``ending`` relayed both ways (iterated, and pumped from the connection's
    callback): the client gets the same bytes and the stream the same outcome."""
    results = {how: await _relay_once(upstream, ending, how) for how in DRIVES}
    assert results["pump"] == results["iterate"]
    return results["pump"]


async def _relay_once(upstream: UpstreamClient, ending: str, how: str) -> tuple[bytes, str]:
    left = asyncio.Event()
    server = await RawUpstream(_stream(ending, left)).start()
    pool = ReplicaPool("fast", [server.url], 8, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(), "m")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    closed: list[tuple[str, Usage | None]] = []
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        forwarded = await forwarder.forward(PATH, body, ["fast"])
        assert forwarded.exchange.first_event == FIRST
        relay = StreamRelay(
            forwarded.exchange,
            strip_usage=False,
            idle_s=0.2,
            on_close=lambda outcome, usage: closed.append((outcome, usage)),
        )
        text = await drive(relay, how)
        assert pool.replicas[0].in_flight == 0
        if ending == "stall":
            await asyncio.wait_for(left.wait(), 2.0)  # the abort reached the backend
    finally:
        await server.stop()
    ((outcome, _usage),) = closed
    return text, outcome


async def test_a_complete_stream_ends_with_done(upstream: UpstreamClient) -> None:
    """Every event, then [DONE]: COMPLETE."""
    text, outcome = await _relay(upstream, "done")
    assert outcome == Outcome.COMPLETE
    assert text.startswith(FIRST)
    assert text.endswith(DONE)


async def test_done_before_a_finish_reason_is_truncated_not_complete(
    upstream: UpstreamClient,
) -> None:
    """[DONE] while the answer had no final chunk: UPSTREAM_TRUNCATED, an error, no [DONE]."""
    text, outcome = await _relay(upstream, "interrupted")
    assert outcome == Outcome.UPSTREAM_TRUNCATED
    assert b"before the answer was finished" in text
    assert DONE not in text


async def test_a_final_chunk_then_a_clean_end_is_complete(upstream: UpstreamClient) -> None:
    """A server without [DONE]: its final chunk, then the end of the body, is COMPLETE, and
    the caller gets the [DONE] it expects."""
    text, outcome = await _relay(upstream, "final_no_done")
    assert outcome == Outcome.COMPLETE
    assert FINAL in text
    assert text.endswith(DONE)


async def test_a_reset_mid_stream_is_an_upstream_reset(upstream: UpstreamClient) -> None:
    """A TCP reset after the first tokens: UPSTREAM_RESET and an in-band error, no [DONE]."""
    text, outcome = await _relay(upstream, "reset")
    assert outcome == Outcome.UPSTREAM_RESET
    assert b"lost mid-stream" in text
    assert DONE not in text


async def test_a_stream_ended_without_done_is_truncated(upstream: UpstreamClient) -> None:
    """The body ends cleanly but without [DONE]: UPSTREAM_TRUNCATED."""
    text, outcome = await _relay(upstream, "early")
    assert outcome == Outcome.UPSTREAM_TRUNCATED
    assert DONE not in text


async def test_a_stalled_stream_is_a_stall_and_its_connection_closes(
    upstream: UpstreamClient,
) -> None:
    """No event within idle_s: UPSTREAM_STALL, and the backend sees the connection close."""
    text, outcome = await _relay(upstream, "stall")
    assert outcome == Outcome.UPSTREAM_STALL
    assert b"stopped sending" in text


@pytest.mark.parametrize("how", DRIVES)
async def test_keep_alive_comments_do_not_hold_a_stalled_stream_open(
    upstream: UpstreamClient, how: str
) -> None:
    """A token, then only ``: ping`` comments every 50 ms: no chunk within idle_s is a stall,
    cut as one, pings or not (any bytes used to restart the idle clock, so such a stream ran
    to the request's deadline)."""
    text, outcome = await asyncio.wait_for(_relay_once(upstream, "pings", how), 10.0)
    assert outcome == Outcome.UPSTREAM_STALL
    assert b": ping" in text  # relayed while they came: the caller's own keep-alive
    assert b"stopped sending" in text


@pytest.mark.parametrize("how", DRIVES)
async def test_events_of_any_dialect_restart_the_idle_clock(
    upstream: UpstreamClient, how: str
) -> None:
    """Ten chunks 50 ms apart, each over two ``data:`` lines without the space (passed on as
    sent, never parsed as a chunk), then the end: 0.5 s in all against an idle limit of
    0.2 s, and complete, since every event with data restarts the clock."""
    split = b'data:{"id":"c","choices":[{"index":0,\ndata:"delta":{"content":"x"}}]}\n\n'

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        for _ in range(10):
            await asyncio.sleep(0.05)
            writer.write(_chunk(split))
            await writer.drain()
        writer.write(_chunk(TOKEN + FINAL + DONE) + b"0\r\n\r\n")
        return True

    relay, _pool, server = await open_relay(upstream, respond)
    try:
        text = await asyncio.wait_for(drive(relay, how), 10.0)
    finally:
        await server.stop()
    assert relay.cut is None
    assert relay.complete
    assert text.count(split) == 10


async def test_each_event_is_relayed_before_the_next_arrives_and_one_read_is_one_chunk(
    upstream: UpstreamClient,
) -> None:
    """The backend writes its next event only after the caller got the last one (a relay that
    held one back would never finish); events of one read come out as one chunk."""
    got = asyncio.Event()

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        for _ in range(5):
            await asyncio.wait_for(got.wait(), 2.0)
            got.clear()
            writer.write(_chunk(TOKEN))
            await writer.drain()
        await asyncio.wait_for(got.wait(), 2.0)
        writer.write(_chunk(TOKEN + TOKEN + FINAL + USAGE + DONE) + b"0\r\n\r\n")
        return True

    relay, _pool, server = await open_relay(upstream, respond)
    chunks = []
    try:
        async for chunk in relay:
            chunks.append(chunk)
            got.set()
    finally:
        await server.stop()
    assert chunks == [FIRST, *[TOKEN] * 5, TOKEN + TOKEN + FINAL + USAGE + DONE]
    assert relay.complete


async def test_a_caller_that_stops_taking_events_stops_the_reads_and_is_no_backend_stall(
    upstream: UpstreamClient,
) -> None:
    """While the caller takes nothing (a client not reading), the relay reads nothing: the
    backend's bytes wait in the connection (bounded by its high-water mark) and the kernel,
    the backend's writes stop, and a pause longer than the idle limit (0.2 s) is not the
    backend's stall."""
    flood = Flood(HEAD + _chunk(FIRST), TOKEN * 10, FINAL + DONE)
    relay, pool, server = await open_relay(upstream, flood)
    stream = relay.__aiter__()
    try:
        assert await anext(stream) == FIRST
        received = (await anext(stream)).count(b'"content"')
        await asyncio.sleep(0.6)  # three idle limits without taking anything
        assert await flood.held() < flood.writes  # the backend is held back
        held = relay.exchange.opened.response.buffered  # type: ignore[union-attr]
        assert (
            held <= HIGH_WATER + 256 * 1024
        )  # paused at the mark (plus one read, uvloop: 256 KiB)
        assert relay.cut is None
        async for chunk in stream:
            received += chunk.count(b'"content"')
    finally:
        await server.stop()
    assert relay.complete
    assert received == flood.writes * 10  # every token
    assert pool.replicas[0].in_flight == 0


async def test_a_finished_relay_is_freed_by_reference_counting(upstream: UpstreamClient) -> None:
    """The caller's ``on_close`` closure refers to the relay (as the proxy's does): once the
    stream has ended, no cycle is left for the garbage collector, whose full collections
    take tens of milliseconds with thousands of streams open."""
    seen: list[object] = []

    async def relayed() -> weakref.ref[StreamRelay]:
        relay, _pool, server = await open_relay(upstream, _stream("done", asyncio.Event()))
        relay.on_close = lambda _outcome, _usage: seen.append(relay.cut)
        try:
            async for _chunk in relay:
                pass
        finally:
            await server.stop()
        return weakref.ref(relay)

    gc.collect()
    gc.disable()
    try:
        freed = await relayed()
        assert seen == [None]
        assert freed() is None
    finally:
        gc.enable()
