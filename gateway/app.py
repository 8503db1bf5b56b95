"""The composition root: ``create_app(settings)`` builds every stage once and wires them."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping, Sequence
from contextvars import Context
from dataclasses import dataclass
from typing import Any

import aiohttp
from litestar import Litestar, Request, Response, post
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.registry import Collector

import router_models
from gateway.accounting import Accounting, build_accounting
from gateway.admin_backends import admin_backends_handlers
from gateway.auth import Access
from gateway.errors import EXCEPTION_HANDLERS
from gateway.forwarding import Forwarder, TierRoute
from gateway.health import HealthConfig, HealthMonitor
from gateway.ops import Readiness, ops_handlers
from gateway.proxy import ProxyService, RequestObserver
from gateway.replicas import EjectionPolicy, ReplicaPool
from gateway.request_body import FieldRules
from gateway.retry import RetryPolicy
from gateway.routing import TierRouter, threshold_policy
from gateway.settings import BalancingSettings, Settings, TierSettings
from gateway.spillover import Spillover, SpilloverConfig
from gateway.telemetry import build_telemetry
from gateway.upstream import make_session
from gateway.worker_share import HealthShare, WorkerRole
from policies.fields import FieldPolicy
from policies.ports import Authenticator, RequestLimiter, TierClassifier
from policies.prefix import PrefixConfig
from policies.selection import LeastLoaded, PrefixAffinity, RoundRobin, Strategy
from policies.tiering import TierCatalog, TierRules

_GC_GEN0_THRESHOLD = 10_000
# With start-up objects frozen and the young generation collected less often, a reference
# cycle that reached the old generation could wait a long time for a full collection; one runs
# at least this often, so garbage cycles cost time, never memory that is not given back.
_FULL_COLLECTION_INTERVAL_S = 10.0


def _strategy(tier: TierSettings, balancing: BalancingSettings) -> Strategy:
    if tier.strategy == "round_robin":
        return RoundRobin()
    if tier.strategy == "least_loaded":
        return LeastLoaded()
    b = balancing
    return PrefixAffinity(
        tier.model,
        load_factor=b.load_factor,
        load_slack=b.load_slack,
        imbalance_abs=b.imbalance_abs,
        imbalance_rel=b.imbalance_rel,
    )


def _spillover(settings: Settings, pools: Mapping[str, ReplicaPool]) -> Spillover | None:
    config = SpilloverConfig(**settings.spillover.model_dump())
    if not config.enabled:
        return None
    return Spillover(config, pools[settings.router.fast_tier], pools[settings.router.precise_tier])


def build_router(settings: Settings, classifier: TierClassifier) -> TierRouter:
    """The tier-routing stage from settings."""
    r = settings.router
    catalog = TierCatalog(
        {name: tier.model for name, tier in settings.tiers.items()},
        fast=r.fast_tier,
        precise=r.precise_tier,
    )
    rules = TierRules(
        structured_output_to_precise=r.structured_output_to_precise,
        tools_to_precise=r.tools_to_precise,
        long_prompt_tokens=r.long_prompt_tokens,
    )
    threshold = threshold_policy(r.threshold, r.target_precise_share, r.online_control, classifier)
    return TierRouter(
        catalog,
        rules,
        classifier,
        threshold,
        fast_to_precise=r.fallback_to_precise,
        precise_to_fast=r.downgrade_to_fast,
    )


def _upstream_headers(tier: TierSettings) -> dict[str, str]:
    key = tier.read_api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def build_backends(
    settings: Settings,
) -> tuple[dict[str, ReplicaPool], dict[str, TierRoute], HealthMonitor]:
    """Each tier's replica pool and route, and the monitor that keeps their health current."""
    h = settings.health
    ejection = EjectionPolicy(h.eject_after, h.eject_base_s, h.eject_max_s, h.max_ejected_share)
    pools = {
        name: ReplicaPool(
            name,
            tier.replicas,
            tier.max_concurrency,
            tier.max_queue_wait_s,
            ejection,
            health_path=tier.health_path,
            kind=tier.kind,
        )
        for name, tier in settings.tiers.items()
    }
    routes = {
        name: TierRoute(
            pools[name],
            _strategy(tier, settings.balancing),
            tier.timeouts,
            tier.model,
            _upstream_headers(tier),
        )
        for name, tier in settings.tiers.items()
    }
    monitor = HealthMonitor(
        pools,
        HealthConfig(
            h.interval_s, h.timeout_s, h.unhealthy_after, h.healthy_after, h.scrape_metrics
        ),
        credentials={name: route.upstream_headers for name, route in routes.items()},
    )
    return pools, routes, monitor


def build_service(
    settings: Settings,
    *,
    access: Access,
    router: TierRouter,
    forwarder: Forwarder,
    observer: RequestObserver,
    pools: Mapping[str, ReplicaPool],
    accounting: Accounting | None = None,
) -> ProxyService:
    """The request pipeline: authenticate, limit, route, forward, observe."""
    return ProxyService(
        auth=access.authenticator,
        limiter=access.limiter,
        router=router,
        forwarder=forwarder,
        tier_caps={name: tier.max_tokens_cap for name, tier in settings.tiers.items()},
        idle_timeouts={name: tier.timeouts.idle_s for name, tier in settings.tiers.items()},
        default_max_tokens={
            name: min(tier.default_max_tokens or tier.max_tokens_cap, tier.max_tokens_cap)
            for name, tier in settings.tiers.items()
        },
        observer=observer,
        prefix=PrefixConfig(settings.balancing.block_chars, settings.balancing.max_blocks),
        spillover=_spillover(settings, pools),
        fields=FieldRules(
            structured={name: tier.structured_outputs for name, tier in settings.tiers.items()},
            remote_media={name: tier.allow_remote_media for name, tier in settings.tiers.items()},
            policy=FieldPolicy(
                settings.requests.unknown_fields, frozenset(settings.requests.allowed_extra_fields)
            ),
            max_depth=settings.requests.max_json_depth,
        ),
        shadow=accounting.shadow if accounting is not None else None,
        budgets=accounting.budgets if accounting is not None else None,
    )


async def _collect_garbage_periodically(interval_s: float) -> None:
    """A full garbage collection every ``interval_s`` (start-up objects are frozen: it is short)."""
    while True:
        await asyncio.sleep(interval_s)
        gc.collect()


@dataclass
class _Lifecycle:
    """Start-up and shutdown of what the handlers share: the upstream session, health, access."""

    forwarder: Forwarder
    readiness: Readiness
    monitor: HealthMonitor
    access: Access
    accounting: Accounting
    collector: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        session = make_session()
        self.forwarder.session = session
        self.readiness.session = session
        self.monitor.start(session)
        await self.access.startup()
        await self.accounting.startup()
        # Everything built so far lives as long as the process: move it out of the collector's
        # reach so full collections stay short (fewer latency spikes under load), and collect
        # the young generation less often (request objects mostly die by reference counting).
        gc.collect()
        gc.freeze()
        gc.set_threshold(_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        self.collector = asyncio.get_running_loop().create_task(
            _collect_garbage_periodically(_FULL_COLLECTION_INTERVAL_S), context=Context()
        )

    async def shutdown(self) -> None:
        if self.collector is not None:
            self.collector.cancel()
        await self.accounting.shutdown()
        await self.monitor.stop()
        session: aiohttp.ClientSession | None = self.forwarder.session
        if session is not None:
            await session.close()
        await self.access.shutdown()


def create_app(
    settings: Settings,
    *,
    auth: Authenticator | None = None,
    limiter: RequestLimiter | None = None,
    observer: RequestObserver | None = None,
    span_exporter: SpanExporter | None = None,
    collectors: Sequence[Collector] = (),
    worker: WorkerRole | None = None,
) -> Litestar:
    """Build the gateway application for ``settings``.

    ``observer`` replaces the telemetry observer; ``span_exporter`` (tests) receives every
    finished span instead of the ``OTEL_*``-configured exporters; ``collectors`` join the
    app's metrics registry (the server's connection counters); ``worker`` says which of
    several workers this process is (one prober, metrics of the whole group).
    """
    pools, routes, monitor = build_backends(settings)
    router = build_router(settings, router_models.load(settings.router.artifact))
    if worker is not None and worker.count > 1:
        monitor.share = HealthShare(worker, pools)
        monitor.follower = not worker.leader
    telemetry = build_telemetry(settings, pools, span_exporter=span_exporter, worker=worker)
    access = Access(settings, auth=auth, limiter=limiter)
    telemetry.registry.register(access.metrics)  # ratelimit backend-degraded gauge and counter
    for collector in collectors:
        telemetry.registry.register(collector)
    authenticator = access.authenticator
    forwarder = Forwarder(None, routes, RetryPolicy(**settings.retry.model_dump()))  # type: ignore[arg-type]  # session opens at start-up
    readiness = Readiness(pools)
    readiness.monitor = monitor
    accounting = build_accounting(
        settings,
        client=access.client,
        forwarder=forwarder,
        router=router,
        observer=observer or telemetry.observer,
        registry=telemetry.registry,
        observed_share=telemetry.metrics.share.share,
    )
    service = build_service(
        settings,
        access=access,
        router=router,
        forwarder=forwarder,
        observer=accounting.observer,
        pools=pools,
        accounting=accounting,
    )
    lifecycle = _Lifecycle(forwarder, readiness, monitor, access, accounting)
    admin_token = settings.auth.read_admin_token()

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "chat", "/v1/chat/completions")

    @post("/v1/completions", status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "completion", "/v1/completions")

    return Litestar(
        route_handlers=[
            chat,
            completions,
            *ops_handlers(router.catalog, readiness, authenticator),
            *access.handlers,
            *telemetry.handlers,
            *admin_backends_handlers(forwarder, admin_token),
            *accounting.handlers,
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        on_startup=[lifecycle.startup, telemetry.startup],
        on_shutdown=[lifecycle.shutdown, telemetry.shutdown],
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        debug=False,
    )
