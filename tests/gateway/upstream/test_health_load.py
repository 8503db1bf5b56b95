"""The health monitor's cheaper load reading: vLLM's GET /load between /metrics scrapes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.upstream.health import HealthConfig, HealthMonitor
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.signals import parse_load
from tests.processes import patience
from tests.simulator.procs import SimulatorFactory, start_simulator

__all__ = ["start_simulator"]
LONG = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 150, "ignore_eos": True}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """The test's own client, for the long request that keeps a replica busy."""
    async with aiohttp.ClientSession() as s:
        yield s


def test_parse_load() -> None:
    """Only a non-negative number under server_load is a reading."""
    assert parse_load(b'{"server_load": 3}') == 3.0
    for body in (b"", b"[]", b'{"server_load": -1}', b'{"server_load": true}', b"{}"):
        assert parse_load(body) is None


async def test_load_is_read_between_scrapes_where_tracked(
    start_simulator: SimulatorFactory, session: aiohttp.ClientSession, client: UpstreamPool
) -> None:
    """metrics_every 2: round 0 scrapes /metrics, round 1 reads /load. A tracking replica's
    request in flight shows as server_load 1; a replica answering 0 while the gateway has a
    request there does not track its load and is only scraped from then on."""
    tracked = start_simulator("--latency-scale", "50", "--enable-server-load-tracking")
    untracked = start_simulator("--latency-scale", "0")
    pool = ReplicaPool("fast", [tracked.url, untracked.url], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0, metrics_every=2))
    monitor.client = client
    busy, idle = pool.replicas
    request = asyncio.create_task(session.post(tracked.url + "/v1/chat/completions", json=LONG))
    try:
        await monitor.check_once()  # round 0: /metrics
        assert busy.scraped_at > 0
        assert (busy.server_load, busy.load_tracked) == (None, None)
        idle.in_flight = 1  # the gateway has a request there; its /load will say 0
        deadline = asyncio.get_running_loop().time() + patience(10.0)
        while busy.server_load != 1.0:
            assert asyncio.get_running_loop().time() < deadline, busy.server_load
            await monitor.check_once()  # odd rounds read /load
        assert busy.load_tracked is True
        assert idle.load_tracked is False
        assert idle.server_load is None
    finally:
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
