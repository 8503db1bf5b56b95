"""Operational endpoints: liveness, readiness and the model list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec
from litestar import Request, Response, get

from gateway.health import HealthMonitor
from gateway.replicas import ReplicaPool
from policies.ports import Authenticator
from policies.tiering import AUTO_MODEL, TierCatalog

_encoder = msgspec.json.Encoder()


def models_body(catalog: TierCatalog, created: int) -> bytes:
    """The ``/v1/models`` list: ``auto``, every tier, every served model."""
    ids = [AUTO_MODEL, *catalog.tiers, *catalog.served_models.values()]
    seen: list[str] = []
    for model_id in ids:
        if model_id not in seen:
            seen.append(model_id)
    data = [
        {"id": m, "object": "model", "created": created, "owned_by": "tiergate"} for m in seen
    ]
    return _encoder.encode({"object": "list", "data": data})


class Readiness:
    """Ready when every tier has at least one replica answering ``/health`` with 200.

    With a health monitor, its last probes answer (no extra request per call); until the
    monitor has probed every replica once, the replicas are asked directly.
    """

    def __init__(self, pools: dict[str, ReplicaPool], timeout_s: float = 1.0) -> None:
        self.pools = pools
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self.monitor: HealthMonitor | None = None

    async def _healthy(self, url: str) -> bool:
        assert self.session is not None  # noqa: S101  # set at start-up
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.session.get(url, allow_redirects=False) as resp:
                    return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

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


def ops_handlers(
    catalog: TierCatalog, readiness: Readiness, auth: Authenticator
) -> list[Any]:
    """Route handlers for /livez, /readyz and /v1/models."""
    created = int(time.time())
    models = models_body(catalog, created)

    @get("/livez", sync_to_thread=False)
    def livez() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @get("/readyz")
    async def readyz() -> Response[bytes]:
        tiers = await readiness.check()
        ready = all(tiers.values())
        body = _encoder.encode({"status": "ready" if ready else "not_ready", "tiers": tiers})
        return Response(body, status_code=200 if ready else 503, media_type="application/json")

    @get("/v1/models")
    async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
        await auth.authenticate(request.headers.get("authorization"))
        return Response(models, media_type="application/json")

    return [livez, readyz, list_models]
