"""Spill across tiers: a request goes to the other tier when that starts it sooner.

Each tier's wait is estimated from its replicas' own signals and the gateway's in-flight counts
(:func:`gateway.upstream.signals.tier_wait_s`: the requests ahead of a new one over the
replica's observed drain rate, the best usable replica's), plus the wait in the gateway's own
queue ahead of the request's priority class (:meth:`ReplicaPool.queue_wait_s`). A request the
classifier routed to one tier goes to the other when the other's estimate plus ``margin_s`` is
still below its own, and the key allows it: **up** (fast → precise, route reason ``spill_up``)
when the key may use the precise tier; **down** (precise → fast, ``spill_down``) only with the
``downgrade`` scope. Explicit tiers, overrides and rules (tools, structured output, long
prompts) are never moved, nor a request whose fields the other tier refuses, nor one dearer
there than a whole budget of its key (the caller's ``accepts``). The spilled
decision then goes through the precise-share caps and budgets like any other
(gateway/http/proxy.py ``_admit``), so a spill up counts as a precise request. Off by default;
``spilled`` counts spills by direction (also in ``tiergate_route_decisions_total`` under their
reasons).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.signals import tier_wait_s
from policies.principal import SCOPE_DOWNGRADE, Principal
from policies.tiering import RouteDecision

UP = "spill_up"
DOWN = "spill_down"


@dataclass(frozen=True, slots=True)
class SpilloverConfig:
    """When a request may spill to the other tier."""

    enabled: bool = False
    margin_s: float = 0.25
    assumed_request_s: float = 1.0


class Spillover:
    """Decides, per request, whether a classifier-routed request spills to the other tier."""

    def __init__(self, config: SpilloverConfig, fast: ReplicaPool, precise: ReplicaPool) -> None:
        self.config = config
        self.fast = fast
        self.precise = precise
        self.spilled: Counter[str] = Counter()

    def wait_s(self, pool: ReplicaPool, now: float, priority: str = "interactive") -> float:
        """The estimated wait before a request of class ``priority`` sent to ``pool`` now
        starts: its replicas' (the engines' queues) and the gateway's own queue ahead of it."""
        assumed = self.config.assumed_request_s
        return tier_wait_s(pool.usable(now), assumed) + pool.queue_wait_s(priority, assumed)

    def _target(self, decision: RouteDecision, principal: Principal) -> tuple[ReplicaPool, str]:
        """The other tier and the direction, when the key may spill there."""
        policy = principal.policy
        if decision.tier == self.fast.tier and policy.allows_tier(self.precise.tier):
            return self.precise, UP
        if (
            decision.tier == self.precise.tier
            and policy.has_scope(SCOPE_DOWNGRADE)
            and policy.allows_tier(self.fast.tier)
        ):
            return self.fast, DOWN
        raise LookupError

    def adjust(
        self,
        decision: RouteDecision,
        principal: Principal,
        accepts: Callable[[str], bool] = lambda _: True,
    ) -> RouteDecision:
        """``decision``, or the other tier when that starts the request sooner by the margin
        and ``accepts`` the request's fields there."""
        config = self.config
        if not config.enabled or decision.reason != "classifier":
            return decision
        own = {self.fast.tier: self.fast, self.precise.tier: self.precise}.get(decision.tier)
        if own is None:
            return decision
        now = time.monotonic()
        priority = principal.policy.priority
        own_wait = self.wait_s(own, now, priority)
        if own_wait <= config.margin_s:
            return decision  # the common case: nothing to gain elsewhere
        try:
            other, direction = self._target(decision, principal)
        except LookupError:
            return decision
        other_wait = self.wait_s(other, now, priority)
        if other_wait + config.margin_s >= own_wait or not accepts(other.tier):
            return decision
        self.spilled[direction] += 1
        return RouteDecision(tier=other.tier, reason=direction, score=decision.score)
