"""A finished request's concurrency slot is free by the time its caller has the whole answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
N = 3
ROUNDS = 100
BODY = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def new_key(url: str, policy: KeyPolicy) -> str:
    """A key in the shared Redis key store."""
    client = Redis.from_url(url)
    try:
        _, token = await create_key(RedisKeyStore(client), "slots", policy, now=time.time())
    finally:
        await client.aclose()
    return token


@pytest.fixture(scope="module")
def stack(fast_sim: SimulatorProcess) -> Iterator[tuple[RedisServer, list[GatewayProcess]]]:
    """One redis-server and two gateways of two workers each in front of one simulator."""
    with RedisServer() as redis:
        asyncio.run(new_key(redis.url, KeyPolicy()))  # a gateway needs a key to start
        config = {
            "auth": {"store": "redis", "cache_ttl_s": 5},
            "ratelimit": {"backend": "redis"},
            "redis": {"url": redis.url},
            "tiers": tiers_config([fast_sim.url], ["http://127.0.0.1:9"]),
            "telemetry": {"access_log": False},
        }
        procs = [GatewayProcess(config, workers=2, ready_timeout=90) for _ in range(2)]
        try:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(GatewayProcess.start, procs))
            yield redis, procs
        finally:
            for proc in procs:
                proc.stop()


async def rounds(gateways: list[GatewayProcess], token: str, *, stream: bool) -> list[int]:
    """``ROUNDS`` times: N requests at once over both gateways, all answered, then the next N."""
    headers = {"Authorization": f"Bearer {token}"}
    body = {**BODY, "stream": stream}
    statuses: list[int] = []
    # A connection per request (no reuse): each round's requests land on either worker.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(i: int) -> int:
            url = gateways[i % len(gateways)].url + "/v1/chat/completions"
            async with client.stream("POST", url, json=body, headers=headers) as response:
                await response.aread()  # the whole answer, to its last byte
                return response.status_code

        for r in range(ROUNDS):
            statuses += await asyncio.gather(*(one(r + i) for i in range(N)))
    return statuses


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_back_to_back_rounds_never_find_a_slot_taken(
    stack: tuple[RedisServer, list[GatewayProcess]], stream: bool
) -> None:
    """max_concurrency N, 100 rounds of N requests through 2 gateways x 2 workers: no 429."""
    redis, gateways = stack
    token = asyncio.run(new_key(redis.url, KeyPolicy(max_concurrency=N)))
    statuses = asyncio.run(rounds(gateways, token, stream=stream))
    assert len(statuses) == ROUNDS * N
    assert statuses.count(429) == 0, [i for i, s in enumerate(statuses) if s == 429]
    assert set(statuses) == {200}
