"""One timed request against a small real HTTP server that answers the ways servers do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from loadgen.cli import main
from loadgen.client import RequestResult, RequestSpec, build_body, send
from loadgen.prompts import Prompt
from loadgen.spec import Target

SPEC = RequestSpec(chat=True, max_tokens=4, ignore_eos=True, timeout_s=5.0)


def _event(text: str) -> bytes:
    return b"data: " + text.encode() + b"\n\n"


def _token(content: str) -> bytes:
    return _event(json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}))


async def _stream(
    request: web.Request, events: list[bytes], gap: float = 0.02
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await asyncio.sleep(gap)
        await response.write(event)
    await response.write_eof()
    return response


def _streams() -> dict[str, list[bytes]]:
    role = _event('{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}')
    tokens = [_token(w) for w in ("a", " b", " c")]
    done = b"data: [DONE]\n\n"
    error = _event('{"error": {"message": "engine died", "type": "x", "code": 500}}')
    return {
        "no-usage": [role, *tokens, done],
        "error": [role, tokens[0], error],
        "cut": [role, *tokens],
        "garbage": [role, tokens[0], _event("{not json")],
        "huge": [role, _token("x" * 400_000), done],
        # A reasoning model on vLLM >= 0.10: thinking in ``reasoning``, then the answer.
        "thinking": [role, *[_delta({"reasoning": "t"}) for _ in range(3)], *tokens, done],
        # A tool call (vLLM's hermes parser): no content at all, ``finish_reason: tool_calls``.
        "tool-call": [role, *_call_pieces(), done],
    }


def _delta(delta: dict[str, object], finish: str | None = None) -> bytes:
    return _event(json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))


def _call_pieces() -> list[bytes]:
    first = {"index": 0, "id": "c", "type": "function", "function": {"name": "f"}}
    pieces = [
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
        for p in ('{"a"', ": 1}")
    ]
    return [_delta({"tool_calls": [first]}), *pieces, _delta({}, "tool_calls")]


STREAMS = _streams()


async def _handler(request: web.Request) -> web.StreamResponse:
    mode = request.headers.get("X-Mode", "")
    if mode in STREAMS:
        return await _stream(request, STREAMS[mode])
    if mode == "json":
        return web.json_response({"choices": [{"message": {"content": "not streamed"}}]})
    key = request.headers.get("Authorization", "").removeprefix("Bearer ")
    return web.json_response(
        {
            "error": {
                "message": f"bad key {key}",
                "type": "auth",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        status=401,
    )


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A local HTTP server whose reply depends on the X-Mode header."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _send(url: str, mode: str) -> RequestResult:
    target = Target("t", url, "m")
    body = build_body(target, SPEC, Prompt(text="hi"))
    async with aiohttp.ClientSession(headers={"X-Mode": mode}) as session:
        return await send(session, target, SPEC, body, origin=0.0)


async def test_stream_without_usage_counts_chunks(server: str) -> None:
    """No usage chunk: the output tokens are the text chunks, and the result says so."""
    result = await _send(server, "no-usage")
    assert result.ok is True
    assert result.output_tokens == 3
    assert result.counted_from == "chunks"
    assert len(result.itl) == 2
    assert result.ttft >= 0.03  # the empty role chunk is not the first token


async def test_thinking_is_output_and_starts_the_first_token(server: str) -> None:
    """Thinking in newer vLLM's ``reasoning`` field (3 chunks) before 3 content chunks: the
    first token is the first thought, and all 6 are output tokens, as vLLM counts them."""
    result = await _send(server, "thinking")
    assert result.ok is True
    assert result.output_tokens == 6
    assert len(result.itl) == 5


async def test_a_tool_call_stream_is_a_success(server: str) -> None:
    """A streamed tool call (no ``content`` anywhere) carries tokens: a success of 3 chunks
    (name, two argument pieces), not "the stream carried no tokens"."""
    result = await _send(server, "tool-call")
    assert (result.ok, result.status, result.output_tokens) == (True, "200", 3)


async def test_a_huge_event_is_read_whole(server: str) -> None:
    """A 400 KB chunk (above aiohttp's line buffer) is one token, not a broken stream."""
    result = await _send(server, "huge")
    assert result.ok is True
    assert result.output_tokens == 1


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("error", "stream_error", "engine died"),
        ("cut", "stream_error", "without [DONE]"),
        ("garbage", "stream_error", "not JSON"),
        ("json", "not_a_stream", "answered application/json, not an event stream"),
    ],
)
async def test_broken_streams_are_failures(
    server: str, mode: str, status: str, message: str
) -> None:
    """An in-band error, a cut stream, a bad event or a reply that is no stream fail it."""
    result = await _send(server, mode)
    assert result.ok is False
    assert result.status == status
    assert message in result.error


async def test_a_key_echoed_by_the_server_is_never_printed(
    server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 401 whose message repeats the key is reported with the key masked; exit status 2."""
    monkeypatch.setenv("LG_TEST_KEY", "sk-echo-me-123")
    code = await asyncio.to_thread(
        main,
        [
            "--url",
            server,
            "--model",
            "m",
            "--api-key-env",
            "LG_TEST_KEY",
            "--num-requests",
            "1",
            "--concurrency",
            "1",
            "--warmup",
            "1",
        ],
    )
    out = capsys.readouterr()
    assert code == 2
    assert "HTTP 401: bad key ***" in out.err
    assert "sk-echo-me-123" not in out.out + out.err
