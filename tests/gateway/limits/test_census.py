"""Gateway processes count each other in Redis; the degraded local share follows the count."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway.limits.census import LocalShare, ReplicaCensus
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


async def test_processes_count_each_other_and_leave(redis_server: RedisServer) -> None:
    """Three beat: each reads 3; one leaves (counted out at once), one goes silent (counted
    out once its beat expires)."""
    client = Redis.from_url(redis_server.url)
    census = [ReplicaCensus(client, "t:") for _ in range(2)]
    silent = ReplicaCensus(client, "t:", ttl_s=0.3)
    try:
        assert [await one.beat() for one in (*census, silent)] == [1, 2, 3]
        assert await census[0].beat() == 3
        await census[1].stop()
        assert await census[0].beat() == 2
        await asyncio.sleep(0.5)  # the silent one's last beat expires
        assert await census[0].beat() == 1
        assert census[0].count == 1
    finally:
        await client.aclose()


async def test_a_started_census_beats_in_the_background(redis_server: RedisServer) -> None:
    """start() beats at once and then every interval; stop() leaves the set."""
    client = Redis.from_url(redis_server.url)
    census = ReplicaCensus(client, "t:", interval_s=0.05)
    try:
        await census.start()
        assert census.count == 1
        await asyncio.sleep(0.2)
        assert await client.zcard("t:census") == 1
        await census.stop()
        assert await client.zcard("t:census") == 0
    finally:
        await client.aclose()


async def test_the_last_count_stands_while_redis_is_down() -> None:
    """No Redis: a beat fails and the count read before stays."""
    client = Redis.from_url("redis://127.0.0.1:9/0", socket_connect_timeout=0.2)
    census = ReplicaCensus(client, "t:")
    census.count = 4
    assert await census.beat() is None
    assert census.count == 4
    await client.aclose()


def test_the_setting_overrides_the_count() -> None:
    """degraded_replicas set: replicas times workers, whatever the census says."""
    census = ReplicaCensus(Redis(), "t:")
    census.count = 7
    assert LocalShare(census, None, 2)() == 7
    assert LocalShare(census, 3, 2)() == 6
    assert LocalShare(None, None, 2)() == 2


async def test_the_defaults_are_a_beat_a_second_and_five_seconds_to_expire(
    redis_server: RedisServer,
) -> None:
    """docs/access.md: a beat a second; a member the census no longer hears from is gone 5 s
    after its last beat (its score is Redis' clock + 5 s)."""
    client = Redis.from_url(redis_server.url)
    census = ReplicaCensus(client, "t:")
    try:
        assert census.interval_s == 1.0
        await census.beat()
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros // 1000
        expires_ms = await client.zscore("t:census", census.member)
        assert expires_ms is not None
        assert 4_900 <= expires_ms - now_ms <= 5_000
    finally:
        await client.aclose()
