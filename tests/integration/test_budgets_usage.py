"""Compute budgets across three gateways on one Redis, and /admin/usage with savings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
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
ADMIN = "budget-test-admin-token-00000000000"
BUDGET = 1.0  # cost units a day
# 100 prompt-estimate tokens + 100 completion tokens on precise at 1 per 1k: 0.2 reserved each
BODY = {
    "model": "precise",
    "max_tokens": 100,
    "ignore_eos": True,
    "messages": [{"role": "user", "content": "x" * 396}],
}


async def new_key(url: str, **policy: Unpack[KeyPolicyFields]) -> tuple[str, str]:
    """A key in the shared Redis store; (key id, token)."""
    client = Redis.from_url(url)
    try:
        record, token = await create_key(
            RedisKeyStore(client), "acme", KeyPolicy(**policy), now=time.time()
        )
    finally:
        await client.aclose()
    return record.key_id, token


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[RedisServer, list[GatewayProcess]]]:
    """One redis-server, one simulator for both tiers, three gateways."""
    with (
        RedisServer() as redis,
        SimulatorProcess(
            "--profile", "fast", "--model", "tiergate-sim", "--latency-scale", "1"
        ) as sim,
    ):
        asyncio.run(new_key(redis.url))
        tiers = tiers_config([sim.url], [sim.url])
        for tier in tiers.values():
            tier["model"] = "tiergate-sim"
        config = {
            "auth": {"store": "redis", "admin_token": ADMIN},
            "ratelimit": {"backend": "redis"},
            "redis": {"url": redis.url},
            "tiers": tiers,
            "telemetry": {"access_log": False},
        }
        procs = [GatewayProcess(config) for _ in range(3)]
        try:
            with ThreadPoolExecutor(3) as pool:
                list(pool.map(GatewayProcess.start, procs))
            yield redis, procs
        finally:
            for proc in procs:
                proc.stop()


async def burst(gateways: list[GatewayProcess], token: str, n: int) -> list[httpx.Response]:
    """``n`` concurrent requests spread over the gateways."""
    async with httpx.AsyncClient(timeout=30) as client:
        calls = [
            client.post(
                gateways[i % len(gateways)].url + "/v1/chat/completions",
                json=BODY,
                headers={"Authorization": f"Bearer {token}"},
            )
            for i in range(n)
        ]
        return list(await asyncio.gather(*calls))


async def spent(url: str, key_id: str) -> float:
    """Today's charged cost of ``key_id`` as Redis holds it."""
    client = Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(f"*budget:{{{key_id}}}:d:*")]
        values = [float(await client.get(k) or 0) for k in keys]
    finally:
        await client.aclose()
    return sum(values)


def test_a_budget_holds_across_three_gateways(
    stack: tuple[RedisServer, list[GatewayProcess]],
) -> None:
    """30 concurrent requests worth 0.2 each on a budget of 1: at most 5 pass, the rest 429."""
    redis, gateways = stack
    key_id, token = asyncio.run(new_key(redis.url, budget_daily=BUDGET))
    responses = asyncio.run(burst(gateways, token, 30))
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == 30
    assert 1 <= len(ok) <= 5
    assert all(r.json()["error"]["code"] == "insufficient_quota" for r in refused)
    assert all(int(r.headers["Retry-After"]) > 0 for r in refused)
    assert "budget" in refused[0].json()["error"]["message"]
    time.sleep(0.3)  # settlements run after the answers
    assert asyncio.run(spent(redis.url, key_id)) <= BUDGET + 1e-9


def test_admin_usage_shows_cost_and_savings_from_every_gateway(
    stack: tuple[RedisServer, list[GatewayProcess]],
) -> None:
    """Fast and precise traffic through all three gateways is summed on any of them."""
    redis, gateways = stack
    key_id, token = asyncio.run(new_key(redis.url))
    headers = {"Authorization": f"Bearer {token}"}
    for i, gateway in enumerate(gateways * 2):
        body = {**BODY, "model": "fast" if i % 2 else "precise"}
        assert (
            httpx.post(
                gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
            ).status_code
            == 200
        )
    time.sleep(1.5)  # usage is flushed to Redis once a second
    resp = httpx.get(
        gateways[0].url + "/admin/usage?window=1h&by=key",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert resp.status_code == 200
    rows = [row for row in resp.json()["rows"] if row["key_id"] == key_id]
    by_tier = {row["tier"]: row for row in rows}
    assert by_tier["fast"]["requests"] == 3
    assert by_tier["precise"]["requests"] == 3
    assert by_tier["precise"]["savings"] == 0
    assert by_tier["fast"]["savings"] == pytest.approx(by_tier["fast"]["baseline_cost"] * 0.75)
    bad = httpx.get(
        gateways[1].url + "/admin/usage?window=3y", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "window"
