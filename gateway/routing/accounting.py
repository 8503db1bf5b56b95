"""Builds the issue-17 stages: shadow evaluation, usage and savings, compute budgets.

One builder for the composition root (``gateway/http/app.py``): the cost model from tier prices,
the usage ledger (memory, or Redis when the limiter uses Redis), the budget gate, the shadow
runner, the observer that feeds the ledger, their admin routes and Prometheus collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.config.pricing import tier_prices
from gateway.config.redis_client import BackendHealth
from gateway.config.router_settings import RouterSettings
from gateway.config.settings import RateLimitSettings
from gateway.config.tier_settings import TierSettings
from gateway.limits.budget_outage import FailOpenBudgetStore
from gateway.limits.budget_stores import BudgetStore, MemoryBudgetStore, RedisBudgetStore
from gateway.limits.budgets import BudgetGate
from gateway.limits.precise_cap import (
    EscalationTracker,
    PreciseShareCap,
    PreciseShareCollector,
    RedisShareWindows,
    build_precise_cap,
)
from gateway.limits.usage import (
    MemoryUsageStore,
    RedisUsageStore,
    UsageCollector,
    UsageLedger,
    admin_usage_handlers,
)
from gateway.pipeline.context import RequestContext, RequestObserver, Trace
from gateway.routing.admin_routing import ArtifactReloader, ShadowCollector, admin_routing_handlers
from gateway.routing.dial_sync import DialSync, dial_store
from gateway.routing.routing import TierRouter
from gateway.routing.shadow import Featurizer, RequestFeatures, ShadowConfig, ShadowRunner
from gateway.upstream.forwarding import Forwarder
from policies.cost import CostModel
from policies.errors import InvalidRequest
from policies.shadow_budget import worker_share
from router_models import Router
from router_models.vectors import hashed_vector

_log = structlog.get_logger("tiergate.router")
EVENT_BUDGET_REDIS_DOWN = "budget.redis_unavailable"
EVENT_BUDGET_REDIS_UP = "budget.redis_recovered"


def cost_model(tiers: Mapping[str, TierSettings], precise: str) -> CostModel:
    """Each tier's configured price; unset: 1 per 1k tokens on ``precise``, 0.25 elsewhere."""
    return CostModel(tier_prices(tiers, precise), precise)


def shadow_config(settings: RouterSettings, workers: int = 1) -> ShadowConfig:
    """``settings.shadow`` for one of ``workers`` processes: each takes its share of the
    per-tenant sample cap (``policies.shadow_budget.worker_share``)."""
    values = settings.shadow.model_dump()
    cap = values["tenant_samples_per_minute"]
    values["tenant_samples_per_minute"] = worker_share(cap, workers)
    return ShadowConfig(**values)


def build_shadow(
    settings: RouterSettings,
    forwarder: Forwarder,
    router: TierRouter,
    ledger: UsageLedger | None = None,
    *,
    workers: int = 1,
) -> ShadowRunner | None:
    """The shadow-evaluation runner, when ``settings.shadow`` samples anything; what its
    calls spend goes to ``ledger`` (apart from every tenant)."""
    config = shadow_config(settings, workers)
    if not config.enabled:
        return None
    return ShadowRunner(
        config,
        forwarder.routes,
        fast_tier=settings.fast_tier,
        precise_tier=settings.precise_tier,
        upstream=forwarder.upstream.current_pool,
        featurizer=router_featurizer(router),
        on_usage=ledger.record_shadow if ledger is not None else lambda *_: None,
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
    redis_budgets: RedisBudgetStore | FailOpenBudgetStore | None = None
    dial: DialSync | None = None
    precise_cap: PreciseShareCap | None = None
    escalation: EscalationTracker | None = None
    redis_windows: RedisShareWindows | None = None

    async def startup(self) -> None:
        """Start the usage flusher (Redis), the budgets' payback loop (outages) and follow
        the live dial."""
        if self.redis_usage is not None:
            self.redis_usage.start()
        if isinstance(self.redis_budgets, FailOpenBudgetStore):
            self.redis_budgets.start()
        if self.dial is not None:
            await self.dial.startup()

    async def shutdown(self) -> None:
        """Stop following the dial and shadows; flush usage."""
        if self.dial is not None:
            await self.dial.shutdown()
        if self.shadow is not None:
            await self.shadow.close()
        if self.redis_usage is not None:
            await self.redis_usage.stop()
        if self.redis_budgets is not None:
            await self.redis_budgets.aclose()  # settlements still held back go out first
        if self.redis_windows is not None:
            await self.redis_windows.aclose()


def _budget_store(
    ratelimit: RateLimitSettings,
    client: Redis | None,
    key_prefix: str,
    local_share: Callable[[], int],
) -> BudgetStore:
    """Memory without ``client``; Redis, through outages too when ``on_redis_error: open``."""
    if client is None:
        return MemoryBudgetStore()
    remote = RedisBudgetStore(client, key_prefix)
    if ratelimit.on_redis_error != "open":
        return remote
    health = BackendHealth(
        "redis",
        down_event=EVENT_BUDGET_REDIS_DOWN,
        up_event=EVENT_BUDGET_REDIS_UP,
        retry_interval_s=ratelimit.redis_retry_interval_s,
    )
    return FailOpenBudgetStore(remote, health, local_share)


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
    share_dir: Path | None = None,
    local_share: Callable[[], int] = lambda: 1,
    workers: int = 1,
) -> Accounting:
    """Shadow runner, ledger, budgets, their routes and metrics.

    Usage and budgets live in Redis (``client``, keys under ``key_prefix``) when the limiter
    does, in memory otherwise. With ``on_redis_error: open`` budgets outlive a Redis outage
    (:mod:`gateway.limits.budget_outage`), each process enforcing ``1 / local_share()`` of what
    is left.
    """
    costs = cost_model(tiers, router_settings.precise_tier)
    shared = client is not None and ratelimit.backend == "redis"
    redis_usage = RedisUsageStore(client, key_prefix) if shared and client is not None else None
    ledger = UsageLedger(costs, redis_usage or MemoryUsageStore())
    store = _budget_store(ratelimit, client if shared else None, key_prefix, local_share)
    budgets = BudgetGate(store, costs, fail_open=ratelimit.on_redis_error == "open")
    shadow = build_shadow(router_settings, forwarder, router, ledger, workers=workers)
    cap, windows = build_precise_cap(
        ratelimit, router_settings, client=client if shared else None, key_prefix=key_prefix
    )
    escalation = EscalationTracker(observed_share)
    registry.register(PreciseShareCollector(cap, escalation))
    registry.register(UsageCollector(ledger))
    if shadow is not None:
        registry.register(ShadowCollector(shadow))
    reloader = ArtifactReloader(router, router_settings)
    sync = build_dial_sync(router_settings, router, reloader, client, key_prefix, share_dir)
    handlers = [
        *admin_usage_handlers(ledger, admin_token),
        *admin_routing_handlers(
            router, shadow, observed_share, router_settings, admin_token, sync, reloader
        ),
    ]
    return Accounting(
        LedgerObserver(observer, ledger),
        ledger,
        budgets,
        shadow,
        handlers,
        redis_usage,
        store if isinstance(store, RedisBudgetStore | FailOpenBudgetStore) else None,
        sync,
        cap,
        escalation,
        windows,
    )


def build_dial_sync(  # noqa: PLR0917  # one builder for the composition root
    settings: RouterSettings,
    router: TierRouter,
    reloader: ArtifactReloader,
    client: Redis | None,
    key_prefix: str,
    share_dir: Path | None,
) -> DialSync:
    """The live dial over Redis (every replica), the workers' directory, or memory."""

    async def follow_reload() -> None:
        try:
            await reloader.reload()
        except InvalidRequest as exc:  # the worker that took the call answered 400 already
            _log.warning("router.reload_failed", error=exc.message)

    return DialSync(
        dial_store(client, key_prefix, share_dir),
        router.dial,
        follow_reload,
        settings.target_precise_share,
        settings.dial_sync_interval_s,
    )
