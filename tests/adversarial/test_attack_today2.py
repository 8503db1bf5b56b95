"""Attack review of the day's merges: the renewed concurrency slots, the budget floors, the
shutdown flush of the log (real redis-server, real gateway processes)."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from gateway.limits.limiter_redis import RedisRateLimiter
from gateway.limits.redis import ScriptPipeline
from policies.ratelimit import LimitSpec
from tests.processes import patience
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


async def _connection_dropped(client: Redis, limiter: RedisRateLimiter) -> None:
    """Redis closes the limiter's connection (its idle timeout, a failover, ``CLIENT KILL``);
    wait until the limiter has seen it go."""
    runner = limiter._runner
    assert isinstance(runner, ScriptPipeline)
    await client.client_kill_filter(_type="normal", skipme=True)
    deadline = time.monotonic() + patience(2.0)
    while runner._wire is not None and not runner._wire.lost:
        assert time.monotonic() < deadline, "the limiter never saw its connection close"
        await asyncio.sleep(0.01)


async def test_a_slot_released_while_its_renewal_reconnects_stays_free(
    redis_server: RedisServer,
) -> None:
    """A renewal that must open a new connection first, and a release of one of its slots made
    meanwhile: the release was written before the renewal, which put the slot back for a whole
    lease (15 s in a gateway): a key with a concurrency of 1 was locked out that long."""
    client = Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(client, prefix="t2:", lease_s=30.0, max_hold_s=600.0)
    spec = LimitSpec(concurrency=1)
    try:
        assert (await limiter.acquire("k", spec, 0, "done")).allowed
        await _connection_dropped(client, limiter)
        renewal = asyncio.create_task(limiter._renew("k"))  # the renewer's round for the key
        await asyncio.sleep(0)  # it read its slots and waits for the new connection
        await limiter.release("k", spec, 0, "done", lazy=True)  # the request ended
        await renewal
        assert await client.zscore("t2:rl:{k}:c", "done") is None, "released, then renewed"
        assert (await limiter.acquire("k", spec, 0, "next")).allowed
    finally:
        await limiter.aclose()
        await client.aclose()
