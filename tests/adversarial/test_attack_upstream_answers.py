"""Attacks on the gateway by what a backend answers: odd JSON, odd headers, odd framing.

A scripted raw server on loopback answers each attempt; the Forwarder and the StreamRelay of
the request path read it. Whatever the backend says, the caller gets an answer or an error in
the OpenAI shape, never a crash (a 500 from a stray exception) or a stream cut without a word.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import UPSTREAM_FAILURES, Outcome, Usage
from gateway.upstream.attempt import AttemptFailed, UpstreamClient, _upstream_message, answer_usage
from gateway.upstream.forwarding import Forwarded, Forwarder, TierRoute
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from gateway.upstream.sse import stream_error
from policies.errors import TierGateError
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, Respond, answer
from tests.gateway.relay_drive import DRIVES, drive

PATH = "/v1/chat/completions"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
DONE = b"data: [DONE]\n\n"
# The answer's final chunk: without it a [DONE] ends a cut answer, not a complete one.
FINAL = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DEEP = b"[" * 3000 + b"]" * 3000


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(*events: bytes) -> Respond:
    """A chunked SSE answer: one chunk per event, then the end."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD)
        for event in events:
            writer.write(_chunk(event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return respond


def _fixed(raw: bytes) -> Respond:
    """The same raw answer to every request."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return True

    return respond


def _forwarder(upstream: UpstreamClient, *urls: str, **timeouts: float) -> Forwarder:
    pool = ReplicaPool("fast", list(urls), 8, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(**timeouts), "m")
    return Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))


def _body(*, stream: bool, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}


async def _forward_once(upstream: UpstreamClient, respond: Respond, *, stream: bool) -> Forwarded:
    """One request forwarded to a backend answering with ``respond`` (its exchange finished);
    the backend is stopped either way."""
    server = await RawUpstream(respond).start()
    try:
        forwarded = await _forwarder(upstream, server.url).forward(
            PATH, _body(stream=stream), ["fast"]
        )
        forwarded.exchange.finish()
    finally:
        await server.stop()
    return forwarded


async def _relayed(
    upstream: UpstreamClient, respond: Respond, **timeouts: float
) -> tuple[bytes, str, Usage | None]:
    """The stream relayed both ways (iterated, and pumped from the connection's callback):
    the client gets the same bytes, the stream the same outcome and usage."""
    results = {how: await _relayed_once(how, upstream, respond, **timeouts) for how in DRIVES}
    assert results["pump"] == results["iterate"]
    return results["pump"]


async def _relayed_once(
    how: str, upstream: UpstreamClient, respond: Respond, **timeouts: float
) -> tuple[bytes, str, Usage | None]:
    """Stream through the gateway's forwarder and relay: what the client got, how it ended."""
    server = await RawUpstream(respond).start()
    closed: list[tuple[str, Usage | None]] = []
    sent = b""
    try:
        forwarded = await _forwarder(upstream, server.url, **timeouts).forward(
            PATH, _body(stream=True), ["fast"]
        )
        relay = StreamRelay(
            forwarded.exchange,
            strip_usage=False,
            idle_s=5.0,
            on_close=lambda outcome, usage: closed.append((outcome, usage)),
        )
        async with asyncio.timeout(10):
            sent = await drive(relay, how)
    finally:
        await server.stop()
    ((outcome, usage),) = closed
    return sent, outcome, usage


# -- JSON nested too deep (msgspec raises RecursionError near 1,000 levels) -------------------


def test_deep_json_is_undecodable_not_an_error() -> None:
    """Every decode of a backend's JSON treats nesting past msgspec's guard as undecodable."""
    with pytest.raises(AttemptFailed):  # a bad answer (not retried), never a 500
        answer_usage(b'{"usage":{"prompt_tokens":1},"x":' + DEEP + b"}")
    failure = stream_error(b'data: {"error":{"message":"x","code":503,"x":' + DEEP + b"}}")
    assert failure.status == 500
    assert _upstream_message(b'{"error":{"message":"busy","x":' + DEEP + b"}}", 503) == (
        "The backend answered 503.",
        None,
    )


async def test_a_deep_non_streaming_answer_is_a_bad_gateway(upstream: UpstreamClient) -> None:
    """A 200 answer with a field nested too deep is a failed attempt (502), not a 500."""
    raw = b'{"id":"x","choices":[],"usage":{"prompt_tokens":1},"x":' + DEEP + b"}"
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _fixed(answer(raw)), stream=False)
    assert caught.value.status == 502


async def test_a_deep_503_is_an_overload_not_a_crash(upstream: UpstreamClient) -> None:
    """A 503 whose error body is nested too deep is retried and ends as the usual 503."""
    raw = answer(b'{"error":{"message":"busy","x":' + DEEP + b"}}", status=503)
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _fixed(raw), stream=False)
    assert caught.value.status == 503


async def test_a_deep_first_stream_event_is_a_backend_error(upstream: UpstreamClient) -> None:
    """A first error event nested too deep fails the attempt like any backend error."""
    event = b'data: {"error":{"message":"x","code":503,"x":' + DEEP + b"}}\n\n"
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _sse(event, DONE), stream=True)
    assert caught.value.status >= 500


async def test_data_over_several_lines_with_other_fields_is_read_as_one_json_value(
    upstream: UpstreamClient,
) -> None:
    """A chunk over two ``data`` lines (one without the space) with an ``id`` line between:
    an SSE client joins the data lines, which make JSON, so it is relayed as sent and the
    stream completes."""
    split = (
        b'data: {"id":"c","choices":[{"index":0,\nid: 7\n'
        b'data:"delta":{"content":"y"},"finish_reason":null}]}\n\n'
    )
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, split, FINAL, DONE))
    assert outcome == Outcome.COMPLETE
    assert split in sent


async def test_nan_and_infinity_as_python_writes_them_pass_the_json_check(
    upstream: UpstreamClient,
) -> None:
    """A server on Python's ``json.dumps`` (llama-cpp-python) writes a logprob of minus
    infinity as ``-Infinity``: Python's json, the openai client's reader, reads it, so the
    stream completes; such a value in data that is still not JSON ends the stream."""
    logprob = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":'
        b'{"content":[{"token":"x","logprob":-Infinity,"bytes":null,"extra":NaN}]},'
        b'"finish_reason":null}]}\n\n'
    )
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, logprob, FINAL, DONE))
    assert outcome == Outcome.COMPLETE
    assert logprob in sent
    broken = b'data: {"id":"c","x":NaN,\n\n'
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, broken, FINAL, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert b'"x":NaN' not in sent


async def test_data_lines_that_do_not_join_into_json_end_the_stream(
    upstream: UpstreamClient,
) -> None:
    """Two ``data`` lines whose joined value is not JSON: not passed on, the stream ends with
    an error event."""
    broken = b'data:{"id":"c",\ndata: oops\n\n'
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, broken, FINAL, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert b"oops" not in sent
    assert not sent.endswith(DONE)


async def test_a_deep_usage_event_mid_stream_ends_the_stream_readably(
    upstream: UpstreamClient,
) -> None:
    """A usage event nested deeper than a client's JSON reader goes (Python's ``json`` stops
    near 1,000 levels, as the relay's check does) is not passed on: the stream ends with an
    error event, not a crash and not as complete."""
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1},"x":' + DEEP + b"}\n\n"
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, usage, FINAL, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert DEEP not in sent
    assert sent.endswith(b"\n\n")
    assert b'"error"' in sent.rsplit(b"data: ", 1)[1]


async def test_a_failure_inside_the_relay_ends_the_stream_with_an_error_event(
    upstream: UpstreamClient,
) -> None:
    """An unexpected error while relaying ends the stream in-band, as an internal error."""
    server = await RawUpstream(_sse(FIRST, TOKEN, FINAL, DONE)).start()
    closed: list[str] = []

    def broken(_event: bytes) -> None:
        raise RuntimeError("a bug")

    try:
        forwarded = await _forwarder(upstream, server.url).forward(
            PATH, _body(stream=True), ["fast"]
        )
        relay = StreamRelay(
            forwarded.exchange,
            strip_usage=False,
            idle_s=5.0,
            on_close=lambda outcome, _usage: closed.append(outcome),
            on_event=broken,
        )
        sent = b"".join([piece async for piece in relay])
    finally:
        await server.stop()
    assert closed == [Outcome.INTERNAL_ERROR]
    assert sent.startswith(b'data: {"error"')
    assert b"[DONE]" not in sent


# -- Retry-After ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"inf", b"1e400", b"-inf", b"nan", b"1e300", b"99999999"])
async def test_a_backends_retry_after_is_clamped(upstream: UpstreamClient, value: bytes) -> None:
    """Any Retry-After on a 429 ends as a 503 with a small whole Retry-After, and a bounded
    cool-down, never an overflow or the backend's raw value."""
    raw = answer(
        b'{"error":{"message":"slow down"}}', status=429, extra=b"Retry-After: %s\r\n" % value
    )
    server = await RawUpstream(_fixed(raw)).start()
    forwarder = _forwarder(upstream, server.url)
    try:
        with pytest.raises(TierGateError) as caught:
            await forwarder.forward(PATH, _body(stream=False), ["fast"])
    finally:
        await server.stop()
    assert caught.value.status == 503
    assert 1 <= int(caught.value.headers["Retry-After"]) <= forwarder.policy.max_cooldown_s
    replica = forwarder.routes["fast"].pool.replicas[0]
    assert replica.cooldown_until - time.monotonic() <= forwarder.policy.max_cooldown_s


# -- Large first events (the upstream connection pauses reading above 256 KiB) ----------------


def _big_first(size: int) -> Respond:
    """A stream whose first event is ``size`` bytes, sent in 64 KiB chunks."""
    event = b'data: {"id":"c","choices":[],"pad":"' + b"a" * size + b'"}\n\n'
    pieces = [event[i : i + 65536] for i in range(0, len(event), 65536)]
    return _sse(*pieces, TOKEN, FINAL, DONE)


@pytest.mark.parametrize("size", [600_000, 1_000_000])
async def test_a_large_first_event_within_the_limit_is_relayed(
    upstream: UpstreamClient, size: int
) -> None:
    """A first event between the high-water mark and 1 MiB arrives at once, not at a timeout."""
    started = time.monotonic()
    sent, outcome, _ = await _relayed(upstream, _big_first(size), first_byte_s=5.0)
    assert outcome == Outcome.COMPLETE
    assert len(sent) > size
    assert time.monotonic() - started < 3.0


async def test_a_first_event_above_the_limit_fails_fast(upstream: UpstreamClient) -> None:
    """A 3 MB first event is a 502 from the backend at once, not a first-byte timeout."""
    server = await RawUpstream(_big_first(3_000_000)).start()
    started = time.monotonic()
    try:
        with pytest.raises(TierGateError) as caught:
            await _forwarder(upstream, server.url, first_byte_s=5.0).forward(
                PATH, _body(stream=True), ["fast"]
            )
    finally:
        await server.stop()
    assert caught.value.status == 502
    assert "size limit" in caught.value.message
    assert time.monotonic() - started < 3.0


# -- SSE framing other than LF (sse-starlette's default separator is CRLF) --------------------


def _framed(line_end: bytes, *events: bytes) -> list[bytes]:
    return [event.replace(b"\n", line_end) for event in events]


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
async def test_a_stream_framed_with_cr_is_relayed_with_lf(
    upstream: UpstreamClient, line_end: bytes
) -> None:
    """CRLF and CR framed streams complete, their events passed on with LF line ends."""
    events = _framed(line_end, FIRST, TOKEN, TOKEN, FINAL, DONE)
    sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.COMPLETE
    assert sent.startswith(FIRST + TOKEN + TOKEN)
    assert sent.endswith(DONE)
    assert b"\r" not in sent
    assert usage is not None
    assert usage.completion_tokens == 2


async def test_a_crlf_stream_split_between_cr_and_lf_is_relayed(upstream: UpstreamClient) -> None:
    """A CRLF stream whose reads end between a \\r and its \\n keeps its events whole."""
    stream = b"".join(_framed(b"\r\n", FIRST, TOKEN, TOKEN, FINAL, DONE))
    first = stream[: len(FIRST) + 2]
    cut = len(first) + 2 * (len(TOKEN) + 2) - 1  # the second token's last "\r" | "\n"

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(first))
        for piece in (stream[len(first) : cut], stream[cut:]):
            writer.write(_chunk(piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        return True

    sent, outcome, usage = await _relayed(upstream, respond)
    assert outcome == Outcome.COMPLETE
    assert sent.startswith(FIRST + TOKEN + TOKEN)
    assert sent.endswith(DONE)
    assert usage is not None
    assert usage.completion_tokens == 2


async def test_a_crlf_first_error_event_is_read(upstream: UpstreamClient) -> None:
    """A CRLF framed first event that is the backend's error fails the attempt with its status."""
    error = b'data: {"error":{"message":"bad prompt","code":400}}\r\n\r\n'
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _sse(error, b"data: [DONE]\r\n\r\n"), stream=True)
    assert caught.value.status == 400
    assert caught.value.message == "bad prompt"


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_non_streamed_body_cut_short_is_an_error_never_a_200(
    upstream: UpstreamClient, framing: str
) -> None:
    """The backend closes the connection before the whole body (its Content-Length, or its
    chunked end) arrived: the attempt fails, whatever the bytes so far parse as."""
    body = b'{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}'
    if framing == "length":
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body) + 40, body)
    else:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        raw = head + b"%x\r\n%s\r\n" % (len(body), body)  # no last chunk

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return False  # then close

    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, respond, stream=False)
    assert caught.value.status >= 500


# -- Non-streaming answers that are not answers ----------------------------------------------

GOOD = b'{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}'


@pytest.mark.parametrize(
    "raw",
    [b"<html>502 Bad Gateway</html>", b"", b'{"id":"x","choices":[{"index":0', b"7"],
    ids=["html", "empty", "truncated", "number"],
)
async def test_a_200_that_is_not_json_is_a_bad_gateway_once(
    upstream: UpstreamClient, raw: bytes
) -> None:
    """A 502 `bad_upstream_answer` at once: not retried on the other replica (the answer would
    be generated again and fail the same way), and not counted against the replica's health
    (a second review saw such answers eject healthy replicas and cost six generations)."""
    bad = await RawUpstream(_fixed(answer(raw))).start()
    good = await RawUpstream(_fixed(answer(GOOD))).start()
    forwarder = _forwarder(upstream, bad.url, good.url)
    pool = forwarder.routes["fast"].pool
    try:
        outcomes: list[object] = []
        for _ in range(6):
            try:
                forwarded = await forwarder.forward(PATH, _body(stream=False), ["fast"])
            except TierGateError as exc:
                outcomes.append((exc.status, exc.code))
            else:
                outcomes.append(forwarded.exchange.opened.body)
                forwarded.exchange.finish()
    finally:
        await bad.stop()
        await good.stop()
    assert outcomes.count((502, "bad_upstream_answer")) == 3  # round robin: every other one
    assert outcomes.count(GOOD) == 3
    assert len(bad.requests) + len(good.requests) == 6  # one attempt each, never a retry
    assert all(r.consecutive_failures == 0 for r in pool.replicas)
    assert all(not r.ejected(time.monotonic()) for r in pool.replicas)


async def test_a_json_array_answer_is_passed_on(upstream: UpstreamClient) -> None:
    """llama.cpp answers a list of prompts on /v1/completions with a JSON array: an answer."""
    raw = b'[{"id":"a","choices":[]},{"id":"b","choices":[]}]'
    forwarded = await _forward_once(upstream, _fixed(answer(raw)), stream=False)
    assert forwarded.exchange.opened.body == raw
    assert forwarded.exchange.opened.usage is None


async def test_a_json_answer_after_a_bom_is_passed_on_without_it(
    upstream: UpstreamClient,
) -> None:
    """A UTF-8 byte order mark before the JSON is tolerated and dropped (msgspec refuses it)."""
    forwarded = await _forward_once(upstream, _fixed(answer(b"\xef\xbb\xbf" + GOOD)), stream=False)
    assert forwarded.exchange.opened.body == GOOD
    assert forwarded.exchange.opened.usage == {"prompt_tokens": 3}


async def test_a_non_streaming_answer_above_32_mib_is_a_bad_gateway(
    upstream: UpstreamClient,
) -> None:
    """A 40 MiB answer is refused once 32 MiB were read, not buffered whole."""
    raw = b'{"id":"x","pad":"' + b"a" * (40 << 20) + b'"}'
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _fixed(answer(raw)), stream=False)
    assert caught.value.status == 502
    assert "32 MiB" in caught.value.message


# -- timeouts.total_s bounds a stream too -------------------------------------------------------


async def test_a_stream_that_never_ends_is_cut_at_the_requests_deadline(
    upstream: UpstreamClient,
) -> None:
    """A token every 50 ms (never idle) forever: the stream ends at total_s with an error event."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD + _chunk(FIRST))
        try:
            for _ in range(400):  # 20 s, far past the deadline
                writer.write(_chunk(TOKEN))
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass
        return False

    for how in DRIVES:  # each way on its own: how many tokens beat the deadline is timing
        started = time.monotonic()
        sent, outcome, usage = await _relayed_once(how, upstream, respond, total_s=1.0)
        took = time.monotonic() - started
        assert outcome == Outcome.DEADLINE  # the gateway's own limit: not the replica's failure
        assert outcome not in UPSTREAM_FAILURES  # so it never ejects a healthy replica
        assert b"time limit" in sent.splitlines()[-2]
        assert b"[DONE]" not in sent
        assert 0.9 < took < 3.0
        assert usage is not None
        assert usage.completion_tokens == sent.count(TOKEN), how  # what reached the client


# -- SSE dialects: `data:` without the space, `event:` lines, comments, bytes after [DONE] -------

USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'


async def test_data_without_a_space_is_read(upstream: UpstreamClient) -> None:
    """`data:{...}` events are counted, their usage read, [DONE] seen; the caller gets `data: `."""
    events = [e.replace(b"data: ", b"data:") for e in (FIRST, TOKEN, TOKEN, FINAL, USAGE, DONE)]
    sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.COMPLETE
    assert sent == FIRST + TOKEN + TOKEN + FINAL + USAGE + DONE
    assert usage == Usage(prompt_tokens=7, completion_tokens=2)


@pytest.mark.parametrize("blank", [b"  ", b"\t", b" \t ", b":   "])
async def test_more_blank_before_the_data_is_read_as_the_usual_spelling(
    upstream: UpstreamClient, blank: bytes
) -> None:
    """`data:` followed by more blank than one space (JSON ignores it), in every event, [DONE]
    included, some events in one read: counted, usage read, complete; the caller gets the usual
    `data: ` spelling."""
    prefix = b"data" + (blank if blank.startswith(b":") else b":" + blank)
    events = [prefix + e[6:] for e in (FIRST, TOKEN, TOKEN, FINAL, USAGE, DONE)]
    sent, outcome, usage = await _relayed(
        upstream, _sse(events[0], b"".join(events[1:4]), *events[4:])
    )
    assert outcome == Outcome.COMPLETE
    assert sent == FIRST + TOKEN + TOKEN + FINAL + USAGE + DONE
    assert usage == Usage(prompt_tokens=7, completion_tokens=2)


async def test_an_error_event_with_more_blank_ends_the_stream(upstream: UpstreamClient) -> None:
    """`data:  {"error": ...}` mid-stream is the backend's error, in OpenAI's shape."""
    error = b'data:  {"error":{"message":"boom","code":500}}\n\n'
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, error, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert sent.endswith(b'data: {"error":{"message":"boom","code":500}}\n\n')


async def test_named_events_and_comments_are_read(upstream: UpstreamClient) -> None:
    """`event: message` lines, `id:` lines and keep-alive comments do not hide the data; a
    comment before the first event is dropped (the first event is the answer's start), one
    after it is relayed."""
    named = [b"event: message\nid: 1\n" + e for e in (FIRST, TOKEN, USAGE)]
    ping = b": ping\n\n"
    sent, outcome, usage = await _relayed(
        upstream, _sse(ping, named[0], ping, *named[1:], FINAL, DONE)
    )
    assert outcome == Outcome.COMPLETE
    assert sent == FIRST + ping + TOKEN + USAGE + FINAL + DONE
    assert usage == Usage(prompt_tokens=7, completion_tokens=2)


async def test_an_error_named_event_mid_stream_ends_the_stream(upstream: UpstreamClient) -> None:
    """`event: error` with the backend's error ends the stream as an upstream error."""
    error = b'event: error\ndata: {"error":{"message":"boom","code":500}}\n\n'
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, error, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert sent.endswith(b'data: {"error":{"message":"boom","code":500}}\n\n')


async def test_a_first_error_event_without_the_space_is_read(upstream: UpstreamClient) -> None:
    """`data:{"error": ...}` as the first event fails the attempt with the error's status."""
    error = b'data:{"error":{"message":"bad prompt","code":400}}\n\n'
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _sse(error, DONE), stream=True)
    assert caught.value.status == 400


async def test_nothing_after_done_is_relayed(upstream: UpstreamClient) -> None:
    """Events a backend sends after [DONE], in the same read, never reach the caller."""
    after = TOKEN.replace(b'"x"', b'"AFTER"')
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN + FINAL + USAGE + DONE + after))
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)
    assert b"AFTER" not in sent


@pytest.mark.parametrize(
    ("content_type", "raw"),
    [
        (b"text/html", b"<html>\n<head><title>502 Bad Gateway</title></head>\n\n<body></body>"),
        (b"application/json", GOOD),
        (b"text/event-stream", b""),
    ],
    ids=["html", "json-answer", "empty"],
)
async def test_a_stream_answer_that_is_not_sse_is_a_bad_gateway(
    upstream: UpstreamClient, content_type: bytes, raw: bytes
) -> None:
    """A stream request answered 200 with no events fails the attempt (502), never a 200."""
    head = b"Content-Type: " + content_type + b"\r\n"
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _fixed(answer(raw, extra=head)), stream=True)
    assert caught.value.status == 502


# -- Second review: llama.cpp's `error:` field, blank and field-only events, a BOM ------------

LLAMA_ERROR = b'error: {"code":500,"message":"slot died","type":"server_error"}\n\n'


async def test_a_llama_cpp_error_field_mid_stream_ends_the_stream(
    upstream: UpstreamClient,
) -> None:
    """llama.cpp writes errors as `error: {...}` then `data: [DONE]`: the caller gets the
    relay's error event and no [DONE] (it used to look complete, the text cut short)."""
    sent, outcome, _ = await _relayed(upstream, _sse(FIRST, TOKEN, LLAMA_ERROR, DONE))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert sent.endswith(
        b'data: {"error": {"code":500,"message":"slot died","type":"server_error"}}\n\n'
    )
    assert b"[DONE]" not in sent


async def test_a_llama_cpp_error_field_first_is_the_backends_error(
    upstream: UpstreamClient,
) -> None:
    """As the first event it is the backend's error with its status (a 400 is passed on, not
    taken for a stream that is not server-sent events)."""
    error = b'error: {"code":400,"message":"context too long","type":"invalid_request_error"}\n\n'
    with pytest.raises(TierGateError) as caught:
        await _forward_once(upstream, _sse(error, DONE), stream=True)
    assert caught.value.status == 400
    assert caught.value.message == "context too long"


async def test_a_blank_first_event_and_field_only_events_are_harmless(
    upstream: UpstreamClient,
) -> None:
    """A stream that opens with a blank event, with `retry:`/`event: ping` events in it: served
    whole; the field-only events reach the caller empty (an SDK would read JSON from them)."""
    ping = b"event: ping\n\n"
    sent, outcome, usage = await _relayed(
        upstream, _sse(b"\n\n", FIRST, b"retry: 3000\n\n", TOKEN, ping, USAGE, FINAL, DONE)
    )
    assert outcome == Outcome.COMPLETE
    assert b"retry:" not in sent
    assert b"ping" not in sent
    events = [e for e in sent.split(b"\n\n") if e.strip()]
    assert events == [e.strip() for e in (FIRST, TOKEN, USAGE, FINAL, DONE)]
    assert usage == Usage(prompt_tokens=7, completion_tokens=2)


async def test_a_stream_that_opens_with_a_bom_is_read(upstream: UpstreamClient) -> None:
    """The SSE spec strips a leading UTF-8 byte order mark."""
    stream = _sse(b"\xef\xbb\xbf" + FIRST, TOKEN, USAGE, FINAL, DONE)
    sent, outcome, _ = await _relayed(upstream, stream)
    assert outcome == Outcome.COMPLETE
    assert sent == FIRST + TOKEN + USAGE + FINAL + DONE
