"""Budgets and the tiers a request may be served on: its routed tier, then its fallbacks.

A fast request falls back to precise when fast has no healthy capacity (on by default), and
precise costs four times as much here. The budget must hold whichever tier answers, and a
request that fits on its routed tier must never be refused as never fitting because a
fallback would not fit.
"""

from __future__ import annotations

import pytest

from gateway.limits.budget_stores import BudgetStore, Windows
from gateway.limits.budgets import BudgetGate, BudgetReservation
from gateway.limits.limits import KeyRateLimited
from gateway.pipeline.context import RequestContext
from tests.gateway.limits.test_budgets import COSTS, NOON, key, served, store
from tests.redis_server import redis_server

__all__ = ["redis_server", "store"]
FAST_THEN_PRECISE = ("fast", "precise")


async def _spent(store: BudgetStore) -> float:
    spent = await store.adjust("k1", Windows.at(NOON), 0.0, lazy=False)
    assert spent is not None
    return spent


def _fast_is_down(reservation: BudgetReservation) -> RequestContext:
    """What the forwarder does with fast down: the precise fallback answers (200 + 200
    tokens) when the request may go there, else nothing answers (a 503, nothing used)."""
    if "precise" in reservation.tiers:
        return served("precise", 200, 200)
    return RequestContext("r", route="/v1/chat/completions")


async def test_a_dearer_fallback_never_takes_the_budget_over(store: BudgetStore) -> None:
    """Budget 0.5; each request costs 0.1 on fast, 0.4 on precise; fast is down. Requests are
    answered by precise while the budget holds the precise price; after that they are not
    sent to precise, and the day's spend never passes the budget."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=0.5)
    for _ in range(4):
        reservation = await gate.reserve(principal, FAST_THEN_PRECISE, 200, 200)
        assert reservation is not None
        await reservation.settle(_fast_is_down(reservation))
        assert await _spent(store) <= 0.5 + 1e-9
    assert await _spent(store) == pytest.approx(0.4)  # one precise answer, no more


async def test_a_fast_request_whose_fallback_does_not_fit_is_served_fast(
    store: BudgetStore,
) -> None:
    """Budget 0.3: the request fits on fast (0.1) but its precise fallback (0.4) is dearer
    than the whole budget. It is admitted for fast only, never refused as never fitting."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    principal = key(daily=0.3)
    assert gate.final_refusal(principal, FAST_THEN_PRECISE[:1], 200, 200) is None
    reservation = await gate.reserve(principal, FAST_THEN_PRECISE, 200, 200)
    assert reservation is not None
    assert reservation.tiers == ("fast",)
    assert reservation.reserved == pytest.approx(0.1)


async def test_a_request_routed_precise_and_dearer_than_the_budget_is_final(
    store: BudgetStore,
) -> None:
    """Routed precise (0.4) with a fast fallback (0.1, a key with the downgrade scope), budget
    0.3: final (x-should-retry: false). The fallback serves only when precise has no
    capacity; a budget does not reroute a request."""
    gate = BudgetGate(store, COSTS, clock=lambda: NOON)
    with pytest.raises(KeyRateLimited) as refused:
        await gate.reserve(key(daily=0.3), ("precise", "fast"), 200, 200)
    assert (refused.value.headers or {}).get("x-should-retry") == "false"
