"""Attacks on the fleet: several real `tiergate serve` processes sharing one real redis-server,
broken the way production breaks them (a gateway SIGKILLed mid-request, Redis restarted
empty)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

import router_models
from gateway.access.keystore_file import FileKeyStore
from gateway.limits.budget_stores import RedisBudgetStore, Windows
from gateway.limits.limiter_redis import RedisRateLimiter
from gateway.routing.dial_sync import RedisDialStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from policies.ratelimit import LimitSpec
from router_models.artifact import load as load_model
from router_models.artifact import save as save_model
from tests.adversarial.keys_stack import ADMIN, CHAT, bearer, redis_key, start_all
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.integration.test_budget_outage import cost_of, recorded_spend
from tests.processes import patience
from tests.redis_server import RedisServer, redis_server
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

__all__ = ["redis_server"]
# How long a concurrency slot of a dead gateway may keep its key locked out: the slot lease
# (gateway/limits/limiter_redis.py), plus a little for the polling.
SLOT_LEASE_S = 15.0


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    """The fleet's one redis-server (no persistence)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as sim:
        yield sim


@pytest.fixture(scope="module")
def stalling_sim() -> Iterator[SimulatorProcess]:
    """A fast-tier simulator that holds every request two minutes before answering."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0",
        "--stall-first-byte", "1", "--stall-seconds", "120",
    ) as sim:  # fmt: skip
        yield sim


def gateway_config(redis: RedisServer, replica: str) -> dict[str, Any]:
    """Keys and limits in the shared Redis; one fast replica (precise unreachable)."""
    return {
        "auth": {"store": "redis"},
        "ratelimit": {"backend": "redis", "on_redis_error": "open"},
        "redis": {"url": redis.url},
        "tiers": tiers_config([replica], ["http://127.0.0.1:9"]),
        "telemetry": {"access_log": False},
    }


def hold_requests(url: str, token: str, count: int) -> list[threading.Thread]:
    """``count`` requests sent in the background to ``url``; they end however they end."""

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):  # its gateway is killed: the point
            httpx.post(url + "/v1/chat/completions", json=CHAT, headers=bearer(token), timeout=300)

    threads = [threading.Thread(target=send, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


async def lease_left_s(url: str, key_id: str) -> float:
    """How long the key's longest-held slot still has in Redis (seconds; 0 when none)."""
    client = Redis.from_url(url)
    try:
        seconds, micros = await client.time()
        top = await client.zrange(f"tiergate:rl:{{{key_id}}}:c", -1, -1, withscores=True)
    finally:
        await client.aclose()
    return max(0.0, (float(top[0][1]) - seconds * 1e6 - micros) / 1e6) if top else 0.0


async def slots_held(url: str, key_id: str) -> int:
    """The key's concurrency slots in Redis (members of its in-flight set, unexpired or not)."""
    client = Redis.from_url(url)
    try:
        return int(await client.zcard(f"tiergate:rl:{{{key_id}}}:c"))
    finally:
        await client.aclose()


def wait_slots(url: str, key_id: str, count: int, within: float = 20.0) -> None:
    """Wait until the key holds ``count`` slots in Redis."""
    deadline = time.monotonic() + within
    while asyncio.run(slots_held(url, key_id)) != count:
        assert time.monotonic() < deadline, "the held requests never took their slots"
        time.sleep(0.05)


async def test_a_held_slot_outlives_its_lease_and_a_redis_that_lost_it(
    redis_server: RedisServer,
) -> None:
    """A live holder renews its slot past the lease, and puts it back when Redis loses it
    (restarted empty): the key's concurrency stays exact; released, it is free at once."""
    client = Redis.from_url(redis_server.url)
    limiter = RedisRateLimiter(client, prefix="fleet:", lease_s=0.3, max_hold_s=30)
    spec = LimitSpec(concurrency=1)
    try:
        assert (await limiter.acquire("k", spec, 0, "held")).allowed
        await asyncio.sleep(0.6)  # two leases
        assert not (await limiter.acquire("k", spec, 0, "other")).allowed
        await client.flushall()
        assert (await limiter.acquire("k", spec, 0, "sneaks-in")).allowed
        await limiter.release("k", spec, 0, "sneaks-in")
        deadline = time.monotonic() + patience(2.0)
        while await client.zscore("fleet:rl:{k}:c", "held") is None:  # the next renewal
            assert time.monotonic() < deadline, "the held slot was never put back"
            await asyncio.sleep(0.02)
        assert not (await limiter.acquire("k", spec, 0, "other")).allowed
        await limiter.release("k", spec, 0, "held")
        assert (await limiter.acquire("k", spec, 0, "other")).allowed
    finally:
        await limiter.aclose()
        await client.aclose()


@pytest.mark.slow
def test_a_gateway_killed_mid_request_does_not_lock_its_key_out(
    redis: RedisServer, stalling_sim: SimulatorProcess, fast_sim: SimulatorProcess
) -> None:
    """A gateway SIGKILLed while it holds a key's every concurrency slot: the slots stay taken
    while it lives (even past the lease: it renews them), and once it is dead another gateway
    admits the key again within the slot lease, not after the longest tier timeout + 60 s."""
    record, token = asyncio.run(redis_key(redis.url, max_concurrency=2))
    doomed = ForkedGateway(gateway_config(redis, stalling_sim.url))
    other = ForkedGateway(gateway_config(redis, fast_sim.url))
    start_all([doomed, other])
    try:
        hold_requests(doomed.url, token, 2)
        wait_slots(redis.url, record.key_id, 2)
        time.sleep(SLOT_LEASE_S + 2)  # past one lease: a live holder keeps its slots
        chat = other.url + "/v1/chat/completions"
        refused = httpx.post(chat, json=CHAT, headers=bearer(token))
        assert refused.status_code == 429, refused.text
        assert "concurrent" in refused.json()["error"]["message"]
        doomed.kill()
        killed_at = time.monotonic()
        while True:
            answer = httpx.post(chat, json=CHAT, headers=bearer(token))
            waited = time.monotonic() - killed_at
            if answer.status_code == 200:
                break
            assert answer.status_code == 429, answer.text
            left = asyncio.run(lease_left_s(redis.url, record.key_id))
            assert waited < SLOT_LEASE_S + 5, (
                f"key still locked out {waited:.0f}s after the kill, for {left:.0f}s more"
            )
            time.sleep(0.25)
    finally:
        doomed.stop()
        other.stop()


def test_a_redis_restarted_empty_does_not_give_a_key_its_budget_again(
    fast_sim: SimulatorProcess, tmp_path: Path
) -> None:
    """Redis restarted empty (no persistence, as the Helm chart's Redis) while a budgeted
    key has spent half its day and has a request in flight: the gateway that saw the spend
    puts it back, so the key's answered requests still cost at most its budget (plus one
    request's overrun)."""
    budget = 1.0
    record, token = issue_key("fleet", KeyPolicy(budget_daily=budget), now=time.time())
    keys = tmp_path / "keys.yaml"
    FileKeyStore(keys).put_sync(record)
    with RedisServer() as redis:
        config = gateway_config(redis, fast_sim.url)
        config["auth"] = {"keys_file": str(keys)}
        with ForkedGateway(config) as gateway:
            spend = Spend(gateway.url, token)
            while spend.cost < budget / 2:
                assert spend.one() == 200
            fast_sim.set_faults(stall_first_byte=1.0, stall_seconds=2.0)
            try:
                held = threading.Thread(target=spend.one)
                held.start()
                before = spend.cost
                deadline = time.monotonic() + patience(10)
                while asyncio.run(recorded_spend(redis.url, record.key_id)) <= before:
                    assert time.monotonic() < deadline, "the held request reserved nothing"
                    time.sleep(0.02)
                redis.restart()
            finally:
                fast_sim.set_faults(stall_first_byte=0.0)
            held.join(timeout=30)
            assert asyncio.run(recorded_spend(redis.url, record.key_id)) >= 0.0
            for _ in range(40):  # spend what is left, and more if the gateway lets it
                if spend.one() == 429:
                    break
    assert spend.statuses.count(429) == 1, spend.statuses
    assert spend.cost <= budget + spend.largest, (spend.cost, spend.statuses)


async def test_a_refund_into_a_lost_day_never_makes_the_spend_negative(
    redis_server: RedisServer,
) -> None:
    """Requests reserved before Redis lost its data settle after (their real use below their
    reservation): the spend Redis holds is never negative, which would give the key more
    than its whole budget."""
    client = Redis.from_url(redis_server.url)
    store = RedisBudgetStore(client, "fleet:")
    today = Windows.at(time.time())
    try:
        for _ in range(2):
            assert (await store.reserve("k", today, 1.0, None, 0.5))[0] is None
        await client.flushall()  # Redis restarted empty
        for _ in range(2):
            await store.adjust("k", today, -0.4, lazy=False)  # each used 0.1 of its 0.5
        spent = float(await client.get(f"fleet:budget:{{k}}:d:{today.day}") or 0)
        assert spent >= 0.0
        refused, _ = await store.reserve("k", today, 1.0, None, 0.9)
        assert refused == "budget_daily", "the key may spend 1.7 of a budget of 1"
    finally:
        await store.aclose()
        await client.aclose()


def test_keys_of_the_redis_store_are_gone_with_a_redis_restarted_empty(
    fast_sim: SimulatorProcess,
) -> None:
    """Pinned trade-off (docs/access.md): a Redis key store restarted without persistence has
    lost its keys; the gateway refuses them (401) at once, never serves them from its cache."""
    with RedisServer() as redis:
        _, token = asyncio.run(redis_key(redis.url))
        with ForkedGateway(gateway_config(redis, fast_sim.url)) as gateway:
            chat = gateway.url + "/v1/chat/completions"
            assert httpx.post(chat, json=CHAT, headers=bearer(token)).status_code == 200
            redis.restart()
            deadline = time.monotonic() + 1.5  # the cache's bound while Redis answers
            while (status := httpx.post(chat, json=CHAT, headers=bearer(token)).status_code) != 401:
                assert status == 200, status
                assert time.monotonic() < deadline, "a lost key still served"
                time.sleep(0.05)


@pytest.mark.slow
def test_a_redis_restarted_empty_keeps_the_fleets_dial_and_reloads(
    fast_sim: SimulatorProcess, tmp_path: Path
) -> None:
    """Redis restarted empty after a tenant's dial was turned and the artifact reloaded:
    every gateway keeps the dialled target (and a new gateway gets it), and the next reload,
    on either gateway, is still followed by the other."""
    artifact = tmp_path / "router.npz"
    shutil.copy(router_models.DEFAULT_ARTIFACT, artifact)
    with RedisServer() as redis:
        config = gateway_config(redis, fast_sim.url)
        config["auth"] = {"enabled": False, "admin_token": ADMIN}
        config["router"] = {"artifact": str(artifact)}
        first, second = start_all([ForkedGateway(config) for _ in range(2)])
        late = ForkedGateway(config)
        try:
            dialled = httpx.put(
                first.url + "/admin/router/share", json={"share": 0.1, "tenant": "acme"},
                headers=bearer(ADMIN),
            )  # fmt: skip
            assert dialled.status_code == 200, dialled.text
            loaded = routing(second)["artifact"]["loaded_at"]
            assert reload(first) == reload(first)  # the fleet is at its second reload
            deadline = time.monotonic() + patience(5)
            while routing(second)["artifact"]["loaded_at"] == loaded:  # followed, at last
                assert time.monotonic() < deadline, "the other gateway never followed"
                time.sleep(0.05)
            time.sleep(0.5)  # both reloads followed (a poll every 0.25 s)
            redis.restart()
            time.sleep(1.0)  # a few dial-sync rounds on the empty Redis
            late.start()
            for gateway in (first, second, late):
                assert routing(gateway)["dial"]["tenant_targets"] == {"acme": 0.1}
            model = load_model(artifact)
            save_model(dataclasses.replace(model, platt_c=model.platt_c - 3.0), artifact)
            new_id = reload(first)
            deadline = time.monotonic() + 3.0  # the dial-sync bound is 1 s
            while routing(second)["artifact"]["id"] != new_id:
                assert time.monotonic() < deadline, "the other gateway never followed the reload"
                time.sleep(0.1)
        finally:
            for gateway in (first, second, late):
                gateway.stop()


async def test_a_dial_store_that_lost_its_data_is_put_back_without_undoing_a_later_change(
    redis_server: RedisServer,
) -> None:
    """A worker's applied dial goes back into an emptied Redis; but once a change was made on
    the empty Redis, that change stands and the version moves past every worker's."""
    client = Redis.from_url(redis_server.url)
    store = RedisDialStore(client, "fleet:")
    try:
        await store.set_target("acme", 0.1)
        await store.set_target("acme", 0.2)
        applied = await store.bump_reload()
        await client.flushall()
        restored = await store.restore(applied)
        assert (restored.tenants, restored.version, restored.reload) == ({"acme": 0.2}, 2, 1)
        await client.flushall()
        await store.set_target(None, 0.4)  # a change on the empty Redis, before any restore
        after = await store.restore(applied)
        assert (after.default, after.tenants, after.version) == (0.4, {}, 3)
    finally:
        await client.aclose()


def reload(gateway: GatewayProcess) -> str:
    """``POST /admin/router/reload``; the loaded artifact's id."""
    answer = httpx.post(gateway.url + "/admin/router/reload", headers=bearer(ADMIN), timeout=60)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["artifact"]["id"])


def routing(gateway: GatewayProcess) -> dict[str, Any]:
    """``GET /admin/routing``."""
    answer = httpx.get(gateway.url + "/admin/routing", headers=bearer(ADMIN))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


class Spend:
    """Requests of one budgeted key, one after another; the cost of what was answered."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url + "/v1/chat/completions"
        self.headers = bearer(token)
        self.cost = 0.0
        self.largest = 0.0  # the dearest answer: the most one request may overrun
        self.statuses: list[int] = []

    def one(self) -> int:
        """One request of up to 200 tokens; its status."""
        body = {**CHAT, "max_tokens": 200}
        answer = httpx.post(self.url, json=body, headers=self.headers, timeout=30)
        self.statuses.append(answer.status_code)
        if answer.status_code == 200:
            cost = cost_of(answer, answer.text)
            self.cost += cost
            self.largest = max(self.largest, cost)
        else:
            assert answer.status_code == 429, answer.text
        return answer.status_code
