"""What a relayed stream tells its replica's speed: the decode time per token after the first
token, from complete streams of one choice with enough tokens (docs/replicas.md)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import MIN_DECODE_TOKENS
from gateway.upstream.relay import StreamRelay
from tests.gateway.raw_upstream import Respond
from tests.gateway.relay_drive import drive, open_relay

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
END = b"data: [DONE]\n\n"


def _token(index: int) -> bytes:
    return b'data: {"choices":[{"index":%d,"delta":{"content":"x"},"finish_reason":null}]}\n\n' % (
        index
    )


def _final(index: int) -> bytes:
    return b'data: {"choices":[{"index":%d,"delta":{},"finish_reason":"stop"}]}\n\n' % index


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _script(tokens: int, choices: int, prefill_s: float) -> Respond:
    """A stream that waits ``prefill_s`` before its first token, then sends ``tokens`` tokens
    per choice 2 ms apart."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(ROLE))
        await writer.drain()
        await asyncio.sleep(prefill_s)
        for _ in range(tokens):
            writer.write(_chunk(b"".join(_token(i) for i in range(choices))))
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.write(_chunk(b"".join(_final(i) for i in range(choices)) + END) + b"0\r\n\r\n")
        return True

    return respond


async def _speed_after(
    upstream: UpstreamClient, tokens: int, choices: int = 1, prefill_s: float = 0.0
) -> tuple[int, float]:
    """One stream relayed to its end: the replica's sample count and average."""
    respond = _script(tokens, choices, prefill_s)
    relay, pool, server = await open_relay(upstream, respond, idle_s=2.0)
    try:
        if choices > 1:  # the same exchange, relayed as a request for several choices
            relay = StreamRelay(relay.exchange, strip_usage=False, idle_s=2.0,
                                on_close=lambda _o, _u: None, choices=choices)  # fmt: skip
        await drive(relay, "iterate")
    finally:
        await server.stop()
    replica = pool.replicas[0]
    return replica.token_n, replica.token_avg


async def test_the_time_before_the_first_token_does_not_count(upstream: UpstreamClient) -> None:
    """0.5 s of prefill, then 20 tokens 2 ms apart: one sample, a few ms a token (about
    27 ms a token with the prefill counted)."""
    count, avg = await _speed_after(upstream, 20, prefill_s=0.5)
    assert count == 1
    assert 0 < avg < 0.5 / 20 / 2, avg


@pytest.mark.parametrize(("tokens", "choices"), [(MIN_DECODE_TOKENS, 1), (20, 3)])
async def test_short_answers_and_several_choices_are_no_sample(
    upstream: UpstreamClient, tokens: int, choices: int
) -> None:
    """Fewer than MIN_DECODE_TOKENS after the first, or several choices interleaved: no
    sample."""
    count, _avg = await _speed_after(upstream, tokens, choices)
    assert count == 0
