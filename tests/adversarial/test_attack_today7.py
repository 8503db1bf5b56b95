"""Attacks on today's relay counting (long chunks charged by their text), traced output parts
and the budgets' payback loop after a Redis outage.

The charge of a stream is checked through a real gateway in front of the scripted billing
backend (``tests.adversarial.bill_upstream``, with keys and budgets in a real redis-server);
the counting's own corners on :class:`StreamTally` fed the events a backend writes; the
payback loop against a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.config.redis_client import BackendHealth
from gateway.limits.budget_outage import FailOpenBudgetStore
from gateway.limits.budget_stores import RedisBudgetStore, Windows
from gateway.telemetry.output_parts import OutputParts
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.sse import joined_event
from gateway.upstream.stream_tally import StreamTally
from tests.adversarial.telemetry_stack import traced_gateway
from tests.adversarial.test_attack_bill import Bill, billed_gateway, chat, post
from tests.adversarial.test_attack_stream_endings import _relayed, _sse
from tests.adversarial.test_attack_telemetry import _value, _wait_spans
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
NOON = 1_796_126_400.0  # 2026-12-01 12:00 UTC


def _event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    data = {"id": "b", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + json.dumps({**data, "choices": choices, **extra}).encode()


def _content(text: str, **choice: Any) -> bytes:
    return _event([{"index": 0, "delta": {"content": text}, "finish_reason": None, **choice}])


def _tally(max_tokens: int | None = None) -> StreamTally:
    return StreamTally(
        strip_usage=False, prompt_tokens=0, max_tokens=max_tokens, capture=False, choices=1
    )


# --- what a stream is charged -------------------------------------------------------------


@pytest.fixture(scope="module")
def bill() -> Iterator[Bill]:
    """The billing stack of ``test_attack_bill`` (its own, for this module)."""
    with billed_gateway() as stack:
        yield stack


@pytest.mark.slow
def test_a_backends_usage_is_not_raised_by_the_estimate_of_cumulative_chunks(bill: Bill) -> None:
    """A backend whose every chunk repeats the whole text so far (10 chunks, 10 words more
    each) and reports what it generated: 20 + 100. The caller is charged that, not the sum
    of the rough estimates of every chunk's whole text (about 650: the long-chunk estimate
    was also the floor under a reported count)."""
    key_id, token = bill.key()
    response = post(bill, token, chat("stream_cumulative_content", stream=True, max_tokens=1000))
    assert response.text.endswith("data: [DONE]\n\n")
    row = bill.usage(key_id)
    assert row is not None
    assert (row["input_tokens"], row["output_tokens"]) == (20, 100)


def test_reported_usage_is_floored_by_the_chunk_count_not_the_estimate() -> None:
    """The same at the tally: one chunk of 2,000 characters of padded JSON arguments (500
    tokens by the rough estimate, fewer by a real tokenizer, which merges runs of spaces) and
    a backend's usage of 120: the usage stands. A count below the chunks streamed is still
    raised to them (a broken ``"completion_tokens": 0``)."""
    tally = _tally()
    padded = json.dumps({"a": 1}, indent=1990)
    call = {"index": 0, "function": {"arguments": padded}}
    tally._chunk(_event([{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]))
    tally._chunk(_content("x"))
    tally._usage_event(_event([], usage={"prompt_tokens": 5, "completion_tokens": 120}))
    assert tally.usage is not None
    assert tally.usage.completion_tokens == 120
    tally._usage_event(_event([], usage={"prompt_tokens": 5, "completion_tokens": 0}))
    assert tally.usage.completion_tokens == 2
    # A cut stream (no usage) is still charged by the estimate.
    assert tally._count_usage().completion_tokens > 500


def test_a_long_first_chunk_of_one_token_does_not_hide_later_long_chunks() -> None:
    """A first chunk of one token that carries 100 KB only it has (the prompt's token ids,
    logprobs), then a chunk of 4,000 characters of buffered arguments (1,000 tokens by the
    estimate) in a short envelope, then the stream is cut: the second chunk is charged its
    estimate, not 1 (the first chunk had raised the bar to its envelope, 100 KB)."""
    tally = _tally()
    tally._chunk(_content("Hi", prompt_token_ids=list(range(20_000))))
    tally._chunk(_content("x"))  # a usual chunk of one token
    tally._chunk(_content("word " * 800))
    assert tally._count_usage().completion_tokens >= 1000 + 2


def test_chunks_just_under_the_bar_are_one_token_each() -> None:
    """Held as documented (docs/backends.md: a chunk of a few tokens counts 1): 100 chunks of
    250 bytes with 8 tokens of text each, cut, are charged 100, not 800 (a backend's
    ``stream_interval``). Recorded so a change to the rule is seen."""
    tally = _tally()
    for _ in range(100):
        event = _content("abcd" * 8)
        assert len(event) <= 256
        tally._chunk(event)
    assert tally._count_usage().completion_tokens == 100


def test_a_long_chunk_of_thinking_and_text_counts_both_once() -> None:
    """Held: one chunk with 1,000 characters of ``reasoning_content`` and 1,000 of ``content``
    (a server that sends both in one delta) counts 500 tokens: both were generated, and
    neither twice."""
    tally = _tally()
    delta = {"reasoning_content": "a" * 1000, "content": "b" * 1000}
    tally._chunk(_event([{"index": 0, "delta": delta, "finish_reason": None}]))
    assert tally._count_usage().completion_tokens == 500


def test_a_line_feed_inside_a_string_is_not_joined_into_json() -> None:
    """Held: data over two lines that split a JSON string (an SSE client joins them with a
    line feed, a raw control character inside the string: no JSON for an SDK) is not read
    as JSON by the relay either, though joining with a space would make it JSON; split
    between two tokens, ``data:`` without the space, it is."""
    inside = b'data: {"choices":[{"delta":{"content":"a\ndata: b"}}]}'
    between = b'data: {"choices":[{"delta":\ndata:{"content":"ab"}}]}'
    assert joined_event(inside) is None
    assert joined_event(between) == b'data: {"choices":[{"delta": {"content":"ab"}}]}'


@pytest.mark.slow
def test_a_cut_streams_estimate_is_at_most_max_tokens(bill: Bill) -> None:
    """Held: a cut tool call whose 2,048 characters of arguments came in one chunk (512 tokens
    by the estimate) on a request of ``max_tokens: 50`` is charged 50, not 512."""
    key_id, token = bill.key()
    post(bill, token, chat("stream_tool_call_big_arguments_cut", stream=True))
    row = bill.usage(key_id)
    assert row is not None
    assert row["output_tokens"] == 50


@pytest.mark.parametrize("framing", [b"\n", b"\r\n"])
async def test_both_relay_paths_count_a_long_chunk_alike(
    upstream: UpstreamClient, framing: bytes
) -> None:
    """A cut stream, LF or CRLF framed: a first chunk with 100 KB of prompt ids, then 4,000
    characters of text split over two ``data`` lines. Iterated (Litestar) and pumped (the
    native server) the caller gets the same bytes and the stream the same count: the long
    chunk's estimate (1,000) and the first chunk's token."""
    first = _content("Hi", prompt_token_ids=list(range(20_000)))
    body = _content("word " * 800)
    cut = body.index(b'"content"')  # between two of JSON's tokens: the same JSON joined
    split = body[:cut] + b"\ndata:" + body[cut:]
    events = [(e + b"\n\n").replace(b"\n", framing) for e in (first, split)]
    _, outcome, usage = await _relayed(upstream, _sse(*events))
    assert outcome != "complete"
    assert usage is not None
    assert usage.completion_tokens == 1000 + 1


# --- traced output (telemetry.capture_content) ----------------------------------------------


def _encoded_size(parts: OutputParts) -> int:
    return len(parts.encoded([]))


def test_a_backend_cannot_make_a_span_of_thousands_of_choices() -> None:
    """A backend (asked for one choice) that numbers each of 10,000 empty chunks with a new
    ``index``: the traced output keeps at most 128 choices (the most ``n`` a span's finish
    reasons keep), not 10,000 messages (about 900 KB of span and 10,000 objects held while
    the stream runs, from 450 KB of stream)."""
    parts = OutputParts()
    for index in range(10_000):
        parts.add({"index": index, "delta": {}, "finish_reason": None})
    assert len(parts.choices) <= 128
    assert _encoded_size(parts) < 20_000


def test_a_backend_cannot_make_a_span_of_thousands_of_tool_calls() -> None:
    """One chunk (a few dozen KB) naming 10,000 tool calls by ``index``: at most 128 are
    kept per choice."""
    parts = OutputParts()
    calls = [{"index": index} for index in range(10_000)]
    parts.add({"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None})
    assert len(parts.choices[0].calls) <= 128


UPSTREAM_KEY = "sk-upstream-today7-0123456789abcdef"


@pytest.mark.slow
def test_an_upstream_key_the_backend_writes_in_its_answer_is_not_in_the_span() -> None:
    """With ``capture_content`` on, a backend that writes the key it was sent into its answer
    (``your key: <key>``): the span's ``gen_ai.output.messages`` holds the answer with the key
    blanked, as the gateway blanks it in the backend's error messages (secrets never in
    spans). The caller's stream is the backend's text as it came (content is not rewritten)."""
    args = ("--status", "200", "--shape", "content")
    with traced_gateway("key_echo_upstream", *args, tier={"api_key": UPSTREAM_KEY}) as stack:
        gateway, received = stack
        body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(
            gateway.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=10
        )
        assert UPSTREAM_KEY in answer.text
        spans = _wait_spans(received, 2)
    (client,) = [span for span in spans if span.name.startswith("chat ")]
    attributes = {a.key: _value(a) for a in client.attributes}
    output = attributes["gen_ai.output.messages"]
    assert "your key: " in output
    assert UPSTREAM_KEY not in output


# --- the budgets' payback loop ---------------------------------------------------------------


async def test_a_settlement_lost_while_the_loop_checks_an_earlier_one_counts_once(
    redis_server: RedisServer,
) -> None:
    """The payback is checking whether a lost charge (0.5, never applied) ran, when another
    request's settlement (0.25, sent before, answer lost: its client left) joins the unsure
    list. Each must be judged once: 0.75 owed and paid. (Before: the loop popped the newer
    entry unjudged, judged the older one twice: 1.0 paid, the 0.25 lost.)"""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up")
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    remote_charged = store.remote.charged
    joined = False

    async def charged(key_id: str, seq: int) -> bool:
        nonlocal joined
        if not joined:  # while this check is out, the other request's answer is lost
            joined = True
            late = store.remote.next_seq()
            await store._not_answered("k1", windows, 0.25, late)
        return await remote_charged(key_id, seq)

    store.remote.charged = charged  # type: ignore[method-assign]
    try:
        store.unsure.append(("k1", windows, 0.5, store.remote.next_seq(), False))
        await store._settle_up()
        assert not store.unsure
        assert not store.owed
        spend = float(await client.get(f"t:budget:{{k1}}:d:{windows.day}") or 0)
        assert spend == 0.75
    finally:
        await store.aclose()
        await client.aclose()


async def test_starting_the_payback_loop_twice_runs_one_loop(
    redis_server: RedisServer,
) -> None:
    """``Accounting.startup`` called twice (tests, a reload): one payback task, stopped by
    ``aclose``; started again after it, a fresh one. Held."""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=0.05)
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    try:
        store.start()
        first = store._repayer
        store.start()
        assert store._repayer is first
        names = [t.get_name() for t in asyncio.all_tasks()]
        assert names.count("budget.payback") == 1
    finally:
        await store.aclose()
        await client.aclose()
    assert first is not None
    assert first.done()


async def test_a_read_only_redis_is_probed_at_the_interval_and_paid_once_writable(
    redis_server: RedisServer,
) -> None:
    """Held: Redis answers reads but refuses writes (a replica: READONLY) while 0.5 is owed.
    The payback loop's tries stay at its interval (no spin: 0.05 s, so at most about a dozen
    in 0.5 s), the debt is kept, and once Redis takes writes again it is paid once."""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=0.05)
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    remote_adjust = store.remote.adjust
    tries = 0

    async def adjust(*args: Any, **kwargs: Any) -> float | None:
        nonlocal tries
        tries += 1
        return await remote_adjust(*args, **kwargs)

    store.remote.adjust = adjust  # type: ignore[method-assign]
    admin = Redis.from_url(redis_server.url)
    store.start()
    try:
        await admin.replicaof("127.0.0.1", 1)  # read-only, no master
        health.failed("ConnectionError")
        await store.adjust("k1", windows, 0.5)
        await asyncio.sleep(0.5)
        assert 1 <= tries <= 15
        assert not health.healthy
        kept = sum(d for d, _ in store.owed.values()) + sum(u[2] for u in store.unsure)
        assert kept == 0.5
        await admin.replicaof("NO", "ONE")
        for _ in range(250):
            if not (store.owed or store.unsure):
                break
            await asyncio.sleep(0.02)
        spend = float(await client.get(f"t:budget:{{k1}}:d:{windows.day}") or 0)
        assert spend == 0.5
    finally:
        await store.aclose()
        await client.aclose()
        await admin.aclose()


async def test_shutdown_while_the_loop_pays_back_pays_once(redis_server: RedisServer) -> None:
    """Held: ``aclose`` (shutdown) cancels the payback loop while its write of 0.5 is out to
    Redis: the write is judged by Redis' marks and the debt is in Redis once, 0.5."""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=0.02)
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    remote_adjust = store.remote.adjust
    out = asyncio.Event()

    async def adjust(*args: Any, **kwargs: Any) -> float | None:
        out.set()
        return await remote_adjust(*args, **kwargs)

    store.remote.adjust = adjust  # type: ignore[method-assign]
    health.failed("ConnectionError")
    await store.adjust("k1", windows, 0.5)
    store.start()
    try:
        async with asyncio.timeout(5):
            await out.wait()
    finally:
        await store.aclose()
    spend = float(await client.get(f"t:budget:{{k1}}:d:{windows.day}") or 0)
    await client.aclose()
    assert spend == 0.5
    assert not store.owed
    assert not store.unsure
