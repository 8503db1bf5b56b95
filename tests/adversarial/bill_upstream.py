"""A backend that reports ``usage`` in unusual ways, as a real process, for the billing attacks.

``python -m tests.adversarial.bill_upstream --port N`` answers ``GET /v1/models`` with a model
list, ``GET /last`` with the JSON body of the latest ``POST`` it was sent (what the gateway
forwarded), any other ``GET`` with 200, and each ``POST`` with the scenario its prompt names
(a chat request's last message, or a completion's ``prompt``, first item of a list): a key
of :data:`SCENARIOS`, or of :data:`BY_MODEL`, whose scenario also depends on the model the
gateway forwarded (``m`` on one tier, ``m2`` on the other: a shadow can fail where the caller's
answer did not). Every answer reports (or fails to report) :data:`PROMPT` prompt tokens
and a known number of completion tokens, so a test can compare what was served with what the
gateway charged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from tests.gateway.raw_upstream import read_request

Writer = asyncio.StreamWriter
PROMPT = 20  # prompt tokens every scenario's backend says it read
ANSWER_TOKENS = 10  # completion tokens of a whole (non-streamed) answer
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"


def _json(writer: Writer, body: bytes) -> None:
    head = _HEAD % b"application/json" + b"Content-Length: %d\r\n\r\n" % len(body)
    writer.write(head + body)


def _usage(completion: int, **extra: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT,
        "completion_tokens": completion,
        "total_tokens": PROMPT + completion,
        **extra,
    }


def _answer(usage: Any = ..., *, choices: int = 1) -> bytes:
    """A whole chat answer of :data:`ANSWER_TOKENS` tokens per choice; ``usage`` as given
    (``...``: the true one)."""
    answer: dict[str, Any] = {
        "id": "b",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": "word " * ANSWER_TOKENS},
                "finish_reason": "length",
            }
            for i in range(choices)
        ],
    }
    answer["usage"] = _usage(ANSWER_TOKENS * choices) if usage is ... else usage
    return json.dumps(answer).encode()


def _chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    data = {"id": "b", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + json.dumps({**data, "choices": choices, **extra}).encode() + b"\n\n"


def _delta(text: str, index: int = 0, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": {"content": text}, "finish_reason": finish}


ROLE = _chunk([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
DONE = b"data: [DONE]\n\n"


async def _events(writer: Writer, *events: bytes, end: bool = True) -> None:
    """A chunked SSE answer, one flushed chunk per event; then its end (``end``) or a close
    of the connection without the last chunk (a body cut short)."""
    writer.write(_HEAD % b"text/event-stream" + b"Transfer-Encoding: chunked\r\n\r\n")
    for event in events:
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.001)
    if end:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def whole(writer: Writer) -> None:
    """A whole answer that reports its usage: 20 prompt and 10 completion tokens."""
    _json(writer, _answer())


async def whole_usage_null(writer: Writer) -> None:
    """A whole answer of 10 tokens with ``"usage": null``."""
    _json(writer, _answer(None))


async def whole_no_prompt_count(writer: Writer) -> None:
    """A whole answer whose usage names the total and the completion but not the prompt."""
    _json(writer, _answer({"completion_tokens": ANSWER_TOKENS, "total_tokens": 30}))


async def whole_claims_no_completion(writer: Writer) -> None:
    """A whole answer of 10 tokens ("word " ten times) whose usage says
    ``"completion_tokens": 0``."""
    _json(writer, _answer(_usage(0)))


async def whole_slow(writer: Writer) -> None:
    """A whole answer written after 3 s (the caller has given up by then)."""
    await asyncio.sleep(3)
    _json(writer, _answer())


async def stream_slow_start(writer: Writer) -> None:
    """A stream whose head comes after 3 s (the caller has given up by then)."""
    await asyncio.sleep(3)
    await _events(writer, ROLE, _chunk([_delta("a", 0, "stop")]), DONE)


async def stream_cumulative(writer: Writer) -> None:
    """4 tokens, each chunk with the usage so far (vLLM's ``continuous_usage_stats``), then
    the usage chunk: 20 + 4 tokens in all, reported five times."""
    tokens = [_chunk([_delta("t")], usage=_usage(k)) for k in range(1, 4)]
    last = _chunk([_delta("t", 0, "length")], usage=_usage(4))
    await _events(writer, ROLE, *tokens, last, _chunk([], usage=_usage(4)), DONE)


async def stream_usage_on_final_choice(writer: Writer) -> None:
    """3 tokens; the usage rides on the final chunk (beside its ``finish_reason``), as some
    servers send it, and no ``choices: []`` chunk follows."""
    tokens = [_chunk([_delta("t")]) for _ in range(2)]
    last = _chunk([_delta("t", 0, "length")], usage=_usage(3))
    await _events(writer, ROLE, *tokens, last, DONE)


async def stream_two_choices_cut(writer: Writer) -> None:
    """Two choices (``n: 2``) of 6 tokens each, interleaved, then the body ends: no final chunk,
    no usage."""
    tokens = [_chunk([_delta("t", index)]) for _ in range(6) for index in (0, 1)]
    await _events(writer, ROLE, *tokens)


async def stream_role_on_every_chunk_cut(writer: Writer) -> None:
    """6 tokens, each chunk's delta naming the role too (Ollama's chunks do), then the body
    ends: no final chunk, no usage."""
    chunk = {"index": 0, "delta": {"role": "assistant", "content": "t"}, "finish_reason": None}
    await _events(writer, *[_chunk([chunk]) for _ in range(6)])


async def stream_claims_no_completion(writer: Writer) -> None:
    """5 tokens and a final chunk, then a usage chunk claiming ``"completion_tokens": "many"``
    (a count that is no number: read as 0)."""
    usage = {"prompt_tokens": PROMPT, "completion_tokens": "many", "total_tokens": PROMPT}
    tokens = [_chunk([_delta("t")]) for _ in range(4)]
    last = _chunk([_delta("t", 0, "length")])
    await _events(writer, ROLE, *tokens, last, _chunk([], usage=usage), DONE)


def _split(event: bytes) -> bytes:
    """``event``'s data over two ``data`` lines, the first empty (the SSE spec joins them with
    a line feed: the same JSON)."""
    return b"data:\n" + event


async def stream_split_lines_cut(writer: Writer) -> None:
    """5 tokens, each chunk's data over two ``data`` lines, then the body ends: no final
    chunk, no usage."""
    await _events(writer, ROLE, *[_split(_chunk([_delta("t")])) for _ in range(5)], end=False)


async def stream_split_usage(writer: Writer) -> None:
    """2 tokens and a final chunk, then the usage chunk (20 + 7) over two ``data`` lines."""
    tokens = [_chunk([_delta("t")]) for _ in range(2)]
    last = _chunk([_delta("", 0, "stop")])
    await _events(writer, ROLE, *tokens, last, _split(_chunk([], usage=_usage(7))), DONE)


async def error_500(writer: Writer) -> None:
    """An HTTP 500 error answer, no usage."""
    body = b'{"error": {"message": "boom", "type": "server_error", "code": 500}}'
    writer.write(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


# Reasoning models and tool calls (vLLM with ``--reasoning-parser`` and
# ``--enable-auto-tool-choice --tool-call-parser hermes``): the shapes they answer in.
THOUGHT = "think " * 20  # 120 characters: 30 tokens by the gateway's rough count
CALL = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}


def _message(content: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def _whole(message: dict[str, Any], finish: str, usage: Any) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish}
    answer = {"id": "b", "object": "chat.completion", "created": 1, "model": "m"}
    return json.dumps({**answer, "choices": [choice], "usage": usage}).encode()


def _tool_calls(*calls: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"id": f"chatcmpl-tool-{i}", "type": "function", "function": dict(call)}
        for i, call in enumerate(calls)
    ]


async def whole_reasoning_zero(writer: Writer) -> None:
    """Thinking (``reasoning_content``, older vLLM) of 30 rough tokens and the answer "Yes."
    (1), reported as ``"completion_tokens": 0``."""
    _json(writer, _whole(_message("Yes.", reasoning_content=THOUGHT), "stop", _usage(0)))


async def whole_reasoning_new_zero(writer: Writer) -> None:
    """As :func:`whole_reasoning_zero`, in newer vLLM's field, ``reasoning``."""
    _json(writer, _whole(_message("Yes.", reasoning=THOUGHT), "stop", _usage(0)))


async def whole_tool_call_zero(writer: Writer) -> None:
    """A tool call (``content: null``) of 3 + 9 rough tokens (name, arguments), reported as
    ``"completion_tokens": 0``."""
    message = _message(None, tool_calls=_tool_calls(CALL))
    _json(writer, _whole(message, "tool_calls", _usage(0)))


async def whole_tool_call(writer: Writer) -> None:
    """A tool call (``content: null``), its usage reported: 20 + 12 tokens."""
    _json(writer, _whole(_message(None, tool_calls=_tool_calls(CALL)), "tool_calls", _usage(12)))


def _reasoning(text: str, field: str = "reasoning_content", **delta: Any) -> dict[str, Any]:
    return {"index": 0, "delta": {**delta, field: text}, "finish_reason": None}


def _call_chunk(call: dict[str, Any]) -> bytes:
    delta = {"tool_calls": [{"index": 0, **call}]}
    return _chunk([{"index": 0, "delta": delta, "finish_reason": None}])


def _call_deltas() -> list[bytes]:
    """A streamed tool call as vLLM's hermes parser sends it: the id, type and name first,
    then the arguments in 5 pieces (``content`` never set)."""
    first = {"id": "chatcmpl-tool-0", "type": "function", "function": {"name": "get_weather"}}
    pieces = ['{"city": ', '"Paris"', ', "unit": ', '"celsius"', "}"]
    return [_call_chunk(first)] + [_call_chunk({"function": {"arguments": p}}) for p in pieces]


async def stream_reasoning_cut(writer: Writer) -> None:
    """6 thinking chunks (``reasoning_content`` only), then the body ends: no answer yet, no
    final chunk, no usage."""
    await _events(writer, ROLE, *[_chunk([_reasoning("t")]) for _ in range(6)], end=False)


async def stream_reasoning_role_on_every_chunk_cut(writer: Writer) -> None:
    """6 thinking chunks whose delta also names the role and an empty ``content`` (Ollama's
    ``reasoning`` chunks), then the body ends."""
    chunk = _chunk([_reasoning("t", "reasoning", role="assistant", content="")])
    chunks = [chunk] * 6
    await _events(writer, *chunks, end=False)


async def stream_reasoning_no_finish_key_cut(writer: Writer) -> None:
    """6 thinking chunks (newer vLLM's ``reasoning``) without a ``finish_reason`` key (as
    LiteLLM's chunks), then the body ends."""
    chunk = {"index": 0, "delta": {"reasoning": "t"}}
    await _events(writer, ROLE, *[_chunk([chunk]) for _ in range(6)], end=False)


async def stream_tool_call_cut(writer: Writer) -> None:
    """A tool call streamed in 6 chunks (name, 5 argument pieces), then the body ends."""
    await _events(writer, ROLE, *_call_deltas(), end=False)


# A tool call's arguments in one chunk, as tool parsers that buffer the whole JSON send them
# (some of vLLM's; llama.cpp): 2,048 characters, 512 tokens by the gateway's rough count.
BIG_ARGUMENTS = json.dumps({"text": ("word " * 408)[:2036]})


async def stream_tool_call_big_arguments_cut(writer: Writer) -> None:
    """A tool call streamed in 2 chunks (the name, then all 2,048 characters of its
    arguments at once), then the body ends: no final chunk, no usage."""
    first = {"id": "chatcmpl-tool-0", "type": "function", "function": {"name": "get_weather"}}
    arguments = _call_chunk({"function": {"arguments": BIG_ARGUMENTS}})
    await _events(writer, ROLE, _call_chunk(first), arguments, end=False)


async def stream_cumulative_content(writer: Writer) -> None:
    """10 chunks of 10 words each, every chunk's ``content`` the whole text so far (as some
    servers send it), a final chunk and the usage chunk (20 + 100: what was generated)."""
    words = [_chunk([_delta("word " * 10 * i)]) for i in range(1, 11)]
    last = _chunk([_delta("", 0, "stop")])
    await _events(writer, ROLE, *words, last, _usage_chunk(100), DONE)


def _usage_chunk(completion: int, reasoning: int = 0) -> bytes:
    details = {"reasoning_tokens": reasoning}
    return _chunk([], usage=_usage(completion, completion_tokens_details=details))


async def stream_tool_call(writer: Writer) -> None:
    """A whole streamed tool call: 6 chunks, the final chunk ``finish_reason: "tool_calls"``
    with an empty delta, the usage chunk (20 + 12), ``[DONE]``."""
    last = _chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
    await _events(writer, ROLE, *_call_deltas(), last, _usage_chunk(12), DONE)


async def stream_tool_call_no_done(writer: Writer) -> None:
    """As :func:`stream_tool_call` with the final chunk ``finish_reason: "tool_calls"`` and
    then the clean end of the body: no usage, no ``[DONE]``."""
    last = _chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
    await _events(writer, ROLE, *_call_deltas(), last)


async def stream_reasoning_answer(writer: Writer) -> None:
    """4 thinking chunks, then the answer in 2 (the last ``finish_reason: "stop"``), the usage
    chunk (20 + 6, 4 of them ``reasoning_tokens``), ``[DONE]``."""
    thinking = [_chunk([_reasoning("t")]) for _ in range(4)]
    answer = [_chunk([_delta("Yes")]), _chunk([_delta(".", 0, "stop")])]
    await _events(writer, ROLE, *thinking, *answer, _usage_chunk(6, 4), DONE)


async def stream_reasoning_usage_no_final(writer: Writer) -> None:
    """4 thinking chunks, then a usage chunk and ``[DONE]`` with no chunk ever naming a
    ``finish_reason``: the answer was never finished."""
    thinking = [_chunk([_reasoning("t")]) for _ in range(4)]
    await _events(writer, ROLE, *thinking, _usage_chunk(4, 4), DONE)


async def stream_thinking_slowly(writer: Writer) -> None:
    """Thinking chunks every 20 ms for up to 10 s (a client leaves in the middle)."""
    writer.write(_HEAD % b"text/event-stream" + b"Transfer-Encoding: chunked\r\n\r\n")
    for event in (ROLE, *[_chunk([_reasoning("t")]) for _ in range(500)]):
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.02)


async def stream_thinking_then_answer(writer: Writer) -> None:
    """10 thinking chunks 0.15 s apart, then the answer "Yes." (final chunk), the usage chunk
    (20 + 11) and ``[DONE]``: the first word of the answer comes 1.5 s after the first
    thought."""
    writer.write(_HEAD % b"text/event-stream" + b"Transfer-Encoding: chunked\r\n\r\n")
    answer = [_chunk([_delta("Yes.", 0, "stop")]), _usage_chunk(11, 10), DONE]
    for i, event in enumerate((ROLE, *[_chunk([_reasoning("t")]) for _ in range(10)], *answer)):
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        if 1 <= i <= 10:
            await asyncio.sleep(0.15)
    writer.write(b"0\r\n\r\n")


async def whole_thought_only(writer: Writer) -> None:
    """Thinking ran out of ``max_tokens``: ``content: null``, no tool call."""
    _json(writer, _whole(_message(None, reasoning_content=THOUGHT), "length", _usage(30)))


async def whole_empty_after_thought(writer: Writer) -> None:
    """Thinking ran out of ``max_tokens``, the answer sent as ``content: ""``."""
    _json(writer, _whole(_message("", reasoning_content=THOUGHT), "length", _usage(30)))


async def whole_other_call(writer: Writer) -> None:
    """A tool call of another function with other arguments."""
    call = {"name": "get_time", "arguments": '{"zone": "Asia/Tokyo"}'}
    _json(writer, _whole(_message(None, tool_calls=_tool_calls(call)), "tool_calls", _usage(9)))


def _judged(body: dict[str, Any]) -> bytes:
    """The judge's answer from a reasoning model: ``SCORE: 4`` when told not to think
    (``chat_template_kwargs.enable_thinking: false``); else it thinks through its few tokens
    and says nothing (``content: null``, ``finish_reason: "length"``)."""
    kwargs = body.get("chat_template_kwargs") or {}
    if kwargs.get("enable_thinking") is False:
        return _whole(_message("SCORE: 4"), "stop", _usage(3))
    cap = body["max_tokens"]
    return _whole(_message(None, reasoning_content="hmm " * cap), "length", _usage(cap))


Scenario = Callable[[Writer], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {
    each.__name__: each
    for each in (
        whole,
        whole_claims_no_completion,
        whole_usage_null,
        whole_no_prompt_count,
        whole_slow,
        stream_slow_start,
        stream_cumulative,
        stream_usage_on_final_choice,
        stream_two_choices_cut,
        stream_role_on_every_chunk_cut,
        stream_claims_no_completion,
        stream_split_lines_cut,
        stream_split_usage,
        whole_reasoning_zero,
        whole_reasoning_new_zero,
        whole_tool_call_zero,
        whole_tool_call,
        stream_reasoning_cut,
        stream_reasoning_role_on_every_chunk_cut,
        stream_reasoning_no_finish_key_cut,
        stream_tool_call_cut,
        stream_tool_call,
        stream_tool_call_no_done,
        stream_tool_call_big_arguments_cut,
        stream_cumulative_content,
        stream_reasoning_answer,
        stream_reasoning_usage_no_final,
        stream_thinking_slowly,
        stream_thinking_then_answer,
        whole_thought_only,
    )
}
# Scenarios by the forwarded model: ``m`` answers whole (20 + 10 tokens), ``m2`` as named.
BY_MODEL: dict[str, dict[str, Scenario]] = {
    "m2_fails": {"m": whole, "m2": error_500},
    "m2_slow": {"m": whole, "m2": whole_slow},
    "same_call": {"m": whole_tool_call, "m2": whole_tool_call},
    "other_call": {"m": whole_tool_call, "m2": whole_other_call},
    "call_or_words": {"m": whole_tool_call, "m2": whole},
    "both_thought_only": {"m": whole_thought_only, "m2": whole_thought_only},
    "both_empty": {"m": whole_empty_after_thought, "m2": whole_empty_after_thought},
    "stream_call_same": {"m": stream_tool_call, "m2": whole_tool_call},
}
_MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


def _scenario(body: dict[str, Any]) -> str:
    if "messages" in body:
        return str(body["messages"][-1]["content"])
    prompt = body["prompt"]
    return str(prompt[0] if isinstance(prompt, list) else prompt)


async def _handle(reader: asyncio.StreamReader, writer: Writer, last: list[bytes]) -> None:
    try:
        while True:
            head, body = await read_request(reader)
            if head.startswith(b"GET"):
                path = head.split(b" ", 2)[1]
                _json(writer, {b"/v1/models": _MODELS, b"/last": last[0]}.get(path, b"{}"))
                await writer.drain()
                continue
            last[0] = body
            data = json.loads(body)
            if b"x-tiergate-shadow: judge" in head.lower():
                _json(writer, _judged(data))
                await writer.drain()
                return
            name = _scenario(data)
            by_model = BY_MODEL.get(name)
            await (by_model[data["model"]] if by_model else SCENARIOS[name])(writer)
            await writer.drain()
            return
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int) -> None:
    last = [b"{}"]

    async def handle(reader: asyncio.StreamReader, writer: Writer) -> None:
        await _handle(reader, writer, last)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(_serve(parser.parse_args().port))
