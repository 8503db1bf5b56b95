"""redis-server killed mid-run and restarted under two gateways: fail-open and fail-closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import suppress

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import KeyRecord, create_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
RPM = 6
BODY = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    """The shared redis-server this module kills and restarts."""
    with RedisServer() as server:
        yield server


async def store_op(
    url: str, record: KeyRecord | None = None, *, rpm: int = 1
) -> tuple[KeyRecord, str]:
    """Create a key (or put ``record`` back, as a persistent Redis would keep it)."""
    client = Redis.from_url(url)
    try:
        store = RedisKeyStore(client)
        if record is not None:
            await store.put(record)
            return record, ""
        return await create_key(store, "outage", KeyPolicy(rpm=rpm), now=time.time())
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def keys(redis: RedisServer) -> dict[str, tuple[KeyRecord, str]]:
    """A limited key and a practically unlimited one, stored before the gateways start."""
    return {
        "limited": asyncio.run(store_op(redis.url, rpm=RPM)),
        "busy": asyncio.run(store_op(redis.url, rpm=1_000_000)),
    }


def gateway_config(redis: RedisServer, sim: SimulatorProcess, policy: str) -> dict[str, object]:
    """Redis keys and limits with ``policy`` on Redis errors and a fast recovery probe."""
    return {
        "auth": {"store": "redis", "cache_ttl_s": 1},
        "ratelimit": {"backend": "redis", "on_redis_error": policy, "redis_retry_interval_s": 0.2},
        "redis": {"url": redis.url},
        "tiers": tiers_config([sim.url], ["http://127.0.0.1:9"]),
        # This module is about Redis: on a loaded CI host a probe of the one fast replica must
        # not time out (0.5 s by default) and mark it down, which answers 503 to everyone.
        "health": {"timeout_s": 3.0},
        "telemetry": {"access_log": False},
    }


@pytest.fixture(scope="module")
def pair(
    redis: RedisServer, fast_sim: SimulatorProcess, keys: dict[str, tuple[KeyRecord, str]]
) -> Iterator[dict[str, GatewayProcess]]:
    """One fail-open and one fail-closed gateway on the same Redis."""
    with (
        GatewayProcess(gateway_config(redis, fast_sim, "open")) as open_gw,
        GatewayProcess(gateway_config(redis, fast_sim, "closed")) as closed_gw,
    ):
        yield {"open": open_gw, "closed": closed_gw}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def call(http: httpx.AsyncClient, gateway: GatewayProcess, key: str) -> httpx.Response:
    """One chat request."""
    return await http.post(
        gateway.url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
    )


async def background_load(
    http: httpx.AsyncClient,
    gateways: list[GatewayProcess],
    key: str,
    statuses: dict[str, list[int]],
    stop: asyncio.Event,
    *,
    errors: dict[str, list[str]],
) -> None:
    """Keep requests flowing to every gateway until ``stop``; record every status, and in
    ``errors`` every refusal's body."""
    while not stop.is_set():
        for gateway in gateways:
            response = await call(http, gateway, key)
            statuses[gateway.url].append(response.status_code)
            if response.status_code != 200:
                errors[gateway.url].append(f"{time.monotonic():.2f} {response.text[:300]}")
        await asyncio.sleep(0.01)


async def test_outage_policies_hold_and_limits_return(
    redis: RedisServer,
    pair: dict[str, GatewayProcess],
    keys: dict[str, tuple[KeyRecord, str]],
    http: httpx.AsyncClient,
) -> None:
    """Open serves with local limits, closed answers 503; after restart Redis limits again."""
    open_gw, closed_gw = pair["open"], pair["closed"]
    limited_record, limited = keys["limited"]
    busy_record, busy = keys["busy"]
    for gateway in (open_gw, closed_gw):  # warm each replica's key cache
        for key in (busy, limited):
            warm = await call(http, gateway, key)
            assert warm.status_code == 200, (warm.text, gateway.log_text()[-3000:])
    statuses: dict[str, list[int]] = {open_gw.url: [], closed_gw.url: []}
    errors: dict[str, list[str]] = {open_gw.url: [], closed_gw.url: []}
    stop = asyncio.Event()
    load = asyncio.create_task(
        background_load(http, [open_gw, closed_gw], busy, statuses, stop, errors=errors)
    )
    try:
        await asyncio.sleep(0.3)
        redis.kill()
        errors[open_gw.url].append(f"{time.monotonic():.2f} redis killed")
        await asyncio.sleep(0.5)

        local = [(await call(http, open_gw, limited)).status_code for _ in range(RPM + 2)]
        assert local == [200] * RPM + [429] * 2  # the per-replica limiter still limits
        closed = await call(http, closed_gw, limited)
        assert closed.status_code == 503
        assert closed.json()["error"]["code"] == "ratelimit_unavailable"
        assert int(closed.headers["retry-after"]) >= 1

        # Restarted empty, the keys are really gone until restored (401 is then right): pause
        # the load while restoring what a persistent Redis would have kept.
        stop.set()
        await load
        redis.start()
        await store_op(redis.url, limited_record)
        await store_op(redis.url, busy_record)
        stop = asyncio.Event()
        load = asyncio.create_task(
            background_load(http, [open_gw, closed_gw], busy, statuses, stop, errors=errors)
        )
        await asyncio.sleep(0.6)
    finally:
        stop.set()
        await load

    shared = [
        (await call(http, gw, limited)).status_code for gw in (open_gw, closed_gw) * (RPM // 2 + 1)
    ]
    assert shared.count(200) == RPM  # one exact budget across both replicas again
    assert shared.count(429) == 2

    assert set(statuses[open_gw.url]) == {200}, (
        "fail-open must keep serving",
        errors[open_gw.url],
        open_gw.log_text()[-4000:],
    )
    assert set(statuses[closed_gw.url]) <= {200, 503}
    assert 503 in statuses[closed_gw.url]
    for gateway in (open_gw, closed_gw):
        log = gateway.log_text()
        assert log.count("ratelimit.redis_unavailable") == 1, log
        assert log.count("ratelimit.redis_recovered") == 1, log
        assert "Traceback" not in log
        with suppress(httpx.HTTPError):
            assert (await http.get(gateway.url + "/livez")).status_code == 200


async def _logged(gateway: GatewayProcess, event: str, within: float) -> None:
    """Until ``event`` is in the gateway's log."""
    deadline = time.monotonic() + patience(within)
    while event not in gateway.log_text():
        assert time.monotonic() < deadline, gateway.log_text()[-3000:]
        await asyncio.sleep(0.05)


async def test_a_key_changed_as_redis_returns_is_read_from_the_store(
    fast_sim: SimulatorProcess, http: httpx.AsyncClient
) -> None:
    """Redis back after an outage while key lookups still back off (one try per
    ``redis_retry_interval_s``): a key changed then (its id published, so the replica drops
    its cached record) is read from Redis, which the publish shows to answer; it was refused
    with 503 ``auth_unavailable`` until the next try (fail-open included)."""
    retry_s = 6.0
    with RedisServer() as redis:
        record, key = await store_op(redis.url, rpm=1_000_000)
        config = gateway_config(redis, fast_sim, "open")
        config["ratelimit"] = {**config["ratelimit"], "redis_retry_interval_s": retry_s}  # type: ignore[dict-item]
        with GatewayProcess(config) as gw:
            assert (await call(http, gw, key)).status_code == 200
            redis.kill()
            await _logged(gw, "auth.key_feed_unavailable", 10)  # the feed retries in retry_s
            await asyncio.sleep(2.5)  # the cached record is stale after a second
            assert (await call(http, gw, key)).status_code == 200  # from the stale record
            failed = time.monotonic()  # its lookup failed: the next one in retry_s
            redis.start()
            await _logged(gw, "auth.key_feed_subscribed", 2 * retry_s)
            await store_op(redis.url, record)  # the key changes: its id is published
            statuses = []
            for _ in range(5):
                response = await call(http, gw, key)
                statuses.append((response.status_code, response.text[:200]))
                await asyncio.sleep(0.1)
            assert time.monotonic() - failed < retry_s  # still before the lookups' next try
            assert [status for status, _ in statuses] == [200] * 5, statuses
