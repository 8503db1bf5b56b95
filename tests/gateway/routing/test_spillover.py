"""Spill across tiers: which requests move, in which direction, and when."""

from __future__ import annotations

from gateway.routing.spillover import DOWN, UP, Spillover, SpilloverConfig
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.signals import refresh_slots
from policies.principal import SCOPE_DOWNGRADE, KeyPolicy, Principal
from policies.tiering import RouteDecision

ON = SpilloverConfig(enabled=True, margin_s=0.25, assumed_request_s=1.0)
ANYONE = Principal(key_id="k", tenant="t", policy=KeyPolicy())
DOWNGRADER = Principal(
    key_id="d", tenant="t", policy=KeyPolicy(scopes=frozenset({SCOPE_DOWNGRADE}))
)
FAST_ONLY = Principal(key_id="f", tenant="t", policy=KeyPolicy(allowed_tiers=frozenset({"fast"})))


def full(pool: ReplicaPool, *, running: int, waiting: int, drain: float) -> None:
    """Every replica of ``pool`` reports ``running`` and ``waiting`` and drains ``drain``/s."""
    for replica in pool.replicas:
        replica.running, replica.waiting_capacity, replica.drain_per_s = running, waiting, drain
        replica.engine_slots = running
        refresh_slots(replica)


def tiers() -> tuple[ReplicaPool, ReplicaPool]:
    """A fast and a precise tier of two idle replicas with 8 slots each."""
    fast = ReplicaPool("fast", ["http://f1:8000", "http://f2:8000"], 8, 0.1)
    precise = ReplicaPool("precise", ["http://p1:8000", "http://p2:8000"], 8, 0.1)
    return fast, precise


def decide(
    spill: Spillover, tier: str, principal: Principal = ANYONE, reason: str = "classifier"
) -> RouteDecision:
    """Adjust a decision for ``tier``."""
    return spill.adjust(RouteDecision(tier, reason, 0.3), principal)


def test_a_saturated_fast_tier_spills_up_to_an_idle_precise_one() -> None:
    """Fast: 2 running, 6 waiting for capacity, 2 finishing a second -> 3.5 s ahead; precise
    idle: the request goes precise, reason spill_up, counted."""
    fast, precise = tiers()
    full(fast, running=2, waiting=6, drain=2.0)
    spill = Spillover(ON, fast, precise)
    assert spill.wait_s(fast, 0.0) == (2 + 6 + 1 - 2) / 2.0
    decision = decide(spill, "fast")
    assert (decision.tier, decision.reason, decision.score) == ("precise", UP, 0.3)
    assert spill.spilled == {UP: 1}


def test_no_spill_within_the_margin() -> None:
    """A short fast wait (0.2 s) against an idle precise tier stays, as does a busier
    precise tier just as busy as the fast one."""
    fast, precise = tiers()
    full(fast, running=2, waiting=0, drain=5.0)
    for replica in fast.replicas:
        replica.in_flight = 2
    spill = Spillover(ON, fast, precise)
    assert spill.wait_s(fast, 0.0) == 0.2
    assert decide(spill, "fast").tier == "fast"
    full(fast, running=2, waiting=6, drain=2.0)
    full(precise, running=2, waiting=6, drain=2.0)
    assert decide(spill, "fast").tier == "fast"
    assert not spill.spilled


def test_downgrade_needs_the_scope() -> None:
    """A drowning precise tier: only a key with the downgrade scope spills down."""
    fast, precise = tiers()
    full(precise, running=1, waiting=9, drain=1.0)
    spill = Spillover(ON, fast, precise)
    assert decide(spill, "precise").tier == "precise"
    decision = decide(spill, "precise", DOWNGRADER)
    assert (decision.tier, decision.reason) == ("fast", DOWN)
    assert spill.spilled == {DOWN: 1}


def test_keys_without_the_precise_tier_and_forced_routes_stay() -> None:
    """A fast-only key never spills up; explicit tiers, rules and requests the other tier
    would refuse are never moved."""
    fast, precise = tiers()
    full(fast, running=2, waiting=6, drain=2.0)
    spill = Spillover(ON, fast, precise)
    assert decide(spill, "fast", FAST_ONLY).tier == "fast"
    assert decide(spill, "fast", reason="explicit").tier == "fast"
    assert decide(spill, "fast", reason="rule:tools").tier == "fast"
    refused = spill.adjust(RouteDecision("fast", "classifier", 0.3), ANYONE, lambda _: False)
    assert refused.tier == "fast"  # the precise tier would refuse the request's fields
    assert not spill.spilled


def test_off_by_default_and_unknown_drain_uses_the_assumption() -> None:
    """The default configuration never spills; before a drain rate is seen each request ahead
    counts assumed_request_s; a tier with no usable replica waits forever."""
    fast, precise = tiers()
    full(fast, running=2, waiting=6, drain=0.0)
    assert decide(Spillover(SpilloverConfig(), fast, precise), "fast").tier == "fast"
    spill = Spillover(ON, fast, precise)
    assert spill.wait_s(fast, 0.0) == 7 * 1.0
    for replica in precise.replicas:
        replica.healthy = False
    assert spill.wait_s(precise, 0.0) == float("inf")
    assert decide(spill, "fast").tier == "fast"
