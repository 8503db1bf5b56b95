"""redis-server SIGKILLed under traffic and restarted (its append-only file kept) behind two
gateways of two workers: budgets and limits hold locally, and no spend is lost."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import KeyPolicy
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
PROCESSES = 4  # 2 gateways x 2 workers
FAST_PRICE = 0.25 / 1000  # the default price of a fast token (gateway/routing/accounting.py)
# Longer than every timer a process runs through the outage (the auth cache's 5 s here, the
# census' 5 s TTL, the unknown-key cache's 10 s), so each runs out while Redis is down, as in
# the 30 s this was before; half the traffic of 30 s, the same charges to journal a second.
OUTAGE_S = float(os.environ.get("TIERGATE_TEST_OUTAGE_S", "15"))
BODY = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
# The pause between one loop's requests. At 5 ms the four loops sent what the machine could
# serve: 7,341 requests in the 33.5 s of test_spend_during_an_outage_reaches_redis (the
# module: 44 s of CPU, load 4-7; 2,455-9,012 by machine in docs/savings.md), about a core for
# the whole outage. At 30 ms a loop's turn is ~45 ms: 4 loops, ~90 requests a second, ~1,600
# in the 18 s of a 15 s outage, still hundreds in each second of outage over the 4 processes,
# each a charge to journal. Fewer charges make the 0.1 % check finer: a "hi" request costs
# 0.00425 (17 tokens), so 0.1 % of the settled sum is 7 requests' worth at 7,341 (31.16), 3
# at ~3,000 (a 30 s outage), 1.6 at ~1,600: two requests lost or paid twice fail it.
PACE_S = 0.03


async def new_key(url: str, policy: KeyPolicy) -> tuple[str, str]:
    """A key in the shared Redis key store: (key id, token)."""
    client = Redis.from_url(url)
    try:
        record, token = await create_key(RedisKeyStore(client), "outage", policy, now=time.time())
    finally:
        await client.aclose()
    return record.key_id, token


async def recorded_spend(url: str, key_id: str) -> float:
    """Today's spend of ``key_id`` as Redis holds it."""
    client = Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(f"*budget:{{{key_id}}}:d:*")]
        values = [float(await client.get(k) or 0) for k in keys]
    finally:
        await client.aclose()
    return sum(values)


@pytest.fixture(scope="module")
def stack(fast_sim: SimulatorProcess) -> Iterator[tuple[RedisServer, list[GatewayProcess]]]:
    """A persistent redis-server and two gateways of two workers, fail-open."""
    with RedisServer(persist=True) as redis:
        _, warm_token = asyncio.run(new_key(redis.url, KeyPolicy()))
        config = {
            "auth": {"store": "redis", "cache_ttl_s": 5},
            "ratelimit": {
                "backend": "redis",
                "on_redis_error": "open",
                "redis_retry_interval_s": 0.2,
            },
            "redis": {"url": redis.url},
            "tiers": tiers_config([fast_sim.url], ["http://127.0.0.1:9"]),
            "telemetry": {"access_log": False},
        }
        procs: list[GatewayProcess] = [
            ForkedGateway(config, workers=2, ready_timeout=90) for _ in range(2)
        ]
        try:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda proc: proc.start(), procs))
            time.sleep(1.5)  # every process has counted the others (gateway/limits/census.py)
            _warm_up(procs, warm_token)
            yield redis, procs
        finally:
            for proc in procs:
                proc.stop()


def _warm_up(procs: list[GatewayProcess], token: str) -> None:
    """Every gateway answers 200 several times in a row (each of its workers has its key and
    its replica state) before the budget key's requests are counted; an unlimited key pays."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + patience(30)
    for proc in procs:
        streak = 0
        while streak < 8:
            answer = httpx.post(proc.url + "/v1/chat/completions", json=BODY, headers=headers)
            streak = streak + 1 if answer.status_code == 200 else 0
            assert time.monotonic() < deadline, answer.text
            if not streak:
                time.sleep(0.1)


def cost_of(response: httpx.Response, text: str) -> float:
    """The cost a 200 settles: its usage (a stream's usage chunk) at the fast price."""
    if response.headers["content-type"].startswith("text/event-stream"):
        usage = None
        for line in text.splitlines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    else:
        usage = json.loads(text)["usage"]
    assert usage is not None
    return float(usage["prompt_tokens"] + usage["completion_tokens"]) * FAST_PRICE


class Traffic:
    """Loops of requests over both gateways, each on a fresh connection (any worker)."""

    def __init__(self, gateways: list[GatewayProcess], token: str) -> None:
        self.gateways = gateways
        self.headers = {"Authorization": f"Bearer {token}"}
        self.statuses: list[int] = []
        self.errors: list[str] = []  # bodies of answers other than 200 and 429
        self.remaining: list[tuple[bool, float]] = []  # (streamed, remaining-budget header)
        self.cost = 0.0
        self.stop = asyncio.Event()

    async def one(self, client: httpx.AsyncClient, i: int) -> int:
        """One request (every third a stream with usage); its cost counted if it succeeded."""
        body: dict[str, object] = dict(BODY)
        if i % 3 == 0:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        url = self.gateways[i % len(self.gateways)].url + "/v1/chat/completions"
        async with client.stream("POST", url, json=body, headers=self.headers) as response:
            text = (await response.aread()).decode()
        self.statuses.append(response.status_code)
        if response.status_code not in (200, 429):
            self.errors.append(text[:300])
        if response.status_code == 200:
            self.cost += cost_of(response, text)
            left = response.headers.get("x-ratelimit-remaining-budget")
            if left is not None:
                self.remaining.append((bool(body.get("stream")), float(left)))
        return response.status_code

    async def loop(self, client: httpx.AsyncClient, start: int) -> None:
        """Requests one after another until ``stop``."""
        i = start
        while not self.stop.is_set():
            await self.one(client, i)
            i += 1
            await asyncio.sleep(PACE_S)


def client() -> httpx.AsyncClient:
    """No connection reuse: each request reaches whichever worker accepts it."""
    return httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


async def run_through_outage(redis: RedisServer, traffic: Traffic, loops: int) -> None:
    """Traffic for 1 s, Redis SIGKILLed for ``OUTAGE_S``, restarted, 2 s more traffic."""
    async with client() as http:
        tasks = [asyncio.create_task(traffic.loop(http, i)) for i in range(loops)]
        await asyncio.sleep(1.0)
        redis.kill()
        await asyncio.sleep(OUTAGE_S)
        redis.start()
        await asyncio.sleep(2.0)
        traffic.stop.set()
        await asyncio.gather(*tasks)
    await asyncio.sleep(0.5)  # the last settlements


def _new_key_once_back(
    redis: RedisServer, gateways: list[GatewayProcess], policy: KeyPolicy
) -> tuple[str, str]:
    """A new key, once every gateway answers a key it has never seen (so it reads Redis
    again): an earlier test's outage may have left a gateway backing off from Redis, and a
    new key's first request would get 503 from its key store. An unlimited key pays."""
    _, fresh = asyncio.run(new_key(redis.url, KeyPolicy()))
    _warm_up(gateways, fresh)
    return asyncio.run(new_key(redis.url, policy))


def test_spend_during_an_outage_reaches_redis(
    stack: tuple[RedisServer, list[GatewayProcess]],
) -> None:
    """Redis killed for ``OUTAGE_S`` (15 s) under traffic: afterwards Redis holds the sum of
    the settled costs of every answered request (within 0.1 %); no budget refusal."""
    redis, gateways = stack
    key_id, token = _new_key_once_back(redis, gateways, KeyPolicy(budget_daily=1000.0))
    traffic = Traffic(gateways, token)
    asyncio.run(run_through_outage(redis, traffic, loops=4))
    # 503 auth_unavailable: a worker that had not cached the key before Redis went away (the
    # kernel hands fresh connections to either worker); nothing was reserved for those.
    assert set(traffic.statuses) <= {200, 503}, traffic.errors[:5]
    assert all('"auth_unavailable"' in error for error in traffic.errors), traffic.errors[:5]
    assert traffic.statuses.count(200) >= 0.9 * len(traffic.statuses)
    # Each process pays what it owes once Redis answers, also one that gets no request after
    # (its payback loop probes at the retry interval): poll, under a loaded machine's patience.
    deadline = time.monotonic() + patience(15.0)
    recorded = asyncio.run(recorded_spend(redis.url, key_id))
    while recorded != pytest.approx(traffic.cost, rel=1e-3) and time.monotonic() < deadline:
        time.sleep(0.1)
        recorded = asyncio.run(recorded_spend(redis.url, key_id))
    time.sleep(1.0)  # and it stays there: nothing paid twice by a late payback
    assert asyncio.run(recorded_spend(redis.url, key_id)) == pytest.approx(recorded, rel=1e-9)
    print(
        f"requests {len(traffic.statuses)} ok {traffic.statuses.count(200)} "
        f"settled {traffic.cost:.6f} recorded {recorded:.6f}"
    )
    assert recorded == pytest.approx(traffic.cost, rel=1e-3)
    for gateway in gateways:
        log = gateway.log_text()
        assert "budget.redis_unavailable" in log
        assert "budget.redis_recovered" in log
        assert "Traceback" not in log


async def burst_in_outage(
    redis: RedisServer, gateways: list[GatewayProcess], token: str, count: int
) -> list[int]:
    """Redis killed, ``count`` requests ten at a time, Redis restarted: their statuses."""
    traffic = Traffic(gateways, token)
    redis.kill()
    try:
        async with client() as http:
            for start in range(0, count, 10):
                await asyncio.gather(*(traffic.one(http, start + i) for i in range(10)))
    finally:
        redis.start()
    return traffic.statuses


def test_local_limits_divide_by_the_live_processes(
    stack: tuple[RedisServer, list[GatewayProcess]],
) -> None:
    """rpm 40, Redis down, 120 requests over 2 gateways x 2 workers: each process counted the
    4 in Redis and admits 40 // 4, so at most 40 pass (each admitting 40 could pass 120)."""
    redis, gateways = stack
    _, token = _new_key_once_back(redis, gateways, KeyPolicy(rpm=40))
    assert set(asyncio.run(burst_with_redis(gateways, token))) == {200}  # caches the key
    statuses = asyncio.run(burst_in_outage(redis, gateways, token, 120))
    # 503: a process that had not cached the key (its store is down too); never a 200 more.
    assert set(statuses) <= {200, 429, 503}
    print(f"admitted {statuses.count(200)} of {len(statuses)}")
    assert 0 < statuses.count(200) <= 40


def test_a_budget_holds_locally_during_an_outage(
    stack: tuple[RedisServer, list[GatewayProcess]],
) -> None:
    """A budget half spent, Redis down, a burst: each process spends at most 1/4 of what it
    last saw left (all of it if it never saw the key spend: the budget's 1/4), so the day
    ends at most the pre-outage spend above the budget, and Redis holds it all after."""
    redis, gateways = stack
    budget = 0.2
    key_id, token = _new_key_once_back(redis, gateways, KeyPolicy(budget_daily=budget))
    before = Traffic(gateways, token)

    async def spend_half() -> None:
        async with client() as http:
            i = 0
            while before.cost < budget / 2:
                assert await before.one(http, i) == 200
                # One at a time: a whole answer's header is the budget minus all settled
                # spend, its own real cost included.
                if i % 3:
                    streamed, left = before.remaining[-1]
                    assert not streamed
                    assert left == pytest.approx(budget - before.cost, abs=1e-6)
                i += 1

    asyncio.run(spend_half())
    statuses = asyncio.run(burst_in_outage(redis, gateways, token, 120))
    assert 429 in statuses
    time.sleep(0.5)
    # Redis answers again: one more request per process pays what each owes.
    after = asyncio.run(burst_with_redis(gateways, token))
    recorded = asyncio.run(recorded_spend(redis.url, key_id))
    print(f"before {before.cost:.4f} outage 200s {statuses.count(200)} recorded {recorded:.4f}")
    assert recorded <= budget + before.cost + 0.01
    assert 429 in after


async def burst_with_redis(gateways: list[GatewayProcess], token: str) -> list[int]:
    """Twenty requests with Redis up (any process may answer): their statuses."""
    traffic = Traffic(gateways, token)
    async with client() as http:
        await asyncio.gather(*(traffic.one(http, i) for i in range(20)))
    return traffic.statuses
