"""Attacks on the complete-stream invariant by how a backend ends its answer.

A scripted raw server on loopback streams each answer; the Forwarder and the StreamRelay of
the request path read it. An answer the backend finished reaches the caller complete (with
[DONE]); one it did not finish ends in an in-band error, whatever the choices, the key order or
the framing.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import Outcome, Usage
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, Respond
from tests.gateway.relay_drive import DRIVES, drive

PATH = "/v1/chat/completions"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"


def _role(index: int = 0) -> bytes:
    return b'data: {"id":"c","choices":[{"index":%d,"delta":{"role":"assistant"}}]}\n\n' % index


def _token(index: int = 0) -> bytes:
    return (
        b'data: {"id":"c","choices":[{"index":%d,"delta":{"content":"x"},'
        b'"finish_reason":null}]}\n\n' % index
    )


def _final(index: int = 0, reason: bytes = b"stop") -> bytes:
    return b'data: {"id":"c","choices":[{"index":%d,"delta":{},"finish_reason":"%s"}]}\n\n' % (
        index,
        reason,
    )


def _sse(*events: bytes) -> Respond:
    """A chunked SSE answer: one chunk per event, then the end."""

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HEAD)
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return respond


async def _relayed(
    upstream: UpstreamClient, respond: Respond, *, choices: int = 1
) -> tuple[bytes, str, Usage | None]:
    """The stream relayed both ways (iterated, and pumped from the connection's callback):
    the client gets the same bytes, the stream the same outcome and usage."""
    results = {how: await _relayed_once(how, upstream, respond, choices=choices) for how in DRIVES}
    assert results["pump"] == results["iterate"]
    return results["pump"]


async def _relayed_once(
    how: str, upstream: UpstreamClient, respond: Respond, *, choices: int = 1
) -> tuple[bytes, str, Usage | None]:
    """Stream through the forwarder and relay for a request of ``choices`` choices."""
    server = await RawUpstream(respond).start()
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
            choices=choices,
        )
        async with asyncio.timeout(10):
            sent = await drive(relay, how)
    finally:
        await server.stop()
    ((outcome, usage),) = closed
    return sent, outcome, usage


def _both(first: bytes, second: bytes) -> bytes:
    """One chunk carrying two choices (a server that batches its choices into one event)."""
    return (
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":%s},'
        b'{"index":1,"delta":{},"finish_reason":%s}]}\n\n' % (first, second)
    )


# -- n > 1: every choice the backend started must finish --------------------------------------


async def test_n_2_on_a_backend_that_ignores_n_is_complete(upstream: UpstreamClient) -> None:
    """llama-cpp-python and Ollama drop ``n``: one choice, finished, then [DONE] is the whole
    answer the backend gives, so the caller gets it complete, not an error."""
    sent, outcome, _ = await _relayed(upstream, _sse(_role(), _token(), _final(), DONE), choices=2)
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)


@pytest.mark.parametrize(
    "events",
    [
        [_role(), _both(b'"stop"', b'"stop"'), DONE],
        [_role(), _both(b"null", b'"stop"'), _final(0), DONE],
    ],
    ids=["both-final-in-one-chunk", "one-final-beside-a-token"],
)
async def test_n_2_with_both_choices_in_one_chunk_is_complete(
    upstream: UpstreamClient, events: list[bytes]
) -> None:
    """Final chunks of two choices in one event count as two finishes."""
    sent, outcome, _ = await _relayed(upstream, _sse(*events), choices=2)
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)


async def test_n_2_with_one_choice_finished_twice_and_one_cut_is_truncated(
    upstream: UpstreamClient,
) -> None:
    """Choice 0's final chunk twice does not stand in for choice 1's, which never ended."""
    events = [_role(0), _role(1), _token(0), _token(1), _final(0), _final(0), DONE]
    sent, outcome, _ = await _relayed(upstream, _sse(*events), choices=2)
    assert outcome == Outcome.UPSTREAM_TRUNCATED
    assert DONE not in sent
    assert b"before the answer was finished" in sent


async def test_n_2_with_both_choices_finished_is_complete(upstream: UpstreamClient) -> None:
    """vLLM's n=2 stream: each choice's final chunk, then [DONE]: complete."""
    events = [_role(0), _role(1), _token(0), _token(1), _final(1), _final(0), DONE]
    sent, outcome, _ = await _relayed(upstream, _sse(*events), choices=2)
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)


# -- n = 1: the final chunk however its JSON is spaced ------------------------------------------


@pytest.mark.parametrize(
    "separator", [b" : ", b":  ", b":\t", b" :"], ids=["spaced", "two-spaces", "tab", "before"]
)
async def test_a_final_chunk_with_odd_json_spacing_is_complete(
    upstream: UpstreamClient, separator: bytes
) -> None:
    """JSON may space its colons any way: the final chunk still ends a complete answer, and
    the tokens before it are still counted."""
    token = _token().replace(b'"finish_reason":', b'"finish_reason"' + separator)
    final = _final().replace(b'"finish_reason":', b'"finish_reason"' + separator)
    sent, outcome, usage = await _relayed(upstream, _sse(_role(), token, token, final, DONE))
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)
    assert usage is not None
    assert usage.completion_tokens == 2


@pytest.mark.parametrize("done", [True, False], ids=["tgi-2.2", "tgi-2.1"])
@pytest.mark.parametrize("choices", [1, 2])
async def test_tgi_before_2_3_completions_streams_are_complete(
    upstream: UpstreamClient, done: bool, choices: int
) -> None:
    """TGI before 2.3 sends ``"finish_reason": ""`` on every /v1/completions chunk and no other
    final chunk (then [DONE] from 2.2, nothing before): its answers still arrive complete."""
    chunk = b'data: {"id":"","choices":[{"finish_reason":"","index":0,"text":"x"}]}\n\n'
    events = [chunk, chunk, *([DONE] if done else [])]
    sent, outcome, usage = await _relayed(upstream, _sse(*events), choices=choices)
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)
    assert usage is not None
    assert usage.completion_tokens == 2


async def test_a_token_that_spells_a_finish_reason_does_not_finish(
    upstream: UpstreamClient,
) -> None:
    """A token whose text is ``"finish_reason": "stop"`` (escaped in the JSON) is a token, not
    a final chunk: [DONE] after it is still a cut."""
    token = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":'
        b'"\\"finish_reason\\": \\"stop\\""},"finish_reason":null}]}\n\n'
    )
    sent, outcome, _ = await _relayed(upstream, _sse(_role(), token, DONE))
    assert outcome == Outcome.UPSTREAM_TRUNCATED
    assert DONE not in sent


# -- chunks that leave ``finish_reason`` out (LiteLLM's proxy) ----------------------------------

# LiteLLM 1.108's proxy writes its chunks with no ``finish_reason`` key until the final one, and
# its own error event (a backend lost mid-stream) with spaces and a string code.
LITELLM_ROLE = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
)
LITELLM_TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" x"}}]}\n\n'
LITELLM_ERROR = (
    b'data: {"error": {"message": "litellm.APIConnectionError: Connection error.", '
    b'"type": null, "param": null, "code": "500"}}\n\n'
)


async def test_chunks_without_a_finish_reason_key_are_counted(upstream: UpstreamClient) -> None:
    """A backend that reports no stream usage and leaves ``finish_reason`` out of its chunks
    still has each content chunk counted as a token."""
    events = [LITELLM_ROLE, LITELLM_TOKEN, LITELLM_TOKEN, LITELLM_TOKEN, _final(), DONE]
    sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.COMPLETE
    assert sent.endswith(DONE)
    assert usage is not None
    assert usage.completion_tokens == 3


async def test_tokens_before_a_litellm_error_event_are_counted(upstream: UpstreamClient) -> None:
    """LiteLLM's error event after three tokens ends the stream as the backend's error, and the
    three tokens the caller got are still counted (limits, budgets, the ledger)."""
    events = [LITELLM_ROLE, LITELLM_TOKEN, LITELLM_TOKEN, LITELLM_TOKEN, LITELLM_ERROR]
    sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.UPSTREAM_ERROR
    assert DONE not in sent
    assert b"litellm.APIConnectionError" in sent
    assert usage is not None
    assert usage.completion_tokens == 3


# -- data over several lines (the SSE spec joins them with "\n"): counted as one event ---------


SPLIT_TOKENS = (  # each joins into a content chunk; none starts ``data: {``
    b'data:\ndata: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},'
    b'"finish_reason":null}]}\n\n',
    b'data:{"id":"c","choices":[{"index":0,\ndata: "delta":{"content":"x"},'
    b'"finish_reason":null}]}\n\n',
)
SPLIT_FINAL = (
    b'data:{"id":"c","choices":[{"index":0,"delta":{},\ndata:"finish_reason":"stop"}]}\n\n'
)


async def test_chunks_over_several_data_lines_are_counted_and_finish_the_answer(
    upstream: UpstreamClient,
) -> None:
    """Two content chunks and the final chunk, each over two ``data`` lines whose first is not
    ``data: {``: relayed as sent, both tokens counted, and the final chunk ends the answer
    complete (not cut for want of a ``finish_reason``)."""
    events = [_role(), *SPLIT_TOKENS, SPLIT_FINAL, DONE]
    sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.COMPLETE
    assert all(event in sent for event in (*SPLIT_TOKENS, SPLIT_FINAL))
    assert sent.endswith(DONE)
    assert usage is not None
    assert usage.completion_tokens == 2


@pytest.mark.parametrize(
    "usage_event",
    [
        b'data:\ndata: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}',
        b'data: {"id":"c","choices":[],\ndata: "usage":{"prompt_tokens":5,"completion_tokens":9}}',
    ],
)
async def test_a_usage_chunk_over_several_data_lines_is_recorded(
    upstream: UpstreamClient, usage_event: bytes
) -> None:
    """The backend's usage chunk over two ``data`` lines is read as its usage (5 + 9), not
    replaced by the gateway's own count of the one token streamed."""
    events = [_role(), _token(), _final(), usage_event + b"\n\n", DONE]
    _sent, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome == Outcome.COMPLETE
    assert usage == Usage(5, 9)
