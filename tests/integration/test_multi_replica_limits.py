"""Three gateways share one real redis-server: a key's limits hold exactly overall.

One gateway runs a single process and two run ``--workers 2``, so every burst spreads over
five server processes of both kinds at once: a limit counted per process, per worker or per
replica anywhere would let more than its share through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Unpack

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.key_fields import KeyPolicyFields
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
WORKERS = (1, 2, 2)  # per replica
REPLICAS = len(WORKERS)
N = 10
# Every request carries the same body, so every request reserves the same tokens.
MAX_TOKENS = 100
BODY = {
    "model": "fast",
    "messages": [{"role": "user", "content": "Count to three."}],
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    """The one shared redis-server."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimulatorProcess]:
    """A fast-tier simulator with real latency (about a second per answer)."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "2.5"
    ) as sim:
        yield sim


async def new_key(redis_url: str, **policy: Unpack[KeyPolicyFields]) -> str:
    """Create a key in the shared Redis key store (as `tiergate keys create` would)."""
    client = Redis.from_url(redis_url)
    try:
        _, token = await create_key(
            RedisKeyStore(client), "bench", KeyPolicy(**policy), now=time.time()
        )
    finally:
        await client.aclose()
    return token


@pytest.fixture(scope="module")
def gateways(redis: RedisServer, slow_sim: SimulatorProcess) -> Iterator[list[GatewayProcess]]:
    """Three gateways (one of one process, two of two workers) with Redis keys and limits,
    started together."""
    asyncio.run(new_key(redis.url))  # a key must exist before a gateway will start
    config = {
        "auth": {"store": "redis", "cache_ttl_s": 5},
        "ratelimit": {"backend": "redis"},
        "redis": {"url": redis.url},
        "tiers": tiers_config([slow_sim.url], ["http://127.0.0.1:9"]),
        "telemetry": {"access_log": False},
    }
    # Seven processes starting at once on a shared 2-core machine: give them time.
    procs = [GatewayProcess(config, workers=count, ready_timeout=90) for count in WORKERS]
    try:
        with ThreadPoolExecutor(REPLICAS) as pool:
            list(pool.map(GatewayProcess.start, procs))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client with room for every concurrent request."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        yield client


async def burst(
    http: httpx.AsyncClient, gateways: list[GatewayProcess], key: str, count: int
) -> list[httpx.Response]:
    """``count`` simultaneous requests spread round-robin over the gateways."""
    headers = {"Authorization": f"Bearer {key}"}
    return await asyncio.gather(
        *(
            http.post(
                gateways[i % len(gateways)].url + "/v1/chat/completions", json=BODY, headers=headers
            )
            for i in range(count)
        )
    )


def check_split(responses: list[httpx.Response], allowed: int) -> None:
    """Exactly ``allowed`` answers are 200; all the others are 429 with Retry-After."""
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == allowed, statuses
    assert statuses.count(429) == len(responses) - allowed, statuses
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
        else:
            assert "x-ratelimit-remaining-requests" in response.headers or (
                "x-ratelimit-remaining-tokens" in response.headers
            )


async def test_requests_per_minute_are_exact_across_replicas(
    redis: RedisServer, gateways: list[GatewayProcess], http: httpx.AsyncClient
) -> None:
    """rpm N, 3N concurrent requests over three replicas: exactly N succeed, 2N get 429."""
    key = await new_key(redis.url, rpm=N)
    check_split(await burst(http, gateways, key, REPLICAS * N), N)


async def test_tokens_per_minute_are_exact_across_replicas(
    redis: RedisServer, gateways: list[GatewayProcess], http: httpx.AsyncClient
) -> None:
    """tpm fits N reservations, 3N concurrent requests: exactly N succeed, 2N get 429."""
    probe_key = await new_key(redis.url, tpm=10_000_000)
    (probe,) = await burst(http, gateways[:1], probe_key, 1)
    reserve = 10_000_000 - int(probe.headers["x-ratelimit-remaining-tokens"])
    assert reserve > MAX_TOKENS
    key = await new_key(redis.url, tpm=N * reserve)
    responses = await burst(http, gateways, key, REPLICAS * N)
    check_split(responses, N)
    rejected = next(r for r in responses if r.status_code == 429)
    assert "tokens per minute" in rejected.json()["error"]["message"]


async def test_concurrency_is_exact_across_replicas(
    redis: RedisServer, gateways: list[GatewayProcess], http: httpx.AsyncClient
) -> None:
    """max_concurrency 3, 3N simultaneous requests (each about a second long) over three
    replicas: exactly 3 run, the rest get 429 at once; then the slots are all free again."""
    key = await new_key(redis.url, max_concurrency=3)
    responses = await burst(http, gateways, key, REPLICAS * N)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 3, statuses
    assert statuses.count(429) == REPLICAS * N - 3, statuses
    assert all(
        "concurren" in r.json()["error"]["message"] for r in responses if r.status_code == 429
    )
    again = await burst(http, gateways, key, 3)
    assert [r.status_code for r in again] == [200, 200, 200]
