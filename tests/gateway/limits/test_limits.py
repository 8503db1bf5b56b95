"""The rate-limit stage: headers, 429s, reconciliation, and the Redis failure policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.config.redis_client import BackendHealth, open_redis
from gateway.config.settings import RedisSettings
from gateway.limits.limiter_redis import RedisRateLimiter
from gateway.limits.limits import (
    EVENT_REDIS_DOWN,
    EVENT_REDIS_UP,
    KeyLimiter,
    LimitMetrics,
    RateLimitUnavailable,
)
from policies.errors import RateLimited
from policies.principal import KeyPolicy, Principal
from policies.ratelimit import MemoryRateLimiter
from tests.processes import free_port
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

T = TypeVar("T")


def key(
    rpm: int | None = None, tpm: int | None = None, max_concurrency: int | None = None
) -> Principal:
    """A principal whose policy has these limits."""
    return Principal("kid", "tenant", KeyPolicy(rpm=rpm, tpm=tpm, max_concurrency=max_concurrency))


@pytest.fixture
def metrics() -> LimitMetrics:
    """Fresh counters."""
    return LimitMetrics()


@pytest.fixture
def memory(metrics: LimitMetrics) -> KeyLimiter:
    """A limiter over the memory backend."""
    return KeyLimiter(MemoryRateLimiter(), metrics=metrics)


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A gateway-configured client of the test server."""
    client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
    yield client
    await client.aclose()


def redis_limiter(client: Redis, metrics: LimitMetrics, *, fail_open: bool) -> KeyLimiter:
    """A Redis limiter with the gateway's failure policy and a fast probe."""
    health = BackendHealth(
        "redis",
        down_event=EVENT_REDIS_DOWN,
        up_event=EVENT_REDIS_UP,
        retry_interval_s=0.0,
        on_change=lambda up: metrics.set_degraded("redis", not up),
    )
    return KeyLimiter(
        RedisRateLimiter(client, prefix="t:"),
        metrics=metrics,
        health=health,
        fallback=MemoryRateLimiter() if fail_open else None,
    )


async def test_unlimited_key_gets_no_headers(memory: KeyLimiter) -> None:
    """A key without limits is admitted without touching any backend or header."""
    admission = await memory.admit(key(), 10_000)
    assert dict(admission.headers) == {}
    await admission.settle(5)


async def test_headers_follow_openai_names(memory: KeyLimiter) -> None:
    """Admission carries the six x-ratelimit headers with the remaining budget."""
    admission = await memory.admit(key(rpm=60, tpm=1000), 100)
    headers = dict(admission.headers)
    assert headers["x-ratelimit-limit-requests"] == "60"
    assert headers["x-ratelimit-remaining-requests"] == "59"
    assert headers["x-ratelimit-reset-requests"] == "1s"
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "900"
    assert headers["x-ratelimit-reset-tokens"] == "6s"


async def test_over_the_limit_is_429_with_retry_after(
    memory: KeyLimiter, metrics: LimitMetrics
) -> None:
    """The request past rpm is a rate_limit_exceeded 429 with Retry-After and headers."""
    await memory.admit(key(rpm=2), 1)
    await memory.admit(key(rpm=2), 1)
    with pytest.raises(RateLimited) as info:
        await memory.admit(key(rpm=2), 1)
    exc = info.value
    assert (exc.status, exc.code, exc.error_type) == (
        429,
        "rate_limit_exceeded",
        "rate_limit_error",
    )
    assert exc.headers["retry-after"] == "30"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert "requests per minute" in exc.message
    assert getattr(exc, "limit", None) == "requests"
    assert metrics.decisions[("requests", "rejected")] == 1
    assert metrics.decisions[("all", "allowed")] == 2


async def test_settle_reconciles_tokens_once(memory: KeyLimiter) -> None:
    """Usage below the reservation is refunded, exactly once however often settle runs."""
    first = await memory.admit(key(tpm=1000), 800)
    await first.settle(300)
    await first.settle(0)
    second = await memory.admit(key(tpm=1000), 700)
    assert dict(second.headers)["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(RateLimited):
        await memory.admit(key(tpm=1000), 1)


async def test_unknown_usage_keeps_the_reservation_but_frees_the_slot(memory: KeyLimiter) -> None:
    """settle(None) keeps the reserved tokens charged and releases concurrency."""
    admission = await memory.admit(key(tpm=100, max_concurrency=1), 60)
    await admission.settle(None)
    with pytest.raises(RateLimited, match="tokens per minute"):
        await memory.admit(key(tpm=100, max_concurrency=1), 60)
    assert await memory.admit(key(tpm=100, max_concurrency=1), 40)


async def test_failed_upstream_refunds_all_tokens(memory: KeyLimiter) -> None:
    """settle(0) (upstream failed) gives every reserved token back."""
    admission = await memory.admit(key(tpm=100), 100)
    await admission.settle(0)
    await memory.admit(key(tpm=100), 100)


@pytest.fixture(params=["memory", "redis"])
async def either(
    request: pytest.FixtureRequest, metrics: LimitMetrics
) -> AsyncIterator[KeyLimiter]:
    """A limiter over each backend in turn."""
    if request.param == "memory":
        yield KeyLimiter(MemoryRateLimiter(), metrics=metrics)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = open_redis(RedisSettings(url=server.url, socket_timeout_s=0.5))
    try:
        yield redis_limiter(client, metrics, fail_open=False)
    finally:
        await client.aclose()


async def test_withdraw_gives_back_request_tokens_and_slot(either: KeyLimiter) -> None:
    """withdraw() (refused before forwarding) returns the request, its tokens and its slot."""
    limiter = either
    principal = key(rpm=2, tpm=100, max_concurrency=1)
    for _ in range(5):
        admission = await limiter.admit(principal, 100)
        await admission.withdraw()
        await admission.settle(100)  # a settle after withdraw is ignored
    kept = await limiter.admit(principal, 100)
    assert dict(kept.headers)["x-ratelimit-remaining-requests"] == "1"
    assert dict(kept.headers)["x-ratelimit-remaining-tokens"] == "0"


async def test_too_large_request_has_no_retry_after(memory: KeyLimiter) -> None:
    """A reservation above the whole tpm can never pass: 429 without Retry-After."""
    with pytest.raises(RateLimited, match="Lower max_tokens") as info:
        await memory.admit(key(tpm=100), 500)
    assert "retry-after" not in info.value.headers


async def test_fail_open_uses_local_limits_and_recovers(
    redis_server: RedisServer, redis_client: Redis, metrics: LimitMetrics
) -> None:
    """Redis down: admitted locally with limits, one log line each way, gauge follows."""
    limiter = redis_limiter(redis_client, metrics, fail_open=True)
    await limiter.admit(key(rpm=3), 1)
    redis_server.kill()
    with capture_logs() as logs:
        for _ in range(3):
            await limiter.admit(key(rpm=3), 1)
        with pytest.raises(RateLimited):
            await limiter.admit(key(rpm=3), 1)
        assert metrics.degraded == {"redis": 1}
        redis_server.start()
        for _ in range(3):
            await limiter.admit(key(rpm=3), 1)
        with pytest.raises(RateLimited):
            await limiter.admit(key(rpm=3), 1)
    assert [entry["event"] for entry in logs] == [EVENT_REDIS_DOWN, EVENT_REDIS_UP]
    assert metrics.degraded == {"redis": 0}
    assert metrics.decisions[("all", "allowed_local")] == 3
    assert metrics.decisions[("requests", "rejected_local")] == 1


async def test_fail_closed_answers_503_then_recovers(
    redis_server: RedisServer, redis_client: Redis, metrics: LimitMetrics
) -> None:
    """Fail-closed: 503 with Retry-After while Redis is down, normal service after."""
    limiter = redis_limiter(redis_client, metrics, fail_open=False)
    redis_server.kill()
    with pytest.raises(RateLimitUnavailable) as info:
        await limiter.admit(key(rpm=3), 1)
    assert info.value.status == 503
    assert info.value.headers["retry-after"] == "1"
    redis_server.start()
    await limiter.admit(key(rpm=3), 1)
    assert metrics.decisions[("backend", "unavailable")] == 1


async def test_settle_survives_redis_loss(
    redis_server: RedisServer, redis_client: Redis, metrics: LimitMetrics
) -> None:
    """A settle while Redis is down does not raise; the limiter goes degraded."""
    limiter = redis_limiter(redis_client, metrics, fail_open=True)
    admission = await limiter.admit(key(tpm=100, max_concurrency=2), 50)
    redis_server.kill()
    await admission.settle(10)
    assert metrics.degraded == {"redis": 1}


async def test_metrics_export_through_prometheus_client(
    memory: KeyLimiter, metrics: LimitMetrics
) -> None:
    """The counters register as a collector with the documented names."""
    await memory.admit(key(rpm=1), 1)
    metrics.set_degraded("redis", True)
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert 'tiergate_ratelimit_backend_degraded{backend="redis"} 1.0' in text
    assert 'tiergate_ratelimit_degraded_decisions_total{outcome="allowed_local"} 0.0' in text
    assert "tiergate_ratelimit_decisions_total" not in text  # counted by request telemetry


async def test_redis_settle_applies_before_the_next_admission(
    redis_client: Redis, metrics: LimitMetrics
) -> None:
    """The lazy settlement goes out with (and before) this replica's next admission."""
    limiter = redis_limiter(redis_client, metrics, fail_open=False)
    principal = Principal("lazy", "tenant", KeyPolicy(tpm=1000, max_concurrency=1))
    first = await limiter.admit(principal, 1000)
    settling = asyncio.ensure_future(first.settle(100))  # 900 tokens back, the slot freed
    await asyncio.sleep(0)
    second = await limiter.admit(principal, 900)  # fits only after the settlement
    assert settling.done()
    assert second.headers["x-ratelimit-remaining-tokens"] == "0"
    await second.withdraw()
    await limiter.aclose()


async def test_limiter_close_sends_held_back_settlements(
    redis_client: Redis, metrics: LimitMetrics
) -> None:
    """Shutdown writes the settlements still waiting for an admission to ride on."""
    limiter = redis_limiter(redis_client, metrics, fail_open=False)
    principal = Principal("closing", "tenant", KeyPolicy(tpm=1000, max_concurrency=1))
    admission = await limiter.admit(principal, 600)
    settling = asyncio.ensure_future(admission.settle(0))
    await asyncio.sleep(0)
    await limiter.aclose()
    await settling
    assert await redis_client.zcard("t:rl:{closing}:c") == 0  # the slot is free
    assert float(await redis_client.hget("t:rl:{closing}", "t") or 0) < 1.0  # tokens back


def _completes_at_once(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` one step; it must finish without suspending (no IO, no loop turn)."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise AssertionError("the coroutine suspended")


async def test_admits_at_once_says_when_admission_needs_no_round_trip(
    memory: KeyLimiter, redis_client: Redis, metrics: LimitMetrics
) -> None:
    """Memory counters and keys without limits admit without suspending; Redis limits do not.

    The proxy relies on this: it overlaps classification with the admission only when the
    admission waits on a round trip, and otherwise saves the task and the loop turn.
    """
    limited, unlimited = key(rpm=10, tpm=1000, max_concurrency=2), key()
    assert memory.admits_at_once(limited)
    assert memory.admits_at_once(unlimited)
    admission = _completes_at_once(memory.admit(limited, 10))
    assert admission.headers["x-ratelimit-remaining-requests"] == "9"
    redis = redis_limiter(redis_client, metrics, fail_open=True)
    assert not redis.admits_at_once(limited)
    assert redis.admits_at_once(unlimited)
    assert dict(_completes_at_once(redis.admit(unlimited, 10)).headers) == {}
    assert dict((await redis.admit(limited, 10)).headers)  # a real round trip, with headers


async def test_limiter_close_leaves_no_slot_freeing_behind(metrics: LimitMetrics) -> None:
    """Redis does not answer: each refused admission leaves a task that frees its slot once
    Redis is back. Shutdown gives up on them, and they have ended once it returns (before,
    they were asked to stop once and left running past the close of the client)."""
    client = open_redis(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0"))
    limiter = redis_limiter(client, metrics, fail_open=False)
    principal = Principal("dead", "tenant", KeyPolicy(max_concurrency=2))
    for _ in range(3):
        with pytest.raises(RateLimitUnavailable):
            await limiter.admit(principal, 10)
    assert len(asyncio.all_tasks()) > 1  # the slot-freeing retries
    await limiter.aclose()
    await client.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}
