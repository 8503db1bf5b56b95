"""The precise-share cap's windows: memory and Redis agree, and no window exceeds the cap."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.limits.limits import KeyRateLimited
from gateway.limits.precise_cap import (
    REASON,
    EscalationTracker,
    MemoryShareWindows,
    PreciseShareCap,
    RedisShareWindows,
    ShareWindows,
    TenantCap,
)
from policies.keys import policy_from_dict, policy_to_dict
from policies.principal import KeyPolicy, Principal
from policies.tiering import RouteDecision
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
WINDOW = 50


@pytest.fixture(params=["memory", "redis"])
async def windows(request: pytest.FixtureRequest) -> AsyncIterator[ShareWindows]:
    """Each kind of window store (Redis: a real redis-server, flushed)."""
    if request.param == "memory":
        yield MemoryShareWindows(WINDOW)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = Redis.from_url(server.url)
    store = RedisShareWindows(client, "test:", WINDOW)
    yield store
    await store.aclose()
    await client.aclose()


async def test_every_window_stays_within_the_cap(windows: ShareWindows) -> None:
    """2,000 requests, 80 % wanting precise, cap 0.2: every 50 in a row hold at most 10."""
    rng = random.Random(7)
    sent: list[int] = []
    for _ in range(2000):
        want = rng.random() < 0.8
        ok = await windows.check("k", want, 0.2, refuse=False)
        sent.append(1 if want and ok else 0)
    assert max(sum(sent[i : i + WINDOW]) for i in range(len(sent) - WINDOW)) <= 10
    assert sum(sent) / len(sent) >= 0.19  # the cap is used, not just respected


async def test_refused_requests_are_not_counted(windows: ShareWindows) -> None:
    """Refuse mode: an over-cap request leaves the window as it was."""
    assert await windows.check("k", False, 0.5, refuse=True)
    assert await windows.check("k", True, 0.5, refuse=True)  # 1 of 2
    assert not await windows.check("k", True, 0.5, refuse=True)  # 2 of 3: refused
    assert await windows.check("k", False, 0.5, refuse=True)  # 1 of 3
    assert await windows.check("k", True, 0.5, refuse=True)  # 2 of 4


def principal(share: float | None, over: str = "downgrade", tenant: str = "t") -> Principal:
    """A key with a precise-share cap."""
    return Principal("k1", tenant, KeyPolicy(max_precise_share=share, precise_share_over=over))


async def test_over_the_cap_downgrades_without_a_precise_fallback() -> None:
    """A downgraded request goes fast with the policy reason, and may not fall back to precise."""
    cap = PreciseShareCap(MemoryShareWindows(10), fast="fast", precise="precise", tenants={})
    decision = RouteDecision("precise", "tools", None)
    new, tiers = await cap.apply(decision, ("precise", "fast"), principal(0.2))
    assert new == RouteDecision("fast", REASON, None)
    assert tiers == ("fast",)
    assert cap.actions[("key", "downgraded")] == 1


async def test_refuse_policy_answers_429() -> None:
    """A refuse-policy key over its cap gets a 429 naming the precise-share limit."""
    cap = PreciseShareCap(MemoryShareWindows(10), fast="fast", precise="precise", tenants={})
    with pytest.raises(KeyRateLimited) as info:
        await cap.apply(RouteDecision("precise", "model"), ("precise",), principal(0.2, "refuse"))
    assert info.value.limit == "precise_share"
    assert info.value.status == 429


async def test_a_tenant_cap_applies_to_keys_without_one() -> None:
    """A tenant cap of 0 keeps every key of that tenant on fast."""
    cap = PreciseShareCap(
        MemoryShareWindows(10), fast="fast", precise="precise", tenants={"t": TenantCap(0.0)}
    )
    caller = principal(None)
    assert cap.applies(caller)
    new, _ = await cap.apply(RouteDecision("precise", "classifier", 0.9), ("precise",), caller)
    assert new.tier == "fast"
    assert not cap.applies(principal(None, tenant="other"))


def test_the_policy_fields_round_trip_and_are_checked() -> None:
    """Stored and read back; a share outside 0..1 or an unknown action is refused."""
    policy = KeyPolicy(max_precise_share=0.25, precise_share_over="refuse")
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert "max_precise_share" not in policy_to_dict(KeyPolicy())
    with pytest.raises(ValueError, match="max_precise_share"):
        policy_from_dict({"max_precise_share": 1.5})
    with pytest.raises(ValueError, match="precise_share_over"):
        policy_from_dict({"max_precise_share": 0.5, "precise_share_over": "maybe"})


def test_escalated_keys_are_counted_not_labelled() -> None:
    """One key far above the fleet's share counts once; a key like the fleet does not."""
    tracker = EscalationTracker(lambda: 0.3)
    for i in range(100):
        tracker.record("crafty", True)
        tracker.record("normal", i % 10 < 3)
    assert tracker.escalated() == 1
