"""Spill across tiers from the replicas' own signals, through real gateways and simulators.

Two simulators with two sequence slots each and a 10x slower engine; whichever tier a test
saturates is flooded directly (not through the gateway: the gateway learns it only from the
replica's ``/metrics``). Two gateways share them: ``up`` routes every classifier request to
fast (threshold 1), ``down`` every one to precise (threshold 0); both spill.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import httpx
import openai
import pytest
from redis.asyncio import Redis

from gateway.access.keystore_redis import RedisKeyStore
from policies.keys import create_key
from policies.principal import SCOPE_DOWNGRADE, KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
ADMIN = "spill-test-admin-token-0000000000000000"
SLOW_ENGINE = ("--max-num-seqs", "2", "--latency-scale", "10", "--jitter", "0")
FLOOD = {
    "messages": [{"role": "user", "content": "Write a long essay."}],
    "max_tokens": 200,
    "ignore_eos": True,
}


@dataclass
class Stack:
    """Redis, both simulators, and the two gateways."""

    redis: RedisServer
    fast: SimulatorProcess
    precise: SimulatorProcess
    up: GatewayProcess
    down: GatewayProcess


def _gateway(redis: RedisServer, fast: str, precise: str, threshold: float) -> GatewayProcess:
    return GatewayProcess(
        {
            "auth": {"store": "redis", "cache_ttl_s": 5, "admin_token": ADMIN},
            "ratelimit": {"backend": "redis"},
            "redis": {"url": redis.url},
            "router": {"threshold": threshold},
            "spillover": {"enabled": True, "margin_s": 0.25},
            "tiers": tiers_config([fast], [precise]),
            "telemetry": {"access_log": False},
        },
        ready_timeout=90,
    )


async def _create_key(url: str, policy: KeyPolicy) -> str:
    client = Redis.from_url(url)
    try:
        _, token = await create_key(RedisKeyStore(client), "spill", policy, now=time.time())
    finally:
        await client.aclose()
    return token


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Everything the tests share, started once."""
    with (
        RedisServer() as redis,
        SimulatorProcess("--profile", "fast", *SLOW_ENGINE) as fast,
        SimulatorProcess("--profile", "precise", *SLOW_ENGINE) as precise,
    ):
        asyncio.run(_create_key(redis.url, KeyPolicy()))  # a gateway starts only with a key
        gateways = [_gateway(redis, fast.url, precise.url, t) for t in (1.0, 0.0)]
        try:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(GatewayProcess.start, gateways))
            yield Stack(redis, fast, precise, *gateways)
        finally:
            for gateway in gateways:
                gateway.stop()


async def new_key(stack: Stack, policy: KeyPolicy) -> str:
    """A key in the shared Redis key store."""
    return await _create_key(stack.redis.url, policy)


def seen_waiting(gateway: GatewayProcess, tier: str) -> float:
    """The requests waiting on ``tier``'s replica as ``gateway`` last read them."""
    view = httpx.get(
        gateway.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    ).json()
    return float(view["tiers"][tier]["replicas"][0]["waiting"])


@asynccontextmanager
async def flooded(sim: SimulatorProcess, gateway: GatewayProcess, tier: str) -> AsyncIterator[None]:
    """Eight long requests straight to ``sim`` (2 run, 6 wait for capacity), seen by
    ``gateway``'s health round, until the block ends; then they are aborted and the engine is
    idle again."""
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(sim.url + "/v1/chat/completions", json=FLOOD) as response:
                await response.read()

        tasks = [asyncio.create_task(one()) for _ in range(8)]
        try:
            deadline = time.monotonic() + patience(10.0)
            while await asyncio.to_thread(seen_waiting, gateway, tier) < 6:
                assert time.monotonic() < deadline, "the gateway never saw the flood"
                await asyncio.sleep(0.05)
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    deadline = time.monotonic() + patience(10.0)
    while (await sim.astats())["running"]:
        assert time.monotonic() < deadline, "the aborted flood never left the engine"
        await asyncio.sleep(0.05)


async def probe(gateway: GatewayProcess, token: str) -> Mapping[str, str]:
    """One short classifier-routed request through the official client: its response headers
    (of the answer, or of the error it raised)."""
    async with openai.AsyncOpenAI(
        api_key=token, base_url=gateway.url + "/v1", max_retries=0
    ) as client:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        except openai.APIStatusError as error:
            return error.response.headers
        raw.parse()
        return raw.headers


async def until_spilled(gateway: GatewayProcess, token: str, reason: str) -> None:
    """Probe until the gateway has read the flood from the replica's metrics and spills."""
    deadline = time.monotonic() + patience(15.0)
    while time.monotonic() < deadline:
        if (await probe(gateway, token))["x-tiergate-route-reason"] == reason:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never saw {reason}")


def route_counts(gateway: GatewayProcess) -> dict[tuple[str, str], float]:
    """``tiergate_route_decisions_total`` by (tier, reason) from the gateway's /metrics."""
    page = httpx.get(
        gateway.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    ).text
    pattern = r'^tiergate_route_decisions_total\{(?=[^}]*reason="([^"]+)")(?=[^}]*tier="([^"]+)")'
    counts: dict[tuple[str, str], float] = {}
    for match in re.finditer(pattern + r"[^}]*\} (\S+)$", page, re.MULTILINE):
        key = (match[2], match[1])
        counts[key] = counts.get(key, 0.0) + float(match[3])
    return counts


def test_a_saturated_fast_tier_spills_up_for_keys_that_allow_it(stack: Stack) -> None:
    """Fast flooded, precise idle: a plain key's requests are answered by precise with
    spill_up (and counted so in the metrics); a fast-only key's stay fast."""

    async def run() -> tuple[list[Mapping[str, str]], Mapping[str, str]]:
        plain = await new_key(stack, KeyPolicy())
        fast_only = await new_key(stack, KeyPolicy(allowed_tiers=frozenset({"fast"})))
        async with flooded(stack.fast, stack.up, "fast"):
            await until_spilled(stack.up, plain, "spill_up")
            spilled = [await probe(stack.up, plain) for _ in range(4)]
            stayed = await probe(stack.up, fast_only)
        return spilled, stayed

    before = route_counts(stack.up).get(("precise", "spill_up"), 0.0)
    spilled, stayed = asyncio.run(run())
    assert [(h["x-tiergate-tier"], h["x-tiergate-route-reason"]) for h in spilled] == [
        ("precise", "spill_up")
    ] * 4
    assert (stayed["x-tiergate-tier"], stayed["x-tiergate-route-reason"]) == ("fast", "classifier")
    # The probe that first spilled and these four, counted by direction.
    assert route_counts(stack.up).get(("precise", "spill_up"), 0.0) - before >= 5
    # The fast replica's size was learnt from what it ran while full: its 2 sequence slots.
    view = httpx.get(
        stack.up.url + "/admin/backends", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    ).json()
    assert view["tiers"]["fast"]["replicas"][0]["engine_slots"] in (2, 3)


def test_spills_count_against_the_precise_share_cap_and_the_budget(stack: Stack) -> None:
    """A key capped at half its requests precise: of 6 that would all spill up, at most 3 go
    precise, the rest are held fast by the cap; a budgeted key is charged the precise price
    (1 per 1k tokens) for a spilled answer."""

    async def run() -> tuple[list[Mapping[str, str]], Mapping[str, str]]:
        capped = await new_key(stack, KeyPolicy(max_precise_share=0.5))
        budgeted = await new_key(stack, KeyPolicy(budget_daily=1000.0))
        async with flooded(stack.fast, stack.up, "fast"):
            await until_spilled(stack.up, budgeted, "spill_up")
            charged = await probe(stack.up, budgeted)
            results = [await probe(stack.up, capped) for _ in range(6)]
        return results, charged

    results, charged = asyncio.run(run())
    reasons = [h["x-tiergate-route-reason"] for h in results]
    assert 1 <= reasons.count("spill_up") <= 3, reasons
    assert set(reasons) == {"spill_up", "policy:precise_share_cap"}, reasons
    capped = [h["x-tiergate-tier"] for h in results if h["x-tiergate-route-reason"] != "spill_up"]
    assert set(capped) == {"fast"}
    assert charged["x-tiergate-route-reason"] == "spill_up"
    # Two probes answered precise so far on this key, each a few tokens: well under 0.1 spent,
    # and the precise price, not the fast one (0.25), leaves it below 1000 - 0.001.
    remaining = float(charged["x-ratelimit-remaining-budget"])
    assert 1000.0 - 0.1 < remaining < 1000.0 - 0.001


def test_a_spill_up_dearer_than_the_whole_budget_does_not_happen(stack: Stack) -> None:
    """Budget 0.004: the probe costs 0.002 on fast, 0.008 on precise (more than the whole
    budget). With fast flooded, a plain key spills up; this key's probe stays fast (queued
    behind the flood, answered once it ends), never refused as never fitting."""

    async def run() -> Mapping[str, str]:
        plain = await new_key(stack, KeyPolicy())
        thrifty = await new_key(stack, KeyPolicy(budget_daily=0.004))
        async with flooded(stack.fast, stack.up, "fast"):
            await until_spilled(stack.up, plain, "spill_up")
            waiting = (await stack.fast.astats())["waiting"]
            answer = asyncio.create_task(probe(stack.up, thrifty))
            deadline = time.monotonic() + patience(10.0)
            while not answer.done() and (await stack.fast.astats())["waiting"] <= waiting:
                assert time.monotonic() < deadline, "the probe neither answered nor queued"
                await asyncio.sleep(0.05)
        return await answer

    headers = asyncio.run(run())
    assert headers.get("x-should-retry") != "false", dict(headers)
    assert (headers["x-tiergate-tier"], headers["x-tiergate-route-reason"]) == (
        "fast",
        "classifier",
    ), dict(headers)


def test_a_drowning_precise_tier_spills_down_only_with_the_downgrade_scope(stack: Stack) -> None:
    """Precise flooded, fast idle: a key with the downgrade scope is answered by fast with
    spill_down; a key without it stays precise."""

    async def run() -> tuple[list[Mapping[str, str]], Mapping[str, str]]:
        downgrader = await new_key(stack, KeyPolicy(scopes=frozenset({SCOPE_DOWNGRADE})))
        plain = await new_key(stack, KeyPolicy())
        async with flooded(stack.precise, stack.down, "precise"):
            await until_spilled(stack.down, downgrader, "spill_down")
            spilled = [await probe(stack.down, downgrader) for _ in range(3)]
            stayed = await probe(stack.down, plain)
        return spilled, stayed

    spilled, stayed = asyncio.run(run())
    assert [(h["x-tiergate-tier"], h["x-tiergate-route-reason"]) for h in spilled] == [
        ("fast", "spill_down")
    ] * 3
    assert stayed["x-tiergate-route-reason"] == "classifier"
    assert stayed["x-tiergate-tier"] == "precise"
    assert route_counts(stack.down).get(("fast", "spill_down"), 0.0) >= 4
