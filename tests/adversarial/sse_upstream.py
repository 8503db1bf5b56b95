"""A misbehaving OpenAI-style backend as a real process, one scripted answer per scenario.

``python -m tests.adversarial.sse_upstream --port N`` answers every ``GET`` with 200 (a model
list on ``/v1/models``) and each ``POST`` with the scenario named by the request's last message
(its ``content``, a key of :data:`SCENARIOS`). Answers are written on the raw socket, so the
framing, the chunking and how the connection ends are exactly the scenario's.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable

from tests.gateway.raw_upstream import read_request, reset

Writer = asyncio.StreamWriter

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
# A body that ends when the connection closes (no length, not chunked).
SSE_HEAD_UNTIL_CLOSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
)
_CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
ROLE = _CHUNK + b'"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
USAGE = (
    _CHUNK + b'"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
)
DONE = b"data: [DONE]\n\n"
ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}'
)


def token(text: str = "x") -> bytes:
    """A content chunk carrying ``text``."""
    choice = b'"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
    return _CHUNK + choice % text.encode()


def final(reason: bytes = b"stop") -> bytes:
    """A final chunk."""
    return _CHUNK + b'"choices":[{"index":0,"delta":{},"finish_reason":"%s"}]}\n\n' % reason


WHOLE = ROLE + token("a") + token("b") + token("c") + final() + USAGE + DONE


def _json_head(length: int, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n" % (
        extra,
        length,
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _events(writer: Writer, *events: bytes, end: bool = True) -> None:
    """A chunked SSE answer, one chunk per event, each flushed; then its end (``end``)."""
    writer.write(SSE_HEAD)
    for event in events:
        writer.write(_chunk(event))
        await writer.drain()
        await asyncio.sleep(0.001)
    if end:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _bytewise(writer: Writer, body: bytes) -> None:
    """A chunked SSE answer of one byte per chunk, each flushed."""
    writer.write(SSE_HEAD)
    for index in range(len(body)):
        writer.write(_chunk(body[index : index + 1]))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


# -- streams that are whole ---------------------------------------------------------------------


async def lf_bytewise(writer: Writer) -> None:
    """The whole answer, one byte per chunk."""
    await _bytewise(writer, WHOLE)


async def crlf_bytewise(writer: Writer) -> None:
    """The whole answer framed with CRLF, one byte per chunk."""
    await _bytewise(writer, WHOLE.replace(b"\n", b"\r\n"))


async def bom_lone_cr(writer: Writer) -> None:
    """A byte order mark, then the whole answer framed with lone CRs, in one chunk."""
    await _events(writer, b"\xef\xbb\xbf" + WHOLE.replace(b"\n", b"\r"))


async def multiline(writer: Writer) -> None:
    """A content chunk and the final chunk each spread over two ``data`` lines."""
    content = (
        _CHUNK + b'\ndata: "choices":[{"index":0,"delta":{"content":"y"},"finish_reason":null}]}'
    )
    last = _CHUNK + b'"choices":[{"index":0,"delta":{},\ndata: "finish_reason":"stop"}]}'
    await _events(writer, ROLE, content + b"\n\n", last + b"\n\n", USAGE, DONE)


async def fields(writer: Writer) -> None:
    """``retry:``, ``id:`` and ``event:`` fields, comments and empty ``data:`` lines."""
    await _events(
        writer,
        b"retry: 3000\n\n",
        b"id: 1\nevent: message\n" + ROLE,
        b": keep\n\n",
        b"data:\n\n",
        b"id: 2\n" + token(),
        b"data:\n\n",
        b"event: message\n" + final(),
        USAGE,
        DONE,
    )


async def huge(writer: Writer) -> None:
    """One content chunk of 1,000,000 characters."""
    await _events(writer, ROLE, token("z" * 1_000_000), final(), USAGE, DONE)


async def until_close(writer: Writer) -> None:
    """The whole answer in one write, its body ended by closing the connection."""
    writer.write(SSE_HEAD_UNTIL_CLOSE + WHOLE)
    await writer.drain()
    writer.close()


# -- streams that fail ------------------------------------------------------------------------


async def until_close_cut(writer: Writer) -> None:
    """A body ended by closing the connection (cleanly), closed before any final chunk."""
    writer.write(SSE_HEAD_UNTIL_CLOSE + ROLE + token())
    await writer.drain()
    writer.close()


async def error_after_finish(writer: Writer) -> None:
    """A final chunk, then an in-band error event, then the end (no [DONE])."""
    await _events(writer, ROLE, token(), final(), b'data: {"error":{"message":"boom"}}\n\n')


async def comment_then_error(writer: Writer) -> None:
    """A keep-alive comment, then a 503 error event as the first event, then [DONE]."""
    error = b'data: {"error":{"message":"overloaded","type":"ServiceUnavailable","code":503}}\n\n'
    await _events(writer, b": ping\n\n", error, DONE)


async def ping_then_stall(writer: Writer) -> None:
    """A keep-alive comment, then nothing, for an hour."""
    await _events(writer, b": ping\n\n", end=False)
    await asyncio.sleep(3600)


async def garbage(writer: Writer) -> None:
    """One event that is not JSON in an answer otherwise whole."""
    await _events(writer, ROLE, token(), b"data: {not json\n\n", final(), USAGE, DONE)


async def bare_text(writer: Writer) -> None:
    """One event whose data is plain text, not JSON, in an answer otherwise whole."""
    await _events(writer, ROLE, token(), b"data: overloaded, try later\n\n", final(), USAGE, DONE)


async def flat_error_midstream(writer: Writer) -> None:
    """A token, then the flat error shape (SGLang, older vLLM), then ``[DONE]``."""
    error = b'data: {"object":"error","message":"KV cache full","type":"ServerError","code":503}'
    await _events(writer, ROLE, token(), error + b"\n\n", DONE)


async def spaced_error_midstream(writer: Writer) -> None:
    """A token, then ``{ "error": ... }`` written with a space, then ``[DONE]``."""
    error = b'data: { "error": { "message": "engine died", "code": 500 } }'
    await _events(writer, ROLE, token(), error + b"\n\n", DONE)


async def spaced_data(writer: Writer) -> None:
    """Every chunk written ``data:  {`` (two spaces): the data has a leading space, which JSON
    allows, so an SSE client reads the same chunks."""
    events = (ROLE, token("a"), token("b"), final(), USAGE)
    await _events(writer, *(b"data:  " + event[6:] for event in events), DONE)


async def huge_number_error_midstream(writer: Writer) -> None:
    """A token, then an error event carrying a number too large for a double (``1e400``, which
    Python's json reads as infinity), then ``[DONE]``."""
    error = b'data: {"error":{"message":"engine overflow","code":500,"at":1e400}}'
    await _events(writer, ROLE, token(), error + b"\n\n", DONE)


async def flat_error_first(writer: Writer) -> None:
    """The flat error shape as the stream's first event (code 400), then ``[DONE]``."""
    error = b'data: {"object":"error","message":"prompt too long","type":"BadRequestError",'
    await _events(writer, error + b'"code":400}\n\n', DONE)


async def the_word_error(writer: Writer) -> None:
    """A whole answer whose one token is the word ``"error"`` (a chunk, not an error)."""
    await _events(writer, ROLE, token("error"), final(), USAGE, DONE)


async def bad_utf8_token(writer: Writer) -> None:
    """A whole answer but for one token whose text holds a byte that is not UTF-8 (0xff)."""
    await _events(writer, ROLE, token("a"), token("b?").replace(b"b?", b"b\xff"), final(),
                  USAGE, DONE)  # fmt: skip


async def bad_utf8_error_after_finish(writer: Writer) -> None:
    """A final chunk, then an in-band error event holding a byte that is not UTF-8, then the
    end (no [DONE])."""
    error = b'data: {"error":{"message":"boom \xff","code":500}}\n\n'
    await _events(writer, ROLE, token(), final(), error)


async def pings_forever(writer: Writer) -> None:
    """One token, then only keep-alive comments (every 0.1 s) for an hour."""
    await _events(writer, ROLE, token(), end=False)
    for _ in range(36_000):
        writer.write(_chunk(b": keep-alive\n\n"))
        await writer.drain()
        await asyncio.sleep(0.1)


# -- non-streaming answers --------------------------------------------------------------------


async def ok_with_error(writer: Writer) -> None:
    """A 200 whose body is an error object (code 500)."""
    body = b'{"error":{"message":"model crashed","type":"InternalServerError","code":500}}'
    writer.write(_json_head(len(body)) + body)
    await writer.drain()


async def ok_with_flat_400(writer: Writer) -> None:
    """A 200 whose body is the flat error shape (older vLLM, SGLang) with code 400."""
    body = b'{"object":"error","message":"bad prompt","type":"BadRequestError","code":400}'
    writer.write(_json_head(len(body)) + body)
    await writer.drain()


async def gzipped(writer: Writer) -> None:
    """A gzip-encoded answer the gateway never asked for."""
    body = gzip.compress(ANSWER)
    writer.write(_json_head(len(body), b"Content-Encoding: gzip\r\n") + body)
    await writer.drain()


async def reset_after_json(writer: Writer) -> None:
    """A body ended by closing the connection: the JSON whole, then a TCP reset."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + ANSWER)
    await writer.drain()
    await asyncio.sleep(0.05)
    reset(writer)


Scenario = Callable[[Writer], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {
    each.__name__: each
    for each in (
        lf_bytewise,
        crlf_bytewise,
        bom_lone_cr,
        multiline,
        fields,
        huge,
        until_close,
        until_close_cut,
        error_after_finish,
        comment_then_error,
        ping_then_stall,
        garbage,
        bare_text,
        flat_error_midstream,
        spaced_error_midstream,
        spaced_data,
        huge_number_error_midstream,
        flat_error_first,
        the_word_error,
        bad_utf8_token,
        bad_utf8_error_after_finish,
        pings_forever,
        ok_with_error,
        ok_with_flat_400,
        gzipped,
        reset_after_json,
    )
}
_MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


async def _handle(reader: asyncio.StreamReader, writer: Writer) -> None:
    try:
        while True:
            head, body = await read_request(reader)
            if head.startswith(b"GET"):
                answer = _MODELS if head.split(b" ", 2)[1] == b"/v1/models" else b""
                writer.write(_json_head(len(answer)) + answer)
                await writer.drain()
                continue
            await SCENARIOS[json.loads(body)["messages"][-1]["content"]](writer)
            return
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(_serve(parser.parse_args().port))
