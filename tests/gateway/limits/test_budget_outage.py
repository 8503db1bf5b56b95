"""gateway/limits/budget_outage.py against a real Redis: what was spent during an outage is
written to Redis once, even when the request paying it back is cancelled (its client left)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from redis.asyncio import Redis

from gateway.config.redis_client import BackendHealth
from gateway.limits.budget_outage import FailOpenBudgetStore
from gateway.limits.budget_stores import RedisBudgetStore, Windows
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
NOON = 1_796_126_400.0  # 2026-12-01 12:00 UTC


async def _until(done: Callable[[], bool], within_s: float) -> None:
    """Poll ``done`` every 20 ms for at most ``within_s``."""
    for _ in range(int(within_s / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)


async def _day_spend(client: Redis, windows: Windows) -> float:
    return float(await client.get(f"t:budget:{{k1}}:d:{windows.day}") or 0)


async def test_a_settlement_cancelled_while_paying_back_counts_everything_once(
    redis_server: RedisServer,
) -> None:
    """1.0 was spent during an outage (owed to Redis). The next settlement (0.25) pays it back
    first, and its request is cancelled (the client left) once the payback is written, before
    Redis answers. Redis ran the payback; a later settlement (0.5) must not pay it again, and
    the cancelled settlement's own 0.25 still counts: 1.75 in all. (Before: the payback stayed
    owed and was paid twice, and the 0.25 was dropped: 2.5.)"""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up")
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    try:
        health.failed("ConnectionError")  # the outage: this settlement is owed
        await store.adjust("k1", windows, 1.0)
        health.succeeded()
        await store.remote.charged("k2", 1)  # the pipelined connection is open
        await asyncio.sleep(0.01)

        settling = asyncio.create_task(store.adjust("k1", windows, 0.25, lazy=False))
        await asyncio.sleep(0)  # its first step wrote the payback; Redis has not answered yet
        settling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await settling

        await store.adjust("k1", windows, 0.5, lazy=False)
        assert await _day_spend(client, windows) == 1.75
        assert not store.owed
        assert not store.unsure
    finally:
        await store.aclose()
        await client.aclose()


async def test_what_an_idle_process_owes_reaches_redis_once_it_answers(
    redis_server: RedisServer,
) -> None:
    """0.75 spent during an outage, then no more requests in this process: once Redis answers
    again the debt is paid within a few probe intervals all the same (before: only the next
    budgeted request of this process paid it, so the fleet's other processes saw the key
    0.75 short for as long as this one was idle, and could spend it twice)."""
    client = Redis.from_url(redis_server.url)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=0.05)
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    store.start()
    try:
        health.failed("ConnectionError")  # the outage
        await store.adjust("k1", windows, 0.75)
        assert store.owed
        await _until(lambda: not store.owed, within_s=5.0)
        assert await _day_spend(client, windows) == 0.75
        assert not store.owed
        assert not store.unsure
        assert health.healthy
    finally:
        await store.aclose()
        await client.aclose()


async def test_the_payback_loop_keeps_trying_while_redis_is_down_and_stops_on_close(
    redis_server: RedisServer,
) -> None:
    """Redis down: the loop's probes fail, the debt stays owed (nothing lost, no traceback);
    Redis back: paid; ``aclose`` ends the loop."""
    client = Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    health = BackendHealth("redis", down_event="down", up_event="up", retry_interval_s=0.05)
    store = FailOpenBudgetStore(RedisBudgetStore(client, "t:"), health, share=lambda: 1)
    windows = Windows.at(NOON)
    store.start()
    try:
        redis_server.kill()
        health.failed("ConnectionError")
        await store.adjust("k1", windows, 0.5)
        await asyncio.sleep(0.3)  # several probes, each refused
        # Owed, or sent by a failed probe and unsure (Redis' marks will say): kept either way.
        kept = sum(d for d, _ in store.owed.values()) + sum(u[2] for u in store.unsure)
        assert kept == 0.5
        assert not health.healthy
        redis_server.start()
        await _until(lambda: not (store.owed or store.unsure), within_s=10.0)
        assert await _day_spend(client, windows) == 0.5
    finally:
        await store.aclose()
        await client.aclose()
    assert store._repayer is None
