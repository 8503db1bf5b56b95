"""Slot renewal at scale: a process holding slots of thousands of keys keeps every lease alive,
also with Redis a few milliseconds away (real redis-server behind a delaying TCP proxy)."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from gateway.limits.limiter_redis import RENEW_BATCH, RedisRateLimiter
from policies.ratelimit import LimitSpec
from tests.gateway.limits.test_usage_store import _Proxy
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

KEYS = 1000
DELAY_S = 0.005  # each write on its way to Redis: a 5 ms network
LEASE_S = 2.0  # renewed every third of it


class _Delayer(_Proxy):
    """Every write from the client reaches Redis ``delay_s`` late (in order, one at a time,
    like a slow link): a command waited for before the next costs that much each."""

    def __init__(self, redis_port: int, delay_s: float) -> None:
        super().__init__(redis_port)
        self.delay_s = delay_s

    async def pass_up(self, data: bytes, seen: set[str]) -> bool:
        await asyncio.sleep(self.delay_s)
        return True


async def _live_slots(admin: Redis, prefix: str, keys: range = range(KEYS)) -> int:
    """Keys (of ``keys``) whose slot's lease has not run out on Redis' clock."""
    seconds, micros = await admin.time()
    now = seconds * 1_000_000 + micros
    async with admin.pipeline(transaction=False) as pipe:
        for i in keys:
            pipe.zcount(f"{prefix}rl:{{k{i}}}:c", now, "+inf")
        return sum(await pipe.execute())


async def test_a_thousand_keys_keep_their_slots_across_leases(redis_server: RedisServer) -> None:
    """1,000 keys each hold a slot, Redis 5 ms away, leases of 2 s renewed every 0.67 s: after
    1.5 leases every slot is still leased. Renewing one key at a time (a round trip each)
    took over 5 s a round, so most slots ran out while their requests still ran."""
    proxy = _Delayer(redis_server.port, DELAY_S)
    client = Redis.from_url(await proxy.start())
    admin = Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(client, prefix="rs:", lease_s=LEASE_S, max_hold_s=600.0)
    spec = LimitSpec(concurrency=1)
    try:
        verdicts = await asyncio.gather(
            *(limiter.acquire(f"k{i}", spec, 0, f"s{i}") for i in range(KEYS))
        )
        assert all(v.allowed for v in verdicts)
        taken = time.monotonic()
        assert await _live_slots(admin, "rs:") == KEYS
        await asyncio.sleep(LEASE_S * 1.5 - (time.monotonic() - taken))  # past the first lease
        assert await _live_slots(admin, "rs:") == KEYS, "slots ran out while held"
    finally:
        await limiter.aclose()
        await client.aclose()
        await admin.aclose()
        await proxy.stop()


async def test_one_key_redis_refuses_does_not_stop_the_other_keys_renewal(
    redis_server: RedisServer,
) -> None:
    """Three batches of keys hold a slot each; the first key's slot set is then something
    else in Redis (``WRONGTYPE``: Redis answers, and refuses that key's script alone). Every
    other key's slot is still leased 1.5 leases later. A refusal was taken for Redis not
    answering: the round stopped after the first batch, every round, so the keys of the
    later batches lost their slots while their requests still ran."""
    count = 2 * RENEW_BATCH + 10
    client = Redis.from_url(redis_server.url)
    admin = Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(client, prefix="rw:", lease_s=1.0, max_hold_s=600.0)
    spec = LimitSpec(concurrency=1)
    try:
        verdicts = await asyncio.gather(
            *(limiter.acquire(f"k{i}", spec, 0, f"s{i}") for i in range(count))
        )
        assert all(v.allowed for v in verdicts)
        taken = time.monotonic()
        await admin.delete("rw:rl:{k0}:c")
        await admin.set("rw:rl:{k0}:c", "not a sorted set")
        await asyncio.sleep(1.5 - (time.monotonic() - taken))  # past the first lease
        others = range(1, count)
        assert await _live_slots(admin, "rw:", others) == len(others), "slots ran out while held"
    finally:
        await limiter.aclose()
        await client.aclose()
        await admin.aclose()


async def test_renewal_over_a_capped_connection_pool_renews_every_key(
    redis_server: RedisServer,
) -> None:
    """A client redis-py itself runs scripts for (RESP3 here; TLS alike) whose URL caps its
    pool at 8 connections: 300 keys hold a slot each, and every slot is still leased 1.5
    leases later. A batch asked for 128 connections at once; redis-py refused all but 8
    ("Too many connections"), which ended the round: most keys' slots ran out while their
    requests still ran (one at a time, as before the batches, one connection sufficed)."""
    count = 300
    client = Redis.from_url(redis_server.url + "?protocol=3&max_connections=8")
    admin = Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(client, prefix="rp:", lease_s=1.0, max_hold_s=600.0)
    spec = LimitSpec(concurrency=1)
    try:
        for i in range(count):  # one at a time: the pool's cap is the renewal's to meet
            assert (await limiter.acquire(f"k{i}", spec, 0, f"s{i}")).allowed
        taken = time.monotonic()
        await asyncio.sleep(1.5 - (time.monotonic() - taken))  # past the first lease
        assert await _live_slots(admin, "rp:", range(count)) == count, "slots ran out while held"
    finally:
        await limiter.aclose()
        await client.aclose()
        await admin.aclose()
