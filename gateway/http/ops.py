"""Operational endpoints: liveness, readiness and the model list."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import HttpMethod, Request, Response, get, route
from litestar.params import FromPath

from gateway.access.admin_keys import authorization
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.connection import UpstreamConnectionError
from gateway.upstream.health import HealthMonitor
from gateway.upstream.replicas import ReplicaPool
from policies.errors import ModelNotFound
from policies.ports import Authenticator
from policies.principal import Principal
from policies.tiering import AUTO_MODEL, TierCatalog

_encoder = msgspec.json.Encoder()
# A health route's body is read (up to this much) only to keep its connection for the next probe.
_MAX_HEALTH_BODY = 64 * 1024


def model_ids(catalog: TierCatalog, principal: Principal) -> list[str]:
    """What ``model`` may name for this caller: ``auto``, its tiers and their served models."""
    allowed = [tier for tier in catalog.tiers if principal.policy.allows_tier(tier)]
    ids = [AUTO_MODEL] if allowed else []
    ids += allowed
    ids += [catalog.served_models[tier] for tier in allowed]
    return list(dict.fromkeys(ids))


def _model(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "tiergate"}


def models_body(catalog: TierCatalog, principal: Principal, created: int) -> bytes:
    """The ``/v1/models`` list, filtered to what the caller's key may use."""
    data = [_model(m, created) for m in model_ids(catalog, principal)]
    return _encoder.encode({"object": "list", "data": data})


class Readiness:
    """Ready when every tier has at least one replica answering ``/health`` with 200.

    With a health monitor, its last probes answer (no extra request per call); until the
    monitor has probed every replica once, the replicas are asked directly.
    """

    def __init__(
        self,
        pools: Mapping[str, ReplicaPool],
        upstream: UpstreamClient,
        monitor: HealthMonitor | None = None,
        timeout_s: float = 1.0,
    ) -> None:
        self.pools = pools
        self.upstream = upstream
        self.monitor = monitor
        self.timeout_s = timeout_s

    async def _healthy(self, url: str) -> bool:
        client = self.upstream.probes
        try:
            async with asyncio.timeout(self.timeout_s):
                status, _ = await client.get(url, limit=_MAX_HEALTH_BODY)
        except (TimeoutError, UpstreamConnectionError):
            return False
        return status == 200

    async def check(self) -> dict[str, bool]:
        """Per tier: does any replica answer?"""
        if self.monitor is not None:
            known = self.monitor.readiness()
            if known is not None:
                return known
        result: dict[str, bool] = {}
        for tier, pool in self.pools.items():
            probes = (self._healthy(r.url + r.health_path) for r in pool.replicas)
            answers = await asyncio.gather(*probes)
            result[tier] = any(
                up and not r.misconfigured for up, r in zip(answers, pool.replicas, strict=True)
            )
        return result


def ops_handlers(catalog: TierCatalog, readiness: Readiness, auth: Authenticator) -> list[Any]:
    """Route handlers for /livez, /readyz and /v1/models."""
    created = int(time.time())

    # GET and HEAD: some load balancers probe with HEAD (the server sends the head only).
    probe = [HttpMethod.GET, HttpMethod.HEAD]

    @route("/livez", http_method=probe, sync_to_thread=False)
    def livez() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @route("/readyz", http_method=probe)
    async def readyz() -> Response[bytes]:
        tiers = await readiness.check()
        ready = all(tiers.values())
        body = _encoder.encode({"status": "ready" if ready else "not_ready", "tiers": tiers})
        return Response(body, status_code=200 if ready else 503, media_type="application/json")

    @get("/v1/models")
    async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
        principal = await auth.authenticate(authorization(request))
        return Response(models_body(catalog, principal, created), media_type="application/json")

    @get("/v1/models/{model_id:path}")
    async def retrieve_model(
        request: Request[Any, Any, Any], model_id: FromPath[str]
    ) -> Response[bytes]:
        principal = await auth.authenticate(authorization(request))
        wanted = model_id.lstrip("/")
        if wanted not in model_ids(catalog, principal):
            # Unknown and forbidden look alike: a key does not learn the tiers it may not use.
            raise ModelNotFound(
                f"The model '{wanted[:100]}' does not exist or this key may not use it.",
                param="model",
            )
        return Response(_encoder.encode(_model(wanted, created)), media_type="application/json")

    return [livez, readyz, list_models, retrieve_model]
