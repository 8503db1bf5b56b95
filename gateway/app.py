"""The composition root: ``create_app(settings)`` builds every stage once and wires them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from litestar import Litestar, Request, Response, post

from gateway.auth import Access
from gateway.errors import EXCEPTION_HANDLERS
from gateway.forwarding import Forwarder, TierRoute
from gateway.ops import Readiness, ops_handlers
from gateway.proxy import ProxyService, RequestObserver
from gateway.replicas import ReplicaPool
from gateway.retry import RetryPolicy
from gateway.routing import ThresholdSource, TierRouter
from gateway.settings import Settings
from gateway.upstream import make_session
from policies.ports import Authenticator, RequestLimiter, TierClassifier
from policies.selection import LeastLoaded, RoundRobin, Strategy
from policies.tiering import TierCatalog, TierRules


class _NullObserver:
    def finished(self, ctx: Any, outcome: str) -> None:
        """Telemetry switched off."""


class _PlaceholderClassifier:
    """Until the trained router is wired in: long or code/math-looking prompts score high."""

    def score(self, body: Mapping[str, Any]) -> float:
        text = str(body.get("messages") or body.get("prompt") or "")
        hints = sum(word in text for word in ("def ", "prove", "step by step", "JSON", "code"))
        return min(1.0, len(text) / 4000 + 0.3 * hints)


def _strategy(name: str) -> Strategy:
    if name == "round_robin":
        return RoundRobin()
    return LeastLoaded()


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
    threshold = ThresholdSource(r.threshold if r.threshold is not None else 0.5)
    return TierRouter(catalog, rules, classifier, threshold)


def create_app(
    settings: Settings,
    *,
    auth: Authenticator | None = None,
    limiter: RequestLimiter | None = None,
    observer: RequestObserver | None = None,
) -> Litestar:
    """Build the gateway application for ``settings``."""
    pools = {
        name: ReplicaPool(name, tier.replicas, tier.max_concurrency, tier.max_queue_wait_s)
        for name, tier in settings.tiers.items()
    }
    routes = {
        name: TierRoute(pools[name], _strategy(tier.strategy), tier.timeouts, tier.model)
        for name, tier in settings.tiers.items()
    }
    router = build_router(settings, _PlaceholderClassifier())
    access = Access(settings, auth=auth, limiter=limiter)
    authenticator = access.authenticator
    forwarder = Forwarder(None, routes, RetryPolicy())  # type: ignore[arg-type]  # session opens at start-up
    readiness = Readiness(pools)
    service = ProxyService(
        auth=authenticator,
        limiter=access.limiter,
        router=router,
        forwarder=forwarder,
        tier_caps={name: tier.max_tokens_cap for name, tier in settings.tiers.items()},
        idle_timeouts={name: tier.timeouts.idle_s for name, tier in settings.tiers.items()},
        default_completion_tokens=settings.ratelimit.default_completion_tokens,
        observer=observer or _NullObserver(),
    )

    @post("/v1/chat/completions", status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "chat", "/v1/chat/completions")

    @post("/v1/completions", status_code=200)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        return await service.handle(request, "completion", "/v1/completions")

    async def startup() -> None:
        session = make_session()
        forwarder.session = session
        readiness.session = session
        await access.startup()

    async def shutdown() -> None:
        session: aiohttp.ClientSession | None = forwarder.session
        if session is not None:
            await session.close()
        await access.shutdown()

    return Litestar(
        route_handlers=[chat, completions, *ops_handlers(router.catalog, readiness, authenticator),
                        *access.handlers],
        exception_handlers=EXCEPTION_HANDLERS,
        on_startup=[startup],
        on_shutdown=[shutdown],
        request_max_body_size=settings.server.max_body_bytes,
        openapi_config=None,
        debug=False,
    )
