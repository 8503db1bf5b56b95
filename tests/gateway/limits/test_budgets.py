"""Compute budgets: both stores pass one contract; windows, refusals, settlement."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.limits.budget_stores import BudgetStore, MemoryBudgetStore, RedisBudgetStore, Windows
from gateway.limits.budgets import BudgetGate
from gateway.limits.limits import KeyRateLimited
from gateway.pipeline.context import RequestContext, Usage
from policies.cost import CostModel, TierPrice
from policies.principal import KeyPolicy, Principal
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
COSTS = CostModel({"fast": TierPrice(0.25, 0.25), "precise": TierPrice(1.0, 1.0)}, "precise")
NOON = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BudgetStore]:
    """Each budget store in turn (Redis: a real redis-server, flushed)."""
    if request.param == "memory":
        yield MemoryBudgetStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = Redis.from_url(server.url)
    yield RedisBudgetStore(client, "test:")
    await client.aclose()


def key(daily: float | None = None, monthly: float | None = None) -> Principal:
    """A principal with budgets."""
    return Principal("k1", "t", KeyPolicy(budget_daily=daily, budget_monthly=monthly))


def served(tier: str, prompt: int, completion: int) -> RequestContext:
    """A finished request's context."""
    ctx = RequestContext("r", route="/v1/chat/completions")
    ctx.tier, ctx.usage = tier, Usage(prompt, completion)
    return ctx


def test_windows_are_utc_day_and_month() -> None:
    """Noon on 1 December: 12 h to the next day, 31 days minus 12 h to January."""
    w = Windows.at(NOON)
    assert (w.day, w.month) == ("20261201", "202612")
    assert w.day_left_s == 12 * 3600
    assert w.month_left_s == 31 * 86400 - 12 * 3600


async def test_keys_without_budgets_reserve_nothing(store: BudgetStore) -> None:
    """No budget: no store call, no reservation."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    assert await gate.reserve(key(), ["fast"], 10, 10) is None


async def test_reservations_stop_at_the_budget_and_settle_to_real_cost(store: BudgetStore) -> None:
    """Budget 3: two precise reservations of 1.0 fit, then settling frees room."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=3.0)
    first = await gate.reserve(principal, ["precise"], 500, 500)  # reserves 1.0
    second = await gate.reserve(principal, ["precise"], 500, 500)
    third = await gate.reserve(principal, ["precise"], 500, 500)
    assert first is not None
    assert second is not None
    assert third is not None
    with pytest.raises(KeyRateLimited) as info:
        await gate.reserve(principal, ["precise"], 500, 500)
    assert info.value.limit == "budget_daily"
    assert info.value.headers["Retry-After"] == str(12 * 3600)
    await first.settle(served("fast", 100, 100))  # really cost 0.05: 0.95 back
    assert await gate.reserve(principal, ["precise"], 400, 500) is not None  # 0.9 fits now


async def test_monthly_budget_applies_too(store: BudgetStore) -> None:
    """A monthly budget below the daily one refuses first."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=100.0, monthly=1.5)
    assert await gate.reserve(principal, ["precise"], 500, 500) is not None
    with pytest.raises(KeyRateLimited) as info:
        await gate.reserve(principal, ["precise"], 500, 500)
    assert info.value.limit == "budget_monthly"


async def test_failed_requests_give_the_reservation_back(store: BudgetStore) -> None:
    """Nothing served (no usage): the whole reservation returns."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=1.0)
    reservation = await gate.reserve(principal, ["precise"], 500, 500)
    assert reservation is not None
    await reservation.settle(RequestContext("r", route="/v1/completions"))
    assert await gate.reserve(principal, ["precise"], 500, 500) is not None


async def test_the_next_day_starts_afresh(store: BudgetStore) -> None:
    """A spent daily budget is available again after midnight UTC."""
    now = [NOON]
    gate = BudgetGate(store, COSTS, clock=lambda: now[0])
    principal = key(daily=1.0)
    assert await gate.reserve(principal, ["precise"], 500, 500) is not None
    with pytest.raises(KeyRateLimited):
        await gate.reserve(principal, ["precise"], 500, 500)
    now[0] += 13 * 3600
    assert await gate.reserve(principal, ["precise"], 500, 500) is not None


async def test_a_fast_request_is_priced_fast(store: BudgetStore) -> None:
    """Budget 0.05 with 0.011 spent: fast requests that fit at the fast price are admitted,
    though their precise fallback would not fit (the issue's 78 %-left key): while the budget
    holds the fallback's price they reserve it, then they go to fast alone."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=0.05)
    spend = await gate.reserve(principal, ["fast"], 22, 22)  # 0.011 at the fast price
    assert spend is not None
    await spend.settle(served("fast", 22, 22))
    reserved = []
    for _ in range(6):  # 0.0051 each on fast; 0.0204 each had it been priced precise
        reservation = await gate.reserve(principal, ["fast", "precise"], 4, 16)
        assert reservation is not None
        reserved.append((reservation.tiers, round(reservation.reserved, 4)))
        await reservation.settle(served("fast", 4, 16))
    assert reserved[0] == (("fast", "precise"), 0.02)
    assert reserved[-1] == (("fast",), 0.005)


async def test_a_fallback_is_priced_when_it_answers(store: BudgetStore) -> None:
    """Reserved at the worst case (its precise fallback), answered by precise: the settlement
    charges the precise price."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=10.0)
    reservation = await gate.reserve(principal, ["fast", "precise"], 500, 500)
    assert reservation is not None
    assert reservation.reserved == pytest.approx(1.0)
    await reservation.settle(served("precise", 500, 500))  # cost 1.0
    assert float(reservation.headers["x-ratelimit-remaining-budget"]) == pytest.approx(9.0)


async def test_remaining_budget_shows_the_settled_spend(store: BudgetStore) -> None:
    """After settlement the header is budget minus real spend, not minus the reservation."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=2.0)
    reservation = await gate.reserve(principal, ["precise"], 500, 500)  # 1.0 reserved
    assert reservation is not None
    assert float(reservation.headers["x-ratelimit-remaining-budget"]) == pytest.approx(1.0)
    await reservation.settle(served("precise", 100, 100))  # cost 0.2
    assert float(reservation.headers["x-ratelimit-remaining-budget"]) == pytest.approx(1.8)


async def test_the_marks_tell_which_charges_ran(redis_server: RedisServer) -> None:
    """A numbered reservation or settlement that ran is marked; a later number is not."""
    client = Redis.from_url(redis_server.url)
    store = RedisBudgetStore(client, "test:")
    windows = Windows.at(NOON)
    try:
        seq = store.next_seq()
        assert (await store.reserve("k", windows, 10.0, None, 1.0, seq=seq))[0] is None
        assert await store.charged("k", seq)
        settle = store.next_seq()
        assert not await store.charged("k", settle)
        assert await store.adjust("k", windows, 0.5, lazy=False, seq=settle) == 1.5
        assert await store.charged("k", settle)
        refused = store.next_seq()
        assert (await store.reserve("k", windows, 1.0, None, 1.0, seq=refused))[0] is not None
        assert not await store.charged("k", refused)  # refused: nothing charged
    finally:
        await store.aclose()
        await client.aclose()


def test_unset_prices_are_one_unit_on_precise_and_a_quarter_elsewhere() -> None:
    """docs/savings.md: unset, precise costs 1 unit per 1,000 tokens and every other tier 0.25."""
    from gateway.config.settings import Settings
    from gateway.routing.accounting import cost_model

    settings = Settings()
    costs = cost_model(settings.tiers, settings.router.precise_tier)
    assert settings.router.precise_tier == "precise"
    assert costs.cost("precise", 1000, 1000) == pytest.approx(2.0)
    for tier in set(settings.tiers) - {"precise"}:
        assert costs.cost(tier, 1000, 1000) == pytest.approx(0.5), tier
    assert costs.savings("fast", 1000, 1000) == pytest.approx(1.5)
