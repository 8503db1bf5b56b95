"""Builds the issue-17 stages: shadow evaluation, usage and savings, compute budgets.

One builder for the composition root (``gateway/http/app.py``): the cost model from tier prices,
the usage ledger (memory, or Redis when the limiter uses Redis), the budget gate, the shadow
runner, the observer that feeds the ledger, their admin routes and Prometheus collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.config.settings import RateLimitSettings, RouterSettings, TierSettings
from gateway.limits.budgets import BudgetGate, MemoryBudgetStore, RedisBudgetStore
from gateway.limits.usage import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageCollector,
    UsageLedger,
    admin_usage_handlers,
)
from gateway.pipeline.context import RequestContext, RequestObserver, Trace
from gateway.routing.admin_routing import ShadowCollector, admin_routing_handlers
from gateway.routing.routing import TierRouter
from gateway.routing.shadow import Featurizer, RequestFeatures, ShadowConfig, ShadowRunner
from gateway.upstream.forwarding import Forwarder
from policies.cost import CostModel, TierPrice
from router_models import Router
from router_models.vectors import hashed_vector

FAST_RELATIVE_PRICE = 0.25  # an INT4 tier's token at about a quarter of an FP16 one's


def cost_model(tiers: Mapping[str, TierSettings], precise: str) -> CostModel:
    """Each tier's configured price; unset: 1 per 1k tokens on ``precise``, 0.25 elsewhere."""
    prices: dict[str, TierPrice] = {}
    for name, tier in tiers.items():
        if tier.cost is not None:
            prices[name] = TierPrice(*tier.cost.prices())
        else:
            unit = 1.0 if name == precise else FAST_RELATIVE_PRICE
            prices[name] = TierPrice(unit, unit)
    return CostModel(prices, precise)


def build_shadow(
    settings: RouterSettings, forwarder: Forwarder, router: TierRouter
) -> ShadowRunner | None:
    """The shadow-evaluation runner, when ``settings.shadow`` samples anything."""
    config = ShadowConfig(**settings.shadow.model_dump())
    if not config.enabled:
        return None
    return ShadowRunner(
        config,
        forwarder.routes,
        fast_tier=settings.fast_tier,
        precise_tier=settings.precise_tier,
        upstream=forwarder.upstream.current_pool,
        featurizer=router_featurizer(router),
    )


def router_featurizer(router: TierRouter) -> Featurizer:
    """The live classifier's hashed feature vector of a body (None for a non-artifact one).

    Values are rounded to 6 decimals (a stored record is about 40 % smaller; the margins it
    gives move by far less than any threshold step).
    """

    def features(body: Mapping[str, Any]) -> RequestFeatures | None:
        classifier = router.classifier
        if not isinstance(classifier, Router):
            return None
        vector = hashed_vector(body)
        return RequestFeatures(
            vector.space,
            classifier.artifact_id,
            list(vector.index),
            [round(v, 6) for v in vector.value],
        )

    return features


@dataclass
class LedgerObserver:
    """The telemetry observer, plus the usage ledger on every finished request."""

    inner: RequestObserver
    ledger: UsageLedger

    def started(self, ctx: RequestContext, headers: Mapping[str, str]) -> Trace | None:
        """As the inner observer."""
        return self.inner.started(ctx, headers)

    def finished(self, ctx: RequestContext, outcome: str) -> None:
        """Telemetry first, then the ledger."""
        self.inner.finished(ctx, outcome)
        self.ledger.record(ctx)


@dataclass
class Accounting:
    """What the builder made, for the app and its lifecycle."""

    observer: RequestObserver
    ledger: UsageLedger
    budgets: BudgetGate
    shadow: ShadowRunner | None
    handlers: list[Any] = field(default_factory=list)
    redis_usage: RedisUsageStore | None = None
    redis_budgets: RedisBudgetStore | None = None

    async def startup(self) -> None:
        """Start the usage flusher (Redis)."""
        if self.redis_usage is not None:
            self.redis_usage.start()

    async def shutdown(self) -> None:
        """Stop shadows; flush usage."""
        if self.shadow is not None:
            await self.shadow.close()
        if self.redis_usage is not None:
            await self.redis_usage.stop()
        if self.redis_budgets is not None:
            await self.redis_budgets.aclose()  # settlements still held back go out first


def build_accounting(
    tiers: Mapping[str, TierSettings],
    router_settings: RouterSettings,
    ratelimit: RateLimitSettings,
    *,
    client: Redis | None,
    key_prefix: str,
    admin_token: str | None,
    forwarder: Forwarder,
    router: TierRouter,
    observer: RequestObserver,
    registry: CollectorRegistry,
    observed_share: Callable[[], float],
) -> Accounting:
    """Shadow runner, ledger, budgets, their routes and metrics.

    Usage and budgets live in Redis (``client``, keys under ``key_prefix``) when the limiter
    does, in memory otherwise.
    """
    costs = cost_model(tiers, router_settings.precise_tier)
    shared = client is not None and ratelimit.backend == "redis"
    redis_usage = RedisUsageStore(client, key_prefix) if shared and client is not None else None
    ledger = UsageLedger(costs, redis_usage or MemoryUsageStore())
    store = (
        RedisBudgetStore(client, key_prefix)
        if shared and client is not None
        else MemoryBudgetStore()
    )
    budgets = BudgetGate(store, costs, fail_open=ratelimit.on_redis_error == "open")
    shadow = build_shadow(router_settings, forwarder, router)
    registry.register(UsageCollector(ledger))
    if shadow is not None:
        registry.register(ShadowCollector(shadow))
    handlers = [
        *admin_usage_handlers(ledger, admin_token),
        *admin_routing_handlers(router, shadow, observed_share, router_settings, admin_token),
    ]
    return Accounting(
        LedgerObserver(observer, ledger),
        ledger,
        budgets,
        shadow,
        handlers,
        redis_usage,
        store if isinstance(store, RedisBudgetStore) else None,
    )
