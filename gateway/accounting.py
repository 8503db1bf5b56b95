"""Builds the issue-17 stages: shadow evaluation, usage and savings, compute budgets.

One builder for the composition root (``gateway/app.py``): the cost model from tier prices,
the usage ledger (memory, or Redis when the limiter uses Redis), the budget gate, the shadow
runner, the observer that feeds the ledger, their admin routes and Prometheus collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.admin_routing import ShadowCollector, admin_routing_handlers
from gateway.budgets import BudgetGate, MemoryBudgetStore, RedisBudgetStore
from gateway.context import RequestContext, Trace
from gateway.forwarding import Forwarder
from gateway.proxy import RequestObserver
from gateway.routing import TierRouter
from gateway.settings import Settings
from gateway.shadow import Featurizer, RequestFeatures, ShadowConfig, ShadowRunner
from gateway.usage import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageCollector,
    UsageLedger,
    admin_usage_handlers,
)
from policies.cost import CostModel, TierPrice
from router_models import Router
from router_models.vectors import hashed_vector

FAST_RELATIVE_PRICE = 0.25  # an INT4 tier's token at about a quarter of an FP16 one's


def cost_model(settings: Settings) -> CostModel:
    """Each tier's configured price; unset: 1 per 1k tokens on precise, 0.25 elsewhere."""
    precise = settings.router.precise_tier
    prices: dict[str, TierPrice] = {}
    for name, tier in settings.tiers.items():
        if tier.cost is not None:
            prices[name] = TierPrice(*tier.cost.prices())
        else:
            unit = 1.0 if name == precise else FAST_RELATIVE_PRICE
            prices[name] = TierPrice(unit, unit)
    return CostModel(prices, precise)


def build_shadow(
    settings: Settings, forwarder: Forwarder, router: TierRouter
) -> ShadowRunner | None:
    """The shadow-evaluation runner, when ``router.shadow`` samples anything."""
    config = ShadowConfig(**settings.router.shadow.model_dump())
    if not config.enabled:
        return None
    return ShadowRunner(
        config,
        forwarder.routes,
        fast_tier=settings.router.fast_tier,
        precise_tier=settings.router.precise_tier,
        session=lambda: forwarder.session,
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
    settings: Settings,
    *,
    client: Redis | None,
    forwarder: Forwarder,
    router: TierRouter,
    observer: RequestObserver,
    registry: CollectorRegistry,
    observed_share: Callable[[], float],
) -> Accounting:
    """Shadow runner, ledger, budgets, their routes and metrics."""
    costs = cost_model(settings)
    shared = client is not None and settings.ratelimit.backend == "redis"
    prefix = settings.redis.key_prefix
    redis_usage = RedisUsageStore(client, prefix) if shared and client is not None else None
    ledger = UsageLedger(costs, redis_usage or MemoryUsageStore())
    store = (
        RedisBudgetStore(client, prefix) if shared and client is not None else MemoryBudgetStore()
    )
    budgets = BudgetGate(store, costs, fail_open=settings.ratelimit.on_redis_error == "open")
    shadow = build_shadow(settings, forwarder, router)
    registry.register(UsageCollector(ledger))
    if shadow is not None:
        registry.register(ShadowCollector(shadow))
    token = settings.auth.read_admin_token()
    handlers = [
        *admin_usage_handlers(ledger, token),
        *admin_routing_handlers(router, shadow, observed_share, settings.router, token),
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
