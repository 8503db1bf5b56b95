"""Attacks on cost control and spill across tiers (issues 34 and 36 item 3).

A backend that lies in its ``/metrics`` or ``/load`` (NaN, infinite, negative, huge), a
tenant name or a dial value an operator should not be able to set: the gateway keeps
probing, routes on finite numbers, and refuses what it cannot honour. A real HTTP server on
loopback plays the lying backend; the health monitor reads it over a real socket.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from gateway.upstream.health import HealthConfig, HealthMonitor
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import Replica, ReplicaPool
from gateway.upstream.signals import replica_wait_s

Page = Callable[[], str]


async def _liar(page: Page, load: bytes) -> AsyncIterator[str]:
    """A vLLM look-alike on loopback whose ``/metrics`` is ``page()`` and ``/load`` is ``load``."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page())

    async def load_route(_: web.Request) -> web.Response:
        return web.Response(body=load, content_type="application/json")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/load", load_route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamPool]:
    """The gateway's upstream client, for the monitor."""
    pool = UpstreamPool()
    try:
        yield pool
    finally:
        await pool.close()


async def _probe(url: str, client: UpstreamPool, rounds: int = 2) -> Replica:
    pool = ReplicaPool("fast", [url], 8, 0.1, kind="vllm")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0, metrics_every=1))
    monitor.client = client
    for _ in range(rounds):
        await monitor.check_once()
    return pool.replicas[0]


LIES = {
    "infinite waiting": "vllm:num_requests_running 2\nvllm:num_requests_waiting +Inf\n",
    "infinite running": (
        'vllm:num_requests_running +Inf\nvllm:num_requests_waiting_by_reason{reason="capacity"} 3\n'
    ),
    "NaN everywhere": "vllm:num_requests_running NaN\nvllm:num_requests_waiting NaN\n",
    "negative": "vllm:num_requests_running -5\nvllm:num_requests_waiting -1e300\n",
    "sum overflows": (
        "vllm:num_requests_running 1\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity",engine="0"} 1e308\n'
        'vllm:num_requests_waiting_by_reason{reason="capacity",engine="1"} 1e308\n'
    ),
}


@pytest.mark.parametrize("lie", LIES, ids=list(LIES))
async def test_lying_metrics_leave_finite_numbers(lie: str, client: UpstreamPool) -> None:
    """Whatever a backend's ``/metrics`` says, the round completes (the replica is checked
    and healthy: it answered /health), its slot count is a whole number within the tier's
    ``max_concurrency`` and its estimated wait is a number, not NaN."""
    async for url in _liar(lambda: LIES[lie], b'{"server_load": 0}'):
        replica = await _probe(url, client)
        assert replica.checked
        assert replica.healthy
        assert 0 <= replica.slots <= 8
        assert math.isfinite(replica.running)
        assert math.isfinite(replica.waiting)
        assert not math.isnan(replica_wait_s(replica, 1.0))
