"""gateway/routing/dial_sync.py: the live dial's stores (file, real Redis) and the follow loop."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.routing.dial_sync import (
    DialStore,
    DialSync,
    FileDialStore,
    MemoryDialStore,
    RedisDialStore,
)
from policies.dial import DialTargets, View
from tests.redis_server import RedisServer


class _Worker:
    """One worker's dial: the targets applied, the reloads done, its view and the fleet's."""

    def __init__(self, store: DialStore, view: dict[str, View] | None = None) -> None:
        self.applied: list[DialTargets] = []
        self.targets = DialTargets(0.3)
        self.reloads = 0
        self.view = view or {}
        self.fleet: dict[str, float] = {}
        self.sync = DialSync(store, self, self.reload, configured=0.3, interval_s=0.05)

    def apply(self, targets: DialTargets) -> list[str]:
        self.applied.append(targets)
        self.targets = targets
        return []

    def local_view(self) -> dict[str, View]:
        return self.view

    def set_fleet(self, thresholds: Mapping[str, float]) -> None:
        self.fleet = dict(thresholds)

    async def reload(self) -> None:
        self.reloads += 1


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for this module."""
    with RedisServer() as server:
        yield server


async def _two_workers(make: object) -> None:
    """A change on one worker reaches the other within a few intervals, and both settle on one
    threshold per tenant (their views weighted by scores; "solo" aims at the old target, so
    it does not count); a reload counted by one is followed by the other only; a cleared
    tenant target falls back to the default."""
    assert callable(make)
    first = _Worker(make(), {"acme": View(0.4, 1000, 0.5), "solo": View(0.7, 500, 0.3)})
    second = _Worker(make(), {"acme": View(0.6, 3000, 0.5)})
    await first.sync.startup()
    await second.sync.startup()
    try:
        await first.sync.set_target(None, 0.2, actor="test")
        await first.sync.set_target("acme", 0.5, actor="test")
        await asyncio.sleep(0.3)
        latest = second.applied[-1]
        assert (latest.default, dict(latest.tenants)) == (0.2, {"acme": 0.5})
        # one threshold per tenant on both workers: weighted by scores, own tenants only
        assert first.fleet == pytest.approx({"acme": 0.55})
        assert second.fleet == pytest.approx({"acme": 0.55})
        await first.sync.reloaded()
        await asyncio.sleep(0.3)
        assert (first.reloads, second.reloads) == (0, 1)
        await second.sync.set_target("acme", None, actor="test")
        await asyncio.sleep(0.3)
        assert first.applied[-1].target_for("acme") == 0.2
    finally:
        await first.sync.shutdown()
        await second.sync.shutdown()


def test_workers_share_the_dial_through_a_file(tmp_path: Path) -> None:
    """Two workers of one gateway without Redis: the shared directory's dial.json."""
    asyncio.run(_two_workers(lambda: FileDialStore(tmp_path)))
    assert (tmp_path / "dial.json").exists()


def test_replicas_share_the_dial_through_redis(redis_server: RedisServer) -> None:
    """Two replicas with one Redis; the targets outlive them (a third starts with them)."""

    async def run() -> None:
        clients = [Redis.from_url(redis_server.url) for _ in range(3)]
        made = iter(clients)
        try:
            await _two_workers(lambda: RedisDialStore(next(made), "tg:"))
            late = _Worker(RedisDialStore(clients[2], "tg:"))
            await late.sync.startup()
            await late.sync.shutdown()
            assert late.applied[-1].default == 0.2
            assert late.reloads == 0  # the reload happened before it started
        finally:
            for client in clients:
                await client.aclose()

    asyncio.run(run())


def test_a_follower_stops_at_any_point_of_its_commands(redis_server: RedisServer) -> None:
    """Shut down 100 times at random points of its Redis commands (a client with a socket
    timeout, so redis-py wraps each send in ``asyncio.wait_for``, which on Python 3.11 can
    lose the cancellation): every shutdown ends within a second. One cancel and an await
    hung here, and once in CI."""

    async def run() -> None:
        client = Redis.from_url(redis_server.url, socket_timeout=5)
        rng = random.Random(5)
        try:
            for _ in range(100):
                worker = _Worker(RedisDialStore(client, "tg:"), {"acme": View(0.4, 1000, 0.5)})
                worker.sync.interval_s = 0.0  # poll without pause: always mid-command
                await worker.sync.startup()
                await asyncio.sleep(rng.random() * 0.003)
                async with asyncio.timeout(1):
                    await worker.sync.shutdown()
                assert asyncio.all_tasks() == {asyncio.current_task()}  # the loop has ended
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_store_outage_keeps_the_targets_and_refuses_changes(redis_server: RedisServer) -> None:
    """With Redis gone, following keeps what was applied and a change raises (the admin call
    answers 503); a memory store needs no sharing."""

    async def run() -> None:
        client = Redis.from_url("redis://127.0.0.1:9/0", socket_timeout=0.2)
        worker = _Worker(RedisDialStore(client, "tg:"))
        await worker.sync.startup()  # unreachable: starts with nothing applied
        with pytest.raises(RedisError):
            await worker.sync.set_target(None, 0.1, actor="test")
        await worker.sync.shutdown()
        await client.aclose()
        memory = _Worker(MemoryDialStore())
        targets = await memory.sync.set_target("t", 0.4, actor="test")
        assert targets.target_for("t") == 0.4
        assert targets.default == 0.3

    asyncio.run(run())
