"""Load-aware spill-over: which requests leave a saturated fast tier, and when."""

from __future__ import annotations

from gateway.routing.spillover import REASON, Spillover, SpilloverConfig
from gateway.upstream.replicas import ReplicaPool
from policies.principal import KeyPolicy, Principal
from policies.tiering import RouteDecision

ON = SpilloverConfig(enabled=True, margin=0.1, fast_waiting=4.0, precise_max_utilisation=0.5)
ANYONE = Principal(key_id="k", tenant="t", policy=KeyPolicy())
THRESHOLD = 0.5


def pools(fast_waiting: float = 10.0, precise_in_flight: int = 0) -> tuple[ReplicaPool, ...]:
    """A fast tier with ``fast_waiting`` queued per replica and a precise tier of 2 x 8 slots."""
    fast = ReplicaPool("fast", ["http://f1:8000", "http://f2:8000"], 8, 0.1)
    precise = ReplicaPool("precise", ["http://p1:8000", "http://p2:8000"], 8, 0.1)
    for replica in fast.replicas:
        replica.waiting = fast_waiting
    precise.replicas[0].in_flight = precise_in_flight
    return fast, precise


def decide(
    spill: Spillover, score: float, reason: str = "classifier", principal: Principal = ANYONE
) -> RouteDecision:
    """Adjust a fast-tier decision with ``score``."""
    return spill.adjust(RouteDecision("fast", reason, score), THRESHOLD, principal)


def test_borderline_request_spills_when_fast_is_saturated() -> None:
    """Score within the margin, fast queue long, precise idle: precise, reason spillover."""
    spill = Spillover(ON, *pools())
    decision = decide(spill, 0.45)
    assert (decision.tier, decision.reason, decision.score) == ("precise", REASON, 0.45)
    assert spill.spilled == 1


def test_clear_fast_requests_stay() -> None:
    """A score well below the threshold stays on the fast tier even under saturation."""
    spill = Spillover(ON, *pools())
    assert decide(spill, 0.2).tier == "fast"
    assert spill.spilled == 0


def test_no_spill_without_saturation() -> None:
    """A short fast queue keeps borderline requests on the fast tier."""
    assert decide(Spillover(ON, *pools(fast_waiting=1.0)), 0.45).tier == "fast"


def test_no_spill_when_precise_is_busy() -> None:
    """A precise tier above its utilisation limit gets no extra work."""
    assert decide(Spillover(ON, *pools(precise_in_flight=9)), 0.45).tier == "fast"


def test_only_classifier_decisions_spill() -> None:
    """Explicit tiers and rules are never second-guessed."""
    assert decide(Spillover(ON, *pools()), 0.45, reason="explicit").tier == "fast"


def test_off_by_default() -> None:
    """The default configuration never spills."""
    assert decide(Spillover(SpilloverConfig(), *pools()), 0.45).tier == "fast"


def test_keys_without_the_precise_tier_do_not_spill() -> None:
    """A key limited to the fast tier stays there."""
    fast_only = Principal(
        key_id="k", tenant="t", policy=KeyPolicy(allowed_tiers=frozenset({"fast"}))
    )
    assert decide(Spillover(ON, *pools()), 0.45, principal=fast_only).tier == "fast"
