"""Load-aware spill-over: borderline requests leave a saturated fast tier for an idle precise one.

When the classifier sent a request to the fast tier with a score just below the threshold
(within ``margin``), the fast tier's replicas report more than ``fast_waiting`` requests
waiting on average, and the precise tier is below ``precise_max_utilisation`` of its
concurrency with nothing waiting, the request goes to the precise tier instead, with the
route reason ``spillover``. Off by default; ``spilled`` counts it for the metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.upstream.replicas import ReplicaPool
from policies.principal import Principal
from policies.tiering import RouteDecision

REASON = "spillover"


@dataclass(frozen=True, slots=True)
class SpilloverConfig:
    """When a borderline request may spill from the fast tier to the precise tier."""

    enabled: bool = False
    margin: float = 0.1
    fast_waiting: float = 4.0
    precise_max_utilisation: float = 0.5


class Spillover:
    """Decides, per request, whether a borderline fast-tier request spills over."""

    def __init__(
        self,
        config: SpilloverConfig,
        fast: ReplicaPool,
        precise: ReplicaPool,
    ) -> None:
        self.config = config
        self.fast = fast
        self.precise = precise
        self.spilled = 0

    def fast_saturated(self, now: float) -> bool:
        """The fast tier's usable replicas have a long waiting queue (or none is usable)."""
        usable = self.fast.usable(now)
        if not usable:
            return True
        return sum(r.waiting for r in usable) / len(usable) > self.config.fast_waiting

    def precise_has_headroom(self, now: float) -> bool:
        """The precise tier has usable replicas, little in flight and nothing waiting."""
        usable = self.precise.usable(now)
        if not usable:
            return False
        capacity = sum(r.max_concurrency for r in usable)
        busy = sum(max(float(r.in_flight), r.running) for r in usable)
        waiting = sum(r.waiting for r in usable)
        return waiting < 1 and busy / capacity < self.config.precise_max_utilisation

    def adjust(
        self, decision: RouteDecision, threshold: float, principal: Principal
    ) -> RouteDecision:
        """``decision`` or, for a borderline fast request under saturation, the precise tier."""
        config = self.config
        score = decision.score
        if (
            not config.enabled
            or decision.reason != "classifier"
            or decision.tier != self.fast.tier
            or score is None
            or score < threshold - config.margin
            or not principal.policy.allows_tier(self.precise.tier)
        ):
            return decision
        now = time.monotonic()
        if not (self.fast_saturated(now) and self.precise_has_headroom(now)):
            return decision
        self.spilled += 1
        return RouteDecision(tier=self.precise.tier, reason=REASON, score=score)
