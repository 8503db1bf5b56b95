"""P6: revocation, rotation and policy changes apply at once here and within 1 s on every replica.

Three real `tiergate serve` processes share one real redis-server with the default cache TTL
(30 s), and two more share one key file with the default reload interval: on the old code a
revoked or rotated key kept its old verdict for up to 30 s, even on the instance that made the
change.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_file import FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.adversarial.keys_stack import (
    ADMIN,
    CHAT,
    bearer,
    keys_cli_here,
    redis_key,
    seconds_until,
    start_all,
    status,
)
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
BOUND_S = 1.0  # the promise: every other replica within a second


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    """The one shared redis-server."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as process:
        yield process


@pytest.fixture(scope="module")
def redis_gateways(redis: RedisServer, sim: SimulatorProcess) -> Iterator[list[GatewayProcess]]:
    """Three gateways on Redis keys, default cache TTLs, an admin API on each."""
    asyncio.run(redis_key(redis.url))  # a usable key must exist before a gateway starts
    config = {
        "auth": {"store": "redis", "admin_token": ADMIN},
        "redis": {"url": redis.url},
        "tiers": tiers_config([sim.url], ["http://127.0.0.1:9"]),
        "telemetry": {"access_log": False},
    }
    procs = start_all([GatewayProcess(config) for _ in range(3)])
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key file with one bootstrap key."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    FileKeyStore(path).put_sync(issue_key("boot", KeyPolicy(), now=time.time())[0])
    return path


@pytest.fixture(scope="module")
def file_gateways(keys_file: Path, sim: SimulatorProcess) -> Iterator[list[GatewayProcess]]:
    """Two gateways reading one key file with the default reload interval."""
    config = {
        "auth": {"keys_file": str(keys_file), "admin_token": ADMIN},
        "tiers": tiers_config([sim.url], ["http://127.0.0.1:9"]),
        "telemetry": {"access_log": False},
    }
    procs = start_all([GatewayProcess(config) for _ in range(2)])
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def warm(http: httpx.AsyncClient, gateways: list[GatewayProcess], token: str) -> None:
    """Every gateway accepts ``token`` (and so has it cached)."""
    for gateway in gateways:
        assert await status(http, gateway, token) == 200


async def refused_everywhere(
    http: httpx.AsyncClient, gateways: list[GatewayProcess], token: str, within: float
) -> None:
    """Every gateway answers 401 for ``token`` within ``within`` seconds."""
    for gateway in gateways:

        async def refused(gw: GatewayProcess = gateway) -> bool:
            return await status(http, gw, token) == 401

        await seconds_until(refused, within)


async def test_admin_rotate_swaps_secrets_here_at_once_and_elsewhere_within_a_second(
    redis_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """After an admin-API rotate, the new key works and the old fails at once on that replica."""
    here, *others = redis_gateways
    created = await http.post(
        here.url + "/admin/keys", json={"tenant": "adv"}, headers=bearer(ADMIN)
    )
    old, key_id = created.json()["key"], created.json()["id"]
    await warm(http, redis_gateways, old)
    rotated = await http.post(f"{here.url}/admin/keys/{key_id}/rotate", headers=bearer(ADMIN))
    assert rotated.status_code == 200
    new = rotated.json()["key"]
    assert await status(http, here, new) == 200
    assert await status(http, here, old) == 401
    await refused_everywhere(http, others, old, BOUND_S)
    for gateway in others:
        assert await status(http, gateway, new) == 200


async def test_admin_revoke_applies_here_at_once_and_elsewhere_within_a_second(
    redis_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """An admin-API revoke refuses the key on that replica at once, on the others within 1 s."""
    here, *others = redis_gateways
    _, token = await redis_key(redis_gateways[0].config["redis"]["url"])
    await warm(http, redis_gateways, token)
    key_id = token.split("-")[1]
    assert (
        await http.delete(f"{here.url}/admin/keys/{key_id}", headers=bearer(ADMIN))
    ).status_code == 200
    refused = await http.get(here.url + "/v1/models", headers=bearer(token))
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "api_key_revoked"
    await refused_everywhere(http, others, token, BOUND_S)


async def test_cli_revoke_and_rotate_are_true_when_the_cli_says_so(
    redis: RedisServer,
    redis_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """`tiergate keys rotate/revoke --redis-url` apply on every replica within a second."""
    record, old = await redis_key(redis.url)
    await warm(http, redis_gateways, old)
    done = await keys_cli_here("rotate", "--redis-url", redis.url, record.key_id)
    assert done.returncode == 0, done.stderr
    assert "applies it at once" in done.stdout
    new = done.stdout.strip().splitlines()[-1]
    await refused_everywhere(http, redis_gateways, old, BOUND_S)
    for gateway in redis_gateways:
        assert await status(http, gateway, new) == 200
    revoked = await keys_cli_here("revoke", "--redis-url", redis.url, record.key_id)
    assert revoked.returncode == 0, revoked.stderr
    await refused_everywhere(http, redis_gateways, new, BOUND_S)


async def test_policy_change_applies_on_every_replica_within_a_second(
    redis: RedisServer,
    redis_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """A record rewritten with a fast-only policy gets 403 for precise within 1 s everywhere."""
    record, token = await redis_key(redis.url)
    precise = {**CHAT, "model": "precise"}
    for gateway in redis_gateways:  # warm: the precise tier is allowed (its replica is down)
        response = await http.post(
            gateway.url + "/v1/chat/completions", json=precise, headers=bearer(token)
        )
        assert response.status_code != 403
    client = Redis.from_url(redis.url)
    try:
        policy = replace(record.policy, allowed_tiers=frozenset({"fast"}))
        await RedisKeyStore(client).put(replace(record, policy=policy))
    finally:
        await client.aclose()
    for gateway in redis_gateways:

        async def forbidden(gw: GatewayProcess = gateway) -> bool:
            response = await http.post(
                gw.url + "/v1/chat/completions", json=precise, headers=bearer(token)
            )
            return response.status_code == 403

        await seconds_until(forbidden, BOUND_S)


async def test_file_store_revocation_reaches_every_replica_within_about_a_second(
    keys_file: Path,
    file_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """File keys: admin revoke applies here at once, on the other replica within ~1 s."""
    here, other = file_gateways
    created = await http.post(
        here.url + "/admin/keys", json={"tenant": "adv"}, headers=bearer(ADMIN)
    )
    token, key_id = created.json()["key"], created.json()["id"]
    await seconds_until(lambda: _ok_everywhere(http, file_gateways, token), BOUND_S + 0.5)
    assert (
        await http.delete(f"{here.url}/admin/keys/{key_id}", headers=bearer(ADMIN))
    ).status_code == 200
    assert await status(http, here, token) == 401
    await refused_everywhere(http, [other], token, BOUND_S + 0.5)


async def test_file_store_cli_rotate_reaches_every_replica_within_about_a_second(
    keys_file: Path,
    file_gateways: list[GatewayProcess],
    http: httpx.AsyncClient,
) -> None:
    """File keys: after `tiergate keys rotate --keys-file` both replicas swap within ~1 s."""
    record, old = issue_key("adv", KeyPolicy(), now=time.time())
    FileKeyStore(keys_file).put_sync(record)
    await seconds_until(lambda: _ok_everywhere(http, file_gateways, old), BOUND_S + 0.5)
    done = await keys_cli_here("rotate", "--keys-file", str(keys_file), record.key_id)
    assert done.returncode == 0, done.stderr
    assert "keys_reload_interval_s" in done.stdout  # the CLI states the real bound
    new = done.stdout.strip().splitlines()[-1]
    await refused_everywhere(http, file_gateways, old, BOUND_S + 0.5)
    assert await _ok_everywhere(http, file_gateways, new)


async def _ok_everywhere(
    http: httpx.AsyncClient, gateways: list[GatewayProcess], token: str
) -> bool:
    return all([await status(http, gw, token) == 200 for gw in gateways])


async def test_outage_serves_cached_keys_and_reconnect_applies_missed_changes(
    sim: SimulatorProcess,
    http: httpx.AsyncClient,
) -> None:
    """Redis killed: cached keys keep working; back (empty): a change nobody heard applies."""
    with RedisServer() as redis:
        record, token = await redis_key(redis.url)
        config = {
            "auth": {"store": "redis"},
            "ratelimit": {"redis_retry_interval_s": 0.2},
            "redis": {"url": redis.url},
            "tiers": tiers_config([sim.url], ["http://127.0.0.1:9"]),
            "telemetry": {"access_log": False},
        }
        gateways = start_all([GatewayProcess(config) for _ in range(2)])
        try:
            await warm(http, gateways, token)
            redis.kill()
            for _ in range(3):
                await warm(http, gateways, token)  # stale records serve through the outage
            redis.start()
            # Restarted empty; the key comes back revoked without any publish.
            client = Redis.from_url(redis.url)
            try:
                revoked = json.dumps(replace(record, disabled=True).to_dict())
                await client.set(f"tiergate:key:{record.key_id}", revoked)
            finally:
                await client.aclose()
            await refused_everywhere(http, gateways, token, BOUND_S + 0.5)
            for gateway in gateways:

                async def resubscribed(gw: GatewayProcess = gateway) -> bool:
                    return "auth.key_feed_subscribed" in gw.log_text()

                await seconds_until(resubscribed, 3.0)
                log = gateway.log_text()
                assert log.count("auth.key_feed_unavailable") == 1, log
                assert log.count("auth.key_feed_subscribed") == 1, log
                assert "Traceback" not in log
        finally:
            for gateway in gateways:
                gateway.stop()
