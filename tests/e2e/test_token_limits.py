"""Token-per-minute limits in Redis, reconciled from what the real server reports it used.

Each admitted request reserves its prompt estimate plus ``max_tokens``; when the answer is
over, the gateway corrects the reservation to the real usage. With a tight budget that only
shows: the next request fits only if the unused part of the reservation came back.
"""

from __future__ import annotations

import time

import openai
import pytest
import redis as redis_lib
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import TIGHT_TPM, Keys, client_for
from tests.integration.gateway_proc import GatewayProcess
from tests.redis_server import RedisServer

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi! How are you today?"}]
BIG_MAX_TOKENS = 100
SMALL_MAX_TOKENS = 8
REFILL_PER_S = TIGHT_TPM / 60


def ask(client: openai.OpenAI, max_tokens: int) -> tuple[int, CompletionUsage | None]:
    """A short, deterministic answer (greedy, stopped at the first full stop).

    Returns the ``x-ratelimit-remaining-tokens`` header and the answer's usage.
    """
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=HELLO, max_tokens=max_tokens, temperature=0, stop=["."]
    )
    return int(raw.headers["x-ratelimit-remaining-tokens"]), raw.parse().usage


def check_reconciled(client: openai.OpenAI, first_remaining: int, used: int, since: float) -> None:
    """The next request fits, and its headers show the first one charged at ``used`` tokens."""
    reserved_first = TIGHT_TPM - first_remaining
    reserve_next = reserved_first - BIG_MAX_TOKENS + SMALL_MAX_TOKENS
    left, _ = ask(client, SMALL_MAX_TOKENS)
    refill_bound = REFILL_PER_S * (time.monotonic() - since) + 1
    expected = TIGHT_TPM - used - reserve_next
    assert expected - 1 <= left <= expected + refill_bound
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client, BIG_MAX_TOKENS)
    assert refused.value.response.headers.get("retry-after")


def test_non_streaming_reservation_is_corrected_to_real_usage(
    gateway: GatewayProcess, keys: Keys, redis: RedisServer
) -> None:
    """After a non-streaming answer the key is charged its real usage, not its max_tokens."""
    client = client_for(gateway, keys.tight_sync)
    started = time.monotonic()
    first_remaining, usage = ask(client, BIG_MAX_TOKENS)
    assert usage is not None
    assert usage.completion_tokens < BIG_MAX_TOKENS
    check_reconciled(client, first_remaining, usage.total_tokens, started)
    store = redis_lib.Redis.from_url(redis.url)
    assert store.keys("tiergate:*"), "the limiter keeps no state in Redis"


def test_streaming_reservation_is_corrected_to_reported_usage(
    gateway: GatewayProcess, keys: Keys
) -> None:
    """After a stream the key is charged the usage the stream reported, not its max_tokens."""
    client = client_for(gateway, keys.tight_stream)
    started = time.monotonic()
    with client.chat.completions.with_streaming_response.create(
        model="fast",
        messages=HELLO,
        max_tokens=BIG_MAX_TOKENS,
        temperature=0,
        stop=["."],
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        first_remaining = int(raw.headers["x-ratelimit-remaining-tokens"])
        chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens < BIG_MAX_TOKENS
    check_reconciled(client, first_remaining, usage.total_tokens, started)
