"""The tier-routing stage: classifier score, threshold (fixed or online), rules, key policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from policies.ports import TierClassifier
from policies.principal import Principal
from policies.requests import RequestSummary
from policies.threshold import ControllerConfig, ShareController
from policies.tiering import RouteDecision, TierCatalog, TierRules, decide_tier, fallback_tiers
from router_models import Router


class ThresholdSource:
    """A fixed threshold; the online share controller is another implementation."""

    def __init__(self, threshold: float) -> None:
        self._threshold = threshold

    @property
    def threshold(self) -> float:
        """The current threshold on the classifier score."""
        return self._threshold

    def observe(self, sent_precise: bool, score: float | None = None) -> None:
        """A fixed threshold ignores traffic."""


class ThresholdPolicy(Protocol):
    """A fixed threshold or the online share controller (policies.threshold.ShareController)."""

    @property
    def threshold(self) -> float:
        """The threshold in force."""
        ...

    def observe(self, sent_precise: bool, score: float | None = None) -> None:
        """Record one classifier decision."""
        ...


def threshold_policy(
    fixed: float | None, target_share: float, online: bool | None, classifier: TierClassifier
) -> ThresholdPolicy:
    """The threshold in force: ``fixed``, else the artifact's for ``target_share``; online
    control (the share controller) starts from it when ``online``.  ``online=None`` (the
    default setting) means on unless a fixed threshold is configured."""
    if online is None:
        online = fixed is None
    initial = fixed
    if initial is None:
        initial = (
            classifier.threshold_for_share(target_share) if isinstance(classifier, Router) else 0.5
        )
    if online:
        return ShareController(ControllerConfig(target_share=target_share), initial)
    return ThresholdSource(initial)


class TierRouter:
    """Decides the tier of each request and the fallback order."""

    def __init__(
        self,
        catalog: TierCatalog,
        rules: TierRules,
        classifier: TierClassifier,
        threshold: ThresholdPolicy,
        *,
        fast_to_precise: bool = True,
        precise_to_fast: bool = False,
    ) -> None:
        self.catalog = catalog
        self.rules = rules
        self.classifier = classifier
        self.threshold = threshold
        self.fast_to_precise = fast_to_precise
        self.precise_to_fast = precise_to_fast

    def decide(
        self,
        summary: RequestSummary,
        body: Mapping[str, Any],
        principal: Principal,
        override: str | None,
    ) -> RouteDecision:
        """The tier for this request and why."""
        decision = decide_tier(
            summary,
            catalog=self.catalog,
            principal=principal,
            rules=self.rules,
            score=lambda: self.classifier.score(body),
            threshold=self.threshold.threshold,
            override=override,
        )
        if decision.reason == "classifier":
            self.threshold.observe(decision.tier == self.catalog.precise, decision.score)
        return decision

    def replace(self, classifier: TierClassifier, threshold: ThresholdPolicy) -> None:
        """Swap in a new classifier and its threshold (artifact reload; one assignment each,
        so a request sees the old pair or the new one, both consistent enough for one call)."""
        self.classifier = classifier
        self.threshold = threshold

    def tiers_for(self, decision: RouteDecision, principal: Principal) -> tuple[str, ...]:
        """The decided tier followed by the fallbacks this key may use."""
        return fallback_tiers(
            decision.tier,
            catalog=self.catalog,
            principal=principal,
            fast_to_precise=self.fast_to_precise,
            precise_to_fast=self.precise_to_fast,
        )
