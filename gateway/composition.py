"""The composition root: every long-lived object of a gateway, built once, in one place.

:func:`build_gateway` is the only function that sees the whole ``Settings``; each builder it
calls gets the sections it needs. Nothing is patched after construction: what needs the
event loop (the upstream session) is opened at start-up by the object that owns it.
``create_app`` (``gateway/http/app.py``) then wires the built :class:`Gateway` into Litestar.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from litestar import Litestar
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.registry import Collector

import router_models
from gateway.access.auth import Access, build_access, uses_redis
from gateway.config.redis_client import open_redis
from gateway.config.router_settings import RouterSettings, SpilloverSettings
from gateway.config.settings import (
    BalancingSettings,
    HealthSettings,
    QueueSettings,
    RequestSettings,
    Settings,
)
from gateway.config.tier_settings import TierSettings
from gateway.http.admin_backends import admin_backends_handlers
from gateway.http.app import Gateway, app_for
from gateway.http.connections import ConnectionCollector, ConnectionGuard
from gateway.http.native import Handler
from gateway.http.ops import Readiness, ops_handlers
from gateway.http.proxy import ProxyService
from gateway.http.server import run
from gateway.limits.limits import LimitMetrics, build_limiter, limiter_lease_s
from gateway.pipeline.context import RequestObserver
from gateway.pipeline.errors import Refused
from gateway.pipeline.request_body import FieldRules
from gateway.routing.accounting import Accounting, build_accounting
from gateway.routing.routing import TierRouter, build_dial
from gateway.routing.spillover import Spillover, SpilloverConfig
from gateway.telemetry import Telemetry, build_telemetry
from gateway.telemetry.logging import register_secret
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.health import HealthConfig, HealthMonitor
from gateway.upstream.keys import UpstreamKeys
from gateway.upstream.replicas import EjectionPolicy, QueueSetup, ReplicaPool
from gateway.upstream.retry import RetryPolicy
from gateway.upstream.worker_share import HealthShare, WorkerRole
from policies.fields import FieldPolicy
from policies.ports import Authenticator, RequestLimiter, TierClassifier
from policies.prefix import PrefixConfig
from policies.selection import LeastLoaded, PrefixAffinity, RoundRobin, Strategy
from policies.tiering import TierCatalog, TierRules


def _strategy(tier: TierSettings, balancing: BalancingSettings) -> Strategy:
    b = balancing
    margin = b.speed_margin if b.speed_aware else None
    if tier.strategy == "round_robin":
        return RoundRobin()
    if tier.strategy == "least_loaded":
        return LeastLoaded(speed_margin=margin)
    return PrefixAffinity(
        tier.model,
        load_factor=b.load_factor,
        load_slack=b.load_slack,
        imbalance_abs=b.imbalance_abs,
        imbalance_rel=b.imbalance_rel,
        speed_margin=margin,
    )


def _spillover(
    spillover: SpilloverSettings, router: RouterSettings, pools: Mapping[str, ReplicaPool]
) -> Spillover | None:
    config = SpilloverConfig(**spillover.model_dump())
    if not config.enabled:
        return None
    return Spillover(config, pools[router.fast_tier], pools[router.precise_tier])


def build_router(
    router: RouterSettings, tiers: Mapping[str, TierSettings], classifier: TierClassifier
) -> TierRouter:
    """The tier-routing stage from the router settings and the tiers' served models."""
    r = router
    catalog = TierCatalog(
        {name: tier.model for name, tier in tiers.items()},
        fast=r.fast_tier,
        precise=r.precise_tier,
    )
    rules = TierRules(
        structured_output_to_precise=r.structured_output_to_precise,
        tools_to_precise=r.tools_to_precise,
        long_prompt_tokens=r.long_prompt_tokens,
        json_object_to_precise=r.json_object_to_precise,
    )
    dial = build_dial(
        r.threshold,
        r.target_precise_share,
        r.online_control,
        classifier,
        max_tenants=r.dial_max_tenants,
    )
    return TierRouter(
        catalog,
        rules,
        classifier,
        dial,
        fast_to_precise=r.fallback_to_precise,
        precise_to_fast=r.downgrade_to_fast,
        unwrap_packaging=r.unwrap_packaging,
    )


def _upstream_keys(tier: TierSettings) -> UpstreamKeys:
    return UpstreamKeys(tier.read_api_keys())


def build_backends(
    tiers: Mapping[str, TierSettings],
    health: HealthSettings,
    balancing: BalancingSettings,
    *,
    worker: WorkerRole | None = None,
    queue: QueueSettings | None = None,
) -> tuple[dict[str, ReplicaPool], dict[str, TierRoute], HealthMonitor]:
    """Each tier's replica pool and route, and the monitor that keeps their health current.

    With a ``worker`` of several, the monitor shares its probes: the leader probes, the
    others follow.
    """
    h, setup = health, _queue_setup(queue or QueueSettings())
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
            busy_s=max(tier.timeouts.first_byte_s, tier.timeouts.idle_s),
            queue=setup,
            speed_half_life_s=balancing.speed_half_life_s,
        )
        for name, tier in tiers.items()
    }
    keys = {name: _upstream_keys(tier) for name, tier in tiers.items()}
    routes = {
        name: TierRoute(
            pools[name],
            _strategy(tier, balancing),
            tier.timeouts,
            tier.model,
            dict(keys[name].first()),
            keys[name] if keys[name].rotates else None,
        )
        for name, tier in tiers.items()
    }
    shared = worker is not None and worker.count > 1
    monitor = HealthMonitor(
        pools,
        HealthConfig(
            h.interval_s,
            h.timeout_s,
            h.unhealthy_after,
            h.healthy_after,
            h.scrape_metrics,
            h.metrics_every,
        ),
        credentials={name: route.upstream_headers for name, route in routes.items()},
        share=HealthShare(worker, pools) if shared and worker is not None else None,
        follower=shared and worker is not None and not worker.leader,
        keys={name: k for name, k in keys.items() if k.rotates},
        served_models={name: tier.model for name, tier in tiers.items()},
    )
    return pools, routes, monitor


def _queue_setup(queue: QueueSettings) -> QueueSetup:
    return QueueSetup(queue.policy, queue.max_length, queue.waits(), queue.batch_max_share)


def _field_rules(tiers: Mapping[str, TierSettings], requests: RequestSettings) -> FieldRules:
    return FieldRules(
        structured={name: tier.structured_outputs for name, tier in tiers.items()},
        remote_media={name: tier.allow_remote_media for name, tier in tiers.items()},
        policy=FieldPolicy(requests.unknown_fields, frozenset(requests.allowed_extra_fields)),
        max_depth=requests.max_json_depth,
    )


def build_service(
    tiers: Mapping[str, TierSettings],
    balancing: BalancingSettings,
    requests: RequestSettings,
    *,
    access: Access,
    router: TierRouter,
    forwarder: Forwarder,
    observer: RequestObserver,
    spillover: Spillover | None = None,
    accounting: Accounting | None = None,
    refused: Refused | None = None,
) -> ProxyService:
    """The request pipeline: authenticate, limit, route, forward, observe."""
    return ProxyService(
        auth=access.authenticator,
        limiter=access.limiter,
        router=router,
        forwarder=forwarder,
        tier_caps={name: tier.max_tokens_cap for name, tier in tiers.items()},
        idle_timeouts={name: tier.timeouts.idle_s for name, tier in tiers.items()},
        default_max_tokens={
            name: min(tier.default_max_tokens or tier.max_tokens_cap, tier.max_tokens_cap)
            for name, tier in tiers.items()
        },
        observer=observer,
        prefix=PrefixConfig(balancing.block_chars, balancing.max_blocks),
        spillover=spillover,
        fields=_field_rules(tiers, requests),
        shadow=accounting.shadow if accounting is not None else None,
        budgets=accounting.budgets if accounting is not None else None,
        precise_cap=accounting.precise_cap if accounting is not None else None,
        escalation=accounting.escalation if accounting is not None else None,
        refused=refused,
        salt_per_tenant=requests.prefix_cache_scope == "tenant",
    )


@dataclass(frozen=True)
class Overrides:
    """What tests and the server put in place of the settings-built parts."""

    auth: Authenticator | None = None
    limiter: RequestLimiter | None = None
    observer: RequestObserver | None = None
    span_exporter: SpanExporter | None = None
    collectors: Sequence[Collector] = ()
    worker: WorkerRole | None = None


def _access(settings: Settings, admin_token: str | None, o: Overrides) -> Access:
    """The Redis client (if any part needs it), the limiter, and authentication over them."""
    redis_limiter = o.limiter is None and settings.ratelimit.backend == "redis"
    needed = uses_redis(settings.auth, admin_token, auth=o.auth, redis_limiter=redis_limiter)
    client = open_redis(settings.redis) if needed else None
    metrics = LimitMetrics()
    limiter = o.limiter or build_limiter(
        settings.ratelimit,
        key_prefix=settings.redis.key_prefix,
        lease_s=limiter_lease_s(settings.tiers),
        workers=settings.server.workers or 1,
        client=client,
        metrics=metrics,
    )
    return build_access(
        settings.auth,
        client=client,
        key_prefix=settings.redis.key_prefix,
        admin_token=admin_token,
        tiers=tuple(settings.tiers),
        limiter=limiter,
        metrics=metrics,
        retry_interval_s=settings.ratelimit.redis_retry_interval_s,
        auth=o.auth,
    )


def build_gateway(
    settings: Settings, overrides: Overrides = Overrides()
) -> Gateway:  # frozen, never mutated
    """Build every long-lived object of a gateway from ``settings`` (read here, once)."""
    o = overrides
    admin_token = settings.auth.read_admin_token()  # the one read of the token (file)
    register_secret(admin_token)  # never logged, wherever a caller puts it
    pools, routes, monitor = build_backends(
        settings.tiers, settings.health, settings.balancing, worker=o.worker, queue=settings.queue
    )
    router = build_router(
        settings.router, settings.tiers, router_models.load(settings.router.artifact)
    )
    telemetry = build_telemetry(
        settings.telemetry,
        pools,
        router=settings.router,
        metrics_host=settings.telemetry.metrics_host or settings.server.host,
        admin_token=admin_token,
        open_metrics=not settings.auth.enabled,
        span_exporter=o.span_exporter,
        worker=o.worker,
    )
    access = _access(settings, admin_token, o)
    for collector in (access.metrics, *o.collectors):  # access: the ratelimit backend gauges
        telemetry.registry.register(collector)
    upstream = UpstreamClient()
    forwarder = Forwarder(upstream, routes, RetryPolicy(**settings.retry.model_dump()))
    accounting = build_accounting(
        settings.tiers,
        settings.router,
        settings.ratelimit,
        client=access.client,
        key_prefix=settings.redis.key_prefix,
        admin_token=admin_token,
        forwarder=forwarder,
        router=router,
        observer=o.observer or telemetry.observer,
        registry=telemetry.registry,
        observed_share=telemetry.metrics.share.share,
        share_dir=o.worker.share_dir if o.worker is not None and o.worker.count > 1 else None,
        local_share=getattr(access.limiter, "local_share", lambda: 1),
        workers=o.worker.count if o.worker is not None else 1,
    )
    return _assemble(
        settings,
        upstream=upstream,
        monitor=monitor,
        router=router,
        telemetry=telemetry,
        access=access,
        forwarder=forwarder,
        accounting=accounting,
        admin_token=admin_token,
    )


def _assemble(
    settings: Settings,
    *,
    upstream: UpstreamClient,
    monitor: HealthMonitor,
    router: TierRouter,
    telemetry: Telemetry,
    access: Access,
    forwarder: Forwarder,
    accounting: Accounting,
    admin_token: str | None,
) -> Gateway:
    """The pipeline and the routes over the built parts."""
    service = build_service(
        settings.tiers,
        settings.balancing,
        settings.requests,
        access=access,
        router=router,
        forwarder=forwarder,
        observer=accounting.observer,
        spillover=_spillover(settings.spillover, settings.router, monitor.pools),
        accounting=accounting,
        refused=telemetry.refusals.refused,
    )
    readiness = Readiness(monitor.pools, upstream, monitor)
    handlers = [
        *ops_handlers(router.catalog, readiness, access.authenticator),
        *access.handlers,
        *telemetry.handlers,
        *admin_backends_handlers(forwarder, admin_token),
        *accounting.handlers,
    ]
    return Gateway(
        upstream, monitor, readiness, access, telemetry, accounting, forwarder, service, handlers
    )


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
    """Build the gateway application for ``settings`` (:func:`build_gateway`) and wire it.

    ``observer`` replaces the telemetry observer; ``span_exporter`` (tests) receives every
    finished span instead of the ``OTEL_*``-configured exporters; ``collectors`` join the
    app's metrics registry (the server's connection counters); ``worker`` says which of
    several workers this process is (one prober, metrics of the whole group).
    """
    overrides = Overrides(auth, limiter, observer, span_exporter, collectors, worker)
    return app_for(build_gateway(settings, overrides), settings)


def served(
    settings: Settings, guard: ConnectionGuard, worker: WorkerRole | None = None
) -> tuple[Litestar, Handler]:
    """What ``tiergate serve`` serves: the app, and the natively served inference endpoints
    (:mod:`gateway.http.native`) over the same gateway."""
    gateway = build_gateway(
        settings, Overrides(collectors=[ConnectionCollector(guard)], worker=worker)
    )
    server = settings.server
    native = Handler(gateway.service.handle, server.max_body_bytes, server.stream_stall_s)
    return app_for(gateway, settings, guard.busy), native


def serve(
    settings: Settings,
    *,
    worker: WorkerRole | None = None,
    sock: socket.socket | None = None,
    logging_ready: Callable[[], None] | None = None,
) -> None:
    """``tiergate serve``: run the server (:func:`gateway.http.server.run`) over what
    :func:`served` builds, until interrupted."""
    run(settings, served, worker=worker, sock=sock, logging_ready=logging_ready)
