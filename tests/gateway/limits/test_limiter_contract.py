"""One contract for both rate-limit backends: memory (one process) and Redis (all replicas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.limits.limiter_redis import RedisRateLimiter
from policies.ratelimit import Limit, LimitSpec, MemoryRateLimiter, RateLimitBackend
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

PERIOD_S = 1.2  # short, so refill is observable in real time on Redis' clock


@pytest.fixture(params=["memory", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which backend a test builds itself."""
    return str(request.param)


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[RateLimitBackend]:
    """Each backend in turn, with a short period."""
    if request.param == "memory":
        yield MemoryRateLimiter(period_s=PERIOD_S)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = Redis.from_url(server.url)
    try:
        yield RedisRateLimiter(client, period_s=PERIOD_S, prefix="test:")
    finally:
        await client.aclose()


async def test_exactly_the_limit_passes_at_once(backend: RateLimitBackend) -> None:
    """With rpm N, N requests pass back to back and the next is refused with a wait."""
    spec = LimitSpec(rpm=5)
    verdicts = [await backend.acquire("k", spec, 0, "") for _ in range(6)]
    assert [v.allowed for v in verdicts] == [True] * 5 + [False]
    refused = verdicts[-1]
    assert refused.exceeded is Limit.REQUESTS
    assert refused.retry_after_ms is not None
    assert 0 < refused.retry_after_ms <= PERIOD_S * 1000 / 5 + 1
    assert [v.requests.remaining for v in verdicts if v.requests] == [4, 3, 2, 1, 0, 0]


async def test_concurrent_acquires_admit_exactly_the_limit(backend: RateLimitBackend) -> None:
    """3N simultaneous checks admit exactly N."""
    spec = LimitSpec(rpm=10)
    verdicts = await asyncio.gather(*(backend.acquire("k", spec, 0, "") for _ in range(30)))
    assert sum(v.allowed for v in verdicts) == 10


async def test_budget_refills_continuously(backend: RateLimitBackend) -> None:
    """After period/limit seconds one more request fits; not a fixed window."""
    spec = LimitSpec(rpm=3)
    for _ in range(3):
        assert (await backend.acquire("k", spec, 0, "")).allowed
    assert not (await backend.acquire("k", spec, 0, "")).allowed
    await asyncio.sleep(PERIOD_S / 3 + 0.05)
    assert (await backend.acquire("k", spec, 0, "")).allowed
    assert not (await backend.acquire("k", spec, 0, "")).allowed


async def test_tokens_reserve_then_reconcile(backend: RateLimitBackend) -> None:
    """Reserved tokens count at once; a refund frees them, an overrun charges more."""
    spec = LimitSpec(tpm=1_000_000)
    first = await backend.acquire("k", spec, 900_000, "")
    assert first.allowed
    assert first.tokens is not None
    assert first.tokens.remaining <= 100_000
    assert (await backend.acquire("k", spec, 200_000, "")).exceeded is Limit.TOKENS
    await backend.release("k", spec, -500_000, "")
    assert (await backend.acquire("k", spec, 200_000, "")).allowed
    await backend.release("k", spec, 400_000, "")
    refused = await backend.acquire("k", spec, 100_000, "")
    assert refused.exceeded is Limit.TOKENS


async def test_cost_above_the_whole_budget_never_fits(backend: RateLimitBackend) -> None:
    """A request reserving more than the tpm limit is refused with no retry time."""
    verdict = await backend.acquire("k", LimitSpec(tpm=100), 101, "")
    assert verdict.exceeded is Limit.TOKENS
    assert verdict.retry_after_ms is None


async def test_refusal_charges_no_limit(backend: RateLimitBackend) -> None:
    """A request refused on tokens does not use up a request."""
    spec = LimitSpec(rpm=2, tpm=100)
    assert not (await backend.acquire("k", spec, 150, "")).allowed
    assert (await backend.acquire("k", spec, 10, "")).allowed
    assert (await backend.acquire("k", spec, 10, "")).allowed


async def test_concurrency_cap_and_release(backend: RateLimitBackend) -> None:
    """Two in flight at most; releasing a slot admits the next."""
    spec = LimitSpec(concurrency=2)
    assert (await backend.acquire("k", spec, 0, "s1")).allowed
    assert (await backend.acquire("k", spec, 0, "s2")).allowed
    refused = await backend.acquire("k", spec, 0, "s3")
    assert refused.exceeded is Limit.CONCURRENCY
    assert refused.retry_after_ms == 1000
    await backend.release("k", spec, 0, "s1")
    assert (await backend.acquire("k", spec, 0, "s3")).allowed


async def test_keys_do_not_share_budgets(backend: RateLimitBackend) -> None:
    """Spending on one key leaves another untouched."""
    spec = LimitSpec(rpm=1, tpm=10)
    assert (await backend.acquire("a", spec, 10, "")).allowed
    assert (await backend.acquire("b", spec, 10, "")).allowed
    assert not (await backend.acquire("a", spec, 1, "")).allowed


async def test_reset_reports_time_until_full(backend: RateLimitBackend) -> None:
    """After spending half the budget the reset is about half a period."""
    spec = LimitSpec(rpm=4)
    await backend.acquire("k", spec, 0, "")
    verdict = await backend.acquire("k", spec, 0, "")
    assert verdict.requests is not None
    assert PERIOD_S * 500 - 50 <= verdict.requests.reset_ms <= PERIOD_S * 500


async def test_slot_never_released_expires_with_its_lease(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """A slot never released (a crashed replica, a lost settle) frees itself after the lease."""
    client: Redis | None = None
    backend: RateLimitBackend
    if kind == "memory":
        backend = MemoryRateLimiter(lease_s=0.3)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = Redis.from_url(server.url)
        backend = RedisRateLimiter(client, lease_s=0.3, prefix="test:")
    try:
        spec = LimitSpec(concurrency=1)
        assert (await backend.acquire("k", spec, 0, "lost")).allowed
        assert not (await backend.acquire("k", spec, 0, "next")).allowed
        await asyncio.sleep(0.35)
        assert (await backend.acquire("k", spec, 0, "next")).allowed
    finally:
        if client is not None:
            await client.aclose()


async def test_redis_state_expires_once_drained(redis_server: RedisServer) -> None:
    """The bucket key carries a TTL of its drain time, so idle keys leave Redis."""
    client = Redis.from_url(redis_server.url)
    try:
        backend = RedisRateLimiter(client, period_s=60.0, prefix="test:")
        await backend.acquire("k", LimitSpec(rpm=60, tpm=6000), 3000, "")
        ttl_ms = await client.pttl("test:rl:{k}")
        assert 30_000 < ttl_ms <= 31_000 + 1000
    finally:
        await client.aclose()


async def test_redis_uses_its_own_clock_not_the_callers() -> None:
    """Two limiter objects (two replicas) share one budget exactly."""
    with RedisServer() as server:
        one, two = Redis.from_url(server.url), Redis.from_url(server.url)
        try:
            a, b = RedisRateLimiter(one, prefix="x:"), RedisRateLimiter(two, prefix="x:")
            spec = LimitSpec(rpm=4)
            started = time.monotonic()
            results = [await (a if i % 2 else b).acquire("k", spec, 0, "") for i in range(8)]
            assert time.monotonic() - started < 5
            assert sum(v.allowed for v in results) == 4
        finally:
            await one.aclose()
            await two.aclose()


async def test_request_refund_gives_the_request_back(backend: RateLimitBackend) -> None:
    """A release with request_delta -1 frees that request for the next caller at once."""
    spec = LimitSpec(rpm=2, tpm=1000)
    assert (await backend.acquire("k", spec, 400, "")).allowed
    assert (await backend.acquire("k", spec, 400, "")).allowed
    assert (await backend.acquire("k", spec, 1, "")).exceeded is Limit.REQUESTS
    await backend.release("k", spec, -400, "", request_delta=-1)
    again = await backend.acquire("k", spec, 400, "")
    assert again.allowed
    assert again.requests is not None
    assert again.requests.remaining == 0


async def test_request_refund_never_goes_below_empty(backend: RateLimitBackend) -> None:
    """Refunding more requests than were taken leaves the bucket empty, not negative."""
    spec = LimitSpec(rpm=2)
    assert (await backend.acquire("k", spec, 0, "")).allowed
    await backend.release("k", spec, 0, "", request_delta=-5)
    for _ in range(2):
        assert (await backend.acquire("k", spec, 0, "")).allowed
    assert (await backend.acquire("k", spec, 0, "")).exceeded is Limit.REQUESTS
