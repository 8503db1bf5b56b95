"""Shadow answers in the usage report and metrics: counted on their tier, billed to no tenant.

The same ledger over the in-memory store and the Redis one (a real redis-server) gives the same
report: callers' rows untouched, a ``shadow`` block beside them, totals that include it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from gateway.limits.usage import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageCollector,
    UsageLedger,
)
from gateway.pipeline.context import RequestContext
from gateway.pipeline.events import Usage
from policies.cost import CostModel, TierPrice
from policies.principal import KeyPolicy, Principal
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

COSTS = CostModel({"fast": TierPrice(0.25, 0.25), "precise": TierPrice(1.0, 1.0)}, "precise")
ACME = Principal(key_id="k1", tenant="acme", policy=KeyPolicy())


def _caller(tier: str, prompt: int, completion: int) -> RequestContext:
    ctx = RequestContext("r", "chat", principal=ACME, tier=tier)
    ctx.usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    return ctx


@asynccontextmanager
async def _ledger(kind: str, redis: RedisServer) -> AsyncIterator[UsageLedger]:
    """A ledger over ``kind`` (memory or redis); a Redis one reads a fresh prefix."""
    if kind == "memory":
        yield UsageLedger(COSTS, MemoryUsageStore())
        return
    client = open_redis(RedisSettings(url=redis.url, socket_timeout_s=5))
    store = RedisUsageStore(client, f"shadow-{id(client)}:", flush_s=0.05)
    store.start()
    try:
        yield UsageLedger(COSTS, store)
    finally:
        await store.stop()
        await client.aclose()


async def _views(ledger: UsageLedger) -> dict[str, dict[str, Any]]:
    return {by: await ledger.view("1h", by) for by in ("tier", "tenant", "key")}


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_shadow_is_counted_on_its_tier_and_billed_to_no_tenant(
    kind: str, redis_server: RedisServer
) -> None:
    """A caller's fast answer (40 + 10 tokens) shadowed on precise (40 + 12): the caller's rows
    stay as they were, the shadow is a row of its own in ``shadow``, and the totals add it
    (its all-precise baseline is 0: an all-precise fleet shadows nothing)."""

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _ledger(kind, redis_server) as ledger:
            ledger.record(_caller("fast", 40, 10))
            before = await _views(ledger)
            ledger.record_shadow("precise", "answer", Usage(prompt_tokens=40, completion_tokens=12))
            await asyncio.sleep(0.2)  # a Redis store has flushed by now (either way counted once)
            return before, await _views(ledger)

    before, after = asyncio.run(run())
    for by in ("tier", "tenant", "key"):
        assert after[by]["rows"] == before[by]["rows"], by
        shadow = after[by]["shadow"]
        assert shadow["rows"] == [
            {"tier": "precise", "purpose": "answer", "requests": 1, "input_tokens": 40,
             "output_tokens": 12, "cost": 0.052, "baseline_cost": 0.0, "savings": -0.052,
             "savings_share": 0.0},
        ]  # fmt: skip
        assert shadow["total"]["cost"] == pytest.approx(0.052)
        total = after[by]["total"]
        assert (total["requests"], total["input_tokens"], total["output_tokens"]) == (2, 80, 22)
        assert total["cost"] == pytest.approx(0.0125 + 0.052)
        assert total["baseline_cost"] == pytest.approx(0.05)  # the caller's answer only
        assert total["savings"] == pytest.approx(0.05 - 0.0645)
    assert before["tier"]["shadow"]["rows"] == []
    assert before["tier"]["total"]["savings_share"] == 0.75


def test_judge_calls_are_a_purpose_of_their_own() -> None:
    """A judge call (the precise tier grading a fast answer) is reported apart from the shadow
    answers, on the precise tier's price."""

    async def run() -> dict[str, Any]:
        ledger = UsageLedger(COSTS, MemoryUsageStore())
        ledger.record_shadow("fast", "answer", Usage(prompt_tokens=100, completion_tokens=20))
        ledger.record_shadow("precise", "judge", Usage(prompt_tokens=300, completion_tokens=4))
        return await ledger.view("24h", "tier")

    shadow = asyncio.run(run())["shadow"]
    assert [(r["tier"], r["purpose"], r["cost"]) for r in shadow["rows"]] == [
        ("fast", "answer", 0.03),
        ("precise", "judge", 0.304),
    ]
    assert shadow["total"]["requests"] == 2


def test_shadow_tokens_and_cost_are_exported_apart() -> None:
    """``tiergate_shadow_tokens_total{tier,purpose,direction}`` and
    ``tiergate_shadow_cost_total{tier,purpose}``; the callers' ``tiergate_cost_total`` keeps
    its meaning (callers' answers only)."""
    ledger = UsageLedger(COSTS, MemoryUsageStore())
    ledger.record(_caller("fast", 40, 10))
    ledger.record_shadow("precise", "answer", Usage(prompt_tokens=40, completion_tokens=12))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in UsageCollector(ledger).collect()
        for s in family.samples
    }
    assert samples[("tiergate_cost_total", (("tier", "fast"),))] == pytest.approx(0.0125)
    assert ("tiergate_cost_total", (("tier", "precise"),)) not in samples
    key = (("purpose", "answer"), ("tier", "precise"))
    assert samples[("tiergate_shadow_cost_total", key)] == pytest.approx(0.052)
    tokens = "tiergate_shadow_tokens_total"
    assert samples[(tokens, (("direction", "input"), *key))] == 40
    assert samples[(tokens, (("direction", "output"), *key))] == 12


def test_a_tenant_with_a_bar_in_its_name_is_reported_as_itself(redis_server: RedisServer) -> None:
    """A tenant may be any printable name, ``|`` included; Redis keeps each total under
    ``tier|tenant|key|field``, and the report must read the tenant back whole (it read
    ``acme|eu`` as tier ``fast|acme``, tenant ``eu``, and ``|`` as the empty tenant that marks
    shadow evaluation's rows)."""

    async def run() -> set[tuple[str, str, str]]:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        store = RedisUsageStore(client, f"bar-{id(client)}:")
        try:
            for tenant in ("acme|eu", "|", "a||b|"):
                store.add(5, ("fast", tenant, "k1"), (1.0, 2.0, 3.0, 4.0, 5.0))
            await store.flush()
            return set(await store.rows(range(5, 6)))
        finally:
            await client.aclose()

    assert asyncio.run(run()) == {("fast", "acme|eu", "k1"), ("fast", "|", "k1"),
                                  ("fast", "a||b|", "k1")}  # fmt: skip
