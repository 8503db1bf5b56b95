"""Attack review of the day's merges: the renewed concurrency slots, the budget floors, the
shutdown flush of the log (real redis-server, real gateway processes)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import termios
import time
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from gateway.limits.budget_stores import RedisBudgetStore, Windows
from gateway.limits.limiter_redis import RedisRateLimiter
from gateway.limits.redis import ScriptPipeline
from gateway.routing.dial_sync import RedisDialStore
from policies.ratelimit import LimitSpec
from tests.gateway.routing.test_dial_sync import _Worker
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

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


def _pipe_bytes(fd: int) -> int:
    """Bytes written to a pipe and not read yet."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, "little")


def test_sigterm_ends_a_gateway_whose_log_nobody_reads(tmp_path: Path) -> None:
    """The gateway's output is a pipe nobody reads (a stuck log shipper): its log writer
    blocks on a full pipe, holding the sink's lock. SIGTERM must still end the process
    (the shutdown lines are lost, not the shutdown): the flush before uvicorn re-raises the
    signal waited for that lock for ever, so the process never exited."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # full after a few lines
    config = {
        "auth": {"enabled": False},
        "tiers": tiers_config(["http://127.0.0.1:9"], ["http://127.0.0.1:9"]),
        "telemetry": {"log_format": "json", "access_log": True},
    }
    gateway = GatewayProcess(config, output=write_end)
    try:
        gateway.start()
        os.close(write_end)
        write_end = -1
        body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=gateway.url, timeout=5) as client:
            for _ in range(30):  # ~600 bytes of access line each: 18 KB for a 4 KB pipe
                assert client.post("/v1/chat/completions", json=body).status_code == 503
        assert _pipe_bytes(read_end) > 0
        proc = gateway._proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=patience(10))
        except subprocess.TimeoutExpired:
            code = None
        assert code in (0, -signal.SIGTERM), "SIGTERM left the gateway hanging on its log"
    finally:
        gateway.kill()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


async def test_a_lost_spend_is_put_back_whichever_process_charges_first(
    redis_server: RedisServer,
) -> None:
    """Redis restarted empty; the next charge of the key is taken by another gateway process
    than the one that served it (any of N workers or replicas): its floor is 0, so nothing
    was put back, and the process that knew the spend found the window present and put
    nothing back either. A budget of 1.0 let 0.9 + 0.4 + 0.5 = 1.8 through."""
    client = Redis.from_url(redis_server.url)
    served, other = RedisBudgetStore(client, "t2b:"), RedisBudgetStore(client, "t2b:")
    today = Windows.at(time.time())
    try:
        assert (await served.reserve("k", today, 1.0, None, 0.9))[0] is None
        await client.flushall()  # Redis restarted empty
        assert (await other.reserve("k", today, 1.0, None, 0.4))[0] is None  # knew nothing
        refused, spent = await served.reserve("k", today, 1.0, None, 0.5)
        assert refused == "budget_daily", f"1.8 spent of a budget of 1.0 (Redis says {spent})"
        assert 1.3 - 1e-9 <= spent <= 1.3 + 1e-9  # 0.9 put back, and the 0.4 since
    finally:
        await served.aclose()
        await other.aclose()
        await client.aclose()


async def test_the_highest_floor_is_put_back_not_the_first(redis_server: RedisServer) -> None:
    """Two processes saw the key at different times (0.1 early, 0.9 late); Redis lost it and
    the one with the older, lower view charged first: the spend restarted from 0.1 and the
    later view was never counted (0.9 of a budget of 1.0 given again)."""
    client = Redis.from_url(redis_server.url)
    early, late = RedisBudgetStore(client, "t2c:"), RedisBudgetStore(client, "t2c:")
    today = Windows.at(time.time())
    try:
        assert (await early.reserve("k", today, 1.0, None, 0.1))[0] is None
        assert (await late.reserve("k", today, 1.0, None, 0.8))[0] is None  # 0.9 spent
        await client.flushall()
        assert (await early.reserve("k", today, 1.0, None, 0.05))[0] is None  # 0.15 in Redis
        refused, _ = await late.reserve("k", today, 1.0, None, 0.5)
        assert refused == "budget_daily", "1.45 spent of a budget of 1.0"
        assert (await early.reserve("k", today, 1.0, None, 0.04))[0] is None  # 0.99: no
        # process that charged since the loss adds its floor again
    finally:
        await early.aclose()
        await late.aclose()
        await client.aclose()


async def test_a_stale_workers_dial_put_back_does_not_undo_a_newer_one(
    redis_server: RedisServer,
) -> None:
    """A worker that stopped hearing from Redis (its polls failing) still holds the dial of
    version 1; meanwhile a tenant's target was cleared and another set (version 3). Redis then
    restarts empty and the stale worker reaches it first: its version 1 went back in, and the
    up-to-date worker, finding a version behind its own but not 0, took it for a change made
    since and kept it: the cleared target came back on every gateway, the new one was gone."""
    client = Redis.from_url(redis_server.url)
    fresh = _Worker(RedisDialStore(client, "t2d:"))
    stale = _Worker(RedisDialStore(client, "t2d:"))
    try:
        await fresh.sync.set_target("acme", 0.1, actor="test")
        await stale.sync.poll()  # version 1 applied; then its polls fail for a while
        await fresh.sync.set_target("acme", None, actor="test")
        await fresh.sync.set_target("beta", 0.2, actor="test")
        await client.flushall()  # Redis restarted empty
        await stale.sync.poll()  # back first: puts its version 1 back
        await fresh.sync.poll()
        await stale.sync.poll()
        for worker in (fresh, stale):
            assert dict(worker.targets.tenants) == {"beta": 0.2}, "the newer dial was undone"
    finally:
        await client.aclose()


async def test_deleting_a_keys_spend_in_redis_does_not_reset_it(redis_server: RedisServer) -> None:
    """Pinned trade-off (docs/savings.md): an operator who deletes a key's day window in Redis
    to give it its budget back finds it put back by the next charge: a window missing while
    it runs reads as a loss, and the process that saw the spend restores it."""
    client = Redis.from_url(redis_server.url)
    store = RedisBudgetStore(client, "t2e:")
    today = Windows.at(time.time())
    try:
        assert (await store.reserve("k", today, 1.0, None, 0.9))[0] is None
        await client.delete(f"t2e:budget:{{k}}:d:{today.day}", f"t2e:budget:{{k}}:rd:{today.day}")
        refused, spent = await store.reserve("k", today, 1.0, None, 0.5)
        assert (refused, spent) == ("budget_daily", 0.9)
    finally:
        await store.aclose()
        await client.aclose()
