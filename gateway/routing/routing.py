"""The tier-routing stage: classifier score, threshold (fixed or online), rules, key policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from policies.dial import (
    DEFAULT_MAX_TENANTS,
    DialTargets,
    FixedDial,
    RecentSample,
    TenantDial,
    View,
    dial_config,
)
from policies.ports import TierClassifier
from policies.principal import Principal
from policies.requests import RequestSummary
from policies.threshold import ControllerState
from policies.tiering import RouteDecision, TierCatalog, TierRules, decide_tier, fallback_tiers
from router_models import Router
from router_models.packaging import unwrap


class Dial(Protocol):
    """The threshold each tenant's requests meet: per-tenant share controllers
    (policies.dial.TenantDial) or one fixed threshold (policies.dial.FixedDial)."""

    targets: DialTargets

    def threshold_for(self, tenant: str) -> float:
        """The threshold in force for ``tenant``."""
        ...

    def observe(self, tenant: str, sent_precise: bool, score: float | None = None) -> None:
        """Record one classifier decision of ``tenant``."""
        ...

    def apply(self, targets: DialTargets) -> list[str]:
        """Take new targets; the tenants whose target changed."""
        ...

    def tenants(self) -> list[str]:
        """Tenants with a controller."""
        ...

    def own_threshold(self, tenant: str) -> float:
        """This worker's own threshold for ``tenant`` (before the fleet's is known)."""
        ...

    def local_view(self) -> dict[str, View]:
        """This worker's tenants, for the other workers."""
        ...

    def set_fleet(self, thresholds: Mapping[str, float]) -> None:
        """Every worker's thresholds combined, per tenant."""
        ...

    def state(self, tenant: str) -> ControllerState:
        """Threshold, target and observed share of ``tenant``."""
        ...


def calibration(classifier: TierClassifier) -> Callable[[float], float]:
    """The threshold for a share before any traffic: the artifact's reference calibration
    (0.5 for a classifier that has none)."""
    if isinstance(classifier, Router):
        return classifier.threshold_for_share
    return lambda share: 0.5


def build_dial(
    fixed: float | None,
    target_share: float,
    online: bool | None,
    classifier: TierClassifier,
    *,
    max_tenants: int = DEFAULT_MAX_TENANTS,
) -> TenantDial | FixedDial:
    """Per-tenant controllers starting from ``fixed`` or the artifact's calibration, or one
    fixed threshold when online control is off. ``online=None`` (the default setting) means
    on unless a fixed threshold is configured."""
    if online is None:
        online = fixed is None
    targets = DialTargets(target_share)
    if not online:
        return FixedDial(
            fixed if fixed is not None else calibration(classifier)(target_share), targets
        )
    calibrate = calibration(classifier) if fixed is None else (lambda share: fixed)
    return TenantDial(dial_config(target_share), calibrate, targets, max_tenants=max_tenants)


RECENT_BODIES = 2000
RECENT_MAX_TOKENS = 2000


class TierRouter:
    """Decides the tier of each request and the fallback order."""

    def __init__(
        self,
        catalog: TierCatalog,
        rules: TierRules,
        classifier: TierClassifier,
        dial: Dial,
        *,
        fast_to_precise: bool = True,
        precise_to_fast: bool = False,
        recent: int = RECENT_BODIES,
        unwrap_packaging: bool = True,
    ) -> None:
        self.catalog = catalog
        self.rules = rules
        self.classifier = classifier
        self.dial = dial
        self.fast_to_precise = fast_to_precise
        self.precise_to_fast = precise_to_fast
        self.unwrap_packaging = unwrap_packaging
        # Recent classifier-routed bodies, tenant-balanced: what a reloaded artifact is
        # calibrated on before it goes live. Bodies of long prompts are not kept (memory).
        self.recent: RecentSample[Mapping[str, Any]] = RecentSample(max(1, recent))

    def decide(
        self,
        summary: RequestSummary,
        body: Mapping[str, Any],
        principal: Principal,
        override: str | None,
    ) -> RouteDecision:
        """The tier for this request and why."""
        tenant = principal.tenant
        decision = decide_tier(
            summary,
            catalog=self.catalog,
            principal=principal,
            rules=self.rules,
            score=lambda: self.score(self.classifier, body),
            threshold=self.dial.threshold_for(tenant),
            override=override,
        )
        if decision.reason == "classifier":
            self.dial.observe(tenant, decision.tier == self.catalog.precise, decision.score)
            if summary.prompt_token_estimate <= RECENT_MAX_TOKENS:
                self.recent.add(tenant, dict(body))  # the pipeline edits the body later
        return decision

    def score(self, classifier: TierClassifier, body: Mapping[str, Any]) -> float:
        """``classifier``'s score of the user's own words (``router_models.packaging``: LaTeX,
        code fences, chain-of-thought phrasing, padding and numbers the request does not refer
        to are not scored), or of the body as sent when unwrapping is off."""
        return classifier.score(unwrap(body) if self.unwrap_packaging else body)

    def replace(self, classifier: TierClassifier) -> None:
        """Swap in a new classifier (artifact reload: the dial is re-seeded first)."""
        self.classifier = classifier

    def tiers_for(self, decision: RouteDecision, principal: Principal) -> tuple[str, ...]:
        """The decided tier followed by the fallbacks this key may use."""
        return fallback_tiers(
            decision.tier,
            catalog=self.catalog,
            principal=principal,
            fast_to_precise=self.fast_to_precise,
            precise_to_fast=self.precise_to_fast,
        )
