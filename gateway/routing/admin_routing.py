"""``GET /admin/routing``, ``POST /admin/router/reload`` and the shadow metrics (issue 17).

The routing view: the threshold in force, the precise share observed against its target, and
the shadow estimates (quality retained on fast-routed traffic, agreement of fast answers on
precise-routed traffic, outcome counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from litestar import Request, Response, get, post, put
from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

import router_models
from gateway.access.admin_keys import AdminGuard, authorization
from gateway.config.router_settings import RouterSettings
from gateway.routing.dial_sync import DialSync
from gateway.routing.routing import TierRouter, calibration
from gateway.routing.shadow import ShadowRunner
from policies.dial import TenantDial, check_share
from policies.errors import InvalidRequest, TierGateError
from router_models import Router

_encoder = msgspec.json.Encoder()


class ShadowCollector(Collector):
    """``tiergate_shadow_total`` and ``tiergate_shadow_agreement``, read at scrape time."""

    def __init__(self, runner: ShadowRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        """Outcome counters and the agreement summary by direction and route-score bucket."""
        total = CounterMetricFamily(
            "tiergate_shadow",
            "Shadow requests by direction and outcome",
            labels=("direction", "outcome"),
        )
        for key, count in list(self.runner.counts.items()):
            direction, outcome = key.split(":", 1)
            total.add_metric((direction, outcome), float(count))
        agreement = SummaryMetricFamily(
            "tiergate_shadow_agreement",
            "Agreement (0-1) of the two tiers' answers, by direction and route-score bucket",
            labels=("direction", "score_bucket"),
        )
        for (direction, bucket), (seen, value) in list(self.runner.agreement_totals.items()):
            agreement.add_metric((direction, bucket), count_value=int(seen), sum_value=value)
        yield total
        yield agreement


class ArtifactReloader:
    """Loads the configured router artifact again and swaps it in, without a restart.

    Only the configured path (``router.artifact``, or the shipped one) is ever loaded: the
    admin call says *when*, never *what*. A file that fails to load leaves the live artifact
    in place and answers 400 with the reason. Before the new artifact goes live, the recent
    classifier-routed requests (``TierRouter.recent``, tenant-balanced) are scored again under
    it and each tenant's controller is re-seeded with its own scores, so the threshold in
    force is the new artifact's quantile for the tenant's target on the tenant's recent
    traffic, from the first request (the artifact's own calibration may be far off: a
    retrained one put its 30 % threshold at 0.05 where the shipped one had 0.49).
    """

    def __init__(self, router: TierRouter, settings: RouterSettings) -> None:
        self.router = router
        self.settings = settings
        self.loaded_at = time.time()
        self.reseeded = 0

    def describe(self) -> dict[str, Any]:
        """Which artifact is live: its id (``sha256:`` of the file loaded), path, provenance."""
        classifier = self.router.classifier
        live = classifier if isinstance(classifier, Router) else None
        metadata = live.metadata if live is not None else {}
        path = self.settings.artifact or router_models.DEFAULT_ARTIFACT
        shadow = metadata.get("shadow")
        return {
            "id": live.artifact_id if live is not None else None,
            "path": str(path),
            "version": metadata.get("version"),
            "model_version": metadata.get("model_version"),
            "data_digest": metadata.get("data_digest"),
            "trained_from_shadow": (
                {"prompts": shadow.get("prompts"), "base_artifact": shadow.get("base_artifact")}
                if isinstance(shadow, dict)
                else None
            ),
            "loaded_at": self.loaded_at,
            "reseeded_from": self.reseeded,
        }

    def _load(self) -> tuple[Router, dict[str, list[float]]]:
        """The new artifact and the recent requests' scores under it, by tenant (a thread)."""
        try:
            classifier = router_models.load(self.settings.artifact)
        except (OSError, router_models.ArtifactError) as exc:
            raise InvalidRequest(
                f"The router artifact could not be loaded: {exc}", code="artifact_invalid"
            ) from None
        recent = self.router.recent.by_tenant()
        score = self.router.score
        scores = {t: [score(classifier, b) for b in bodies] for t, bodies in recent.items()}
        return classifier, scores

    async def reload(self) -> dict[str, Any]:
        """Load the artifact file again, re-seed the dial on it, then swap it in."""
        classifier, scores = await asyncio.to_thread(self._load)
        dial = self.router.dial
        if isinstance(dial, TenantDial):
            dial.reseed(calibration(classifier), scores)
        self.router.replace(classifier)
        self.loaded_at = time.time()
        self.reseeded = sum(len(v) for v in scores.values())
        return self.describe()


def _dial_view(router: TierRouter, sync: DialSync | None) -> dict[str, Any]:
    """Target, observed share and threshold per tenant with a controller on this worker."""
    dial = router.dial
    tenants = []
    for tenant in reversed(dial.tenants()):  # most recently seen first
        state = dial.state(tenant)
        tenants.append(
            {
                "tenant": tenant,
                "target": state.target_share,
                "observed": round(state.observed_share, 4),
                "threshold": round(dial.threshold_for(tenant), 6),
                "own_threshold": round(state.threshold, 6),
                "window": state.window_fill,
            }
        )
    targets = dial.targets
    return {
        "online": isinstance(dial, TenantDial),
        "default_target": targets.default,
        "tenant_targets": dict(targets.tenants),
        "version": targets.version,
        "applied_at": sync.applied_at if sync is not None else None,
        "worker": os.getpid(),  # each worker has its own controllers
        "tenants": tenants,
    }


def routing_body(
    router: TierRouter,
    runner: ShadowRunner | None,
    observed_share: Callable[[], float],
    reloader: ArtifactReloader | None = None,
    sync: DialSync | None = None,
) -> bytes:
    """The JSON document of ``/admin/routing``: ``threshold`` is what a tenant without a
    controller of its own meets; ``dial`` has each tenant's."""
    targets = router.dial.targets
    view: dict[str, Any] = {
        "threshold": round(router.dial.threshold_for(""), 6),
        "precise_share": {"observed": round(observed_share(), 4), "target": targets.default},
        "dial": _dial_view(router, sync),
    }
    if reloader is not None:
        view["artifact"] = reloader.describe()
    if runner is not None:
        view.update(runner.routing_view())
    return _encoder.encode(view)


class ShareChange(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/router/share``: a share in [0, 1], or null to clear (a tenant's own
    target, or a dialled default: back to ``router.target_precise_share``)."""

    share: float | None
    tenant: str | None = None


class Conflict(InvalidRequest):
    """The dial cannot be turned in this configuration (409)."""

    status = 409


class DialStoreDown(TierGateError):
    """The dial's shared store did not answer (503): nothing changed."""

    status = 503
    default_code = "dial_store_unavailable"


_decoder = msgspec.json.Decoder(ShareChange)
MAX_TENANT_CHARS = 200


def _share_change(raw: bytes) -> ShareChange:
    try:
        change = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"Invalid dial change: {exc}", code="invalid_share") from None
    except msgspec.DecodeError:
        raise InvalidRequest("The body is not valid JSON.", code="invalid_json") from None
    if change.share is not None:
        try:
            check_share(change.share)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="share", code="invalid_share") from None
    if change.tenant is not None and not 0 < len(change.tenant) <= MAX_TENANT_CHARS:
        raise InvalidRequest(
            f"A tenant name has 1 to {MAX_TENANT_CHARS} characters.", param="tenant"
        )
    return change


def admin_routing_handlers(  # noqa: PLR0917  # one builder for the composition root
    router: TierRouter,
    runner: ShadowRunner | None,
    observed_share: Callable[[], float],
    settings: RouterSettings,
    admin_token: str | None,
    sync: DialSync | None = None,
    reloader: ArtifactReloader | None = None,
) -> list[Any]:
    """``GET /admin/routing``, ``POST /admin/router/reload`` and ``PUT /admin/router/share``,
    or none when admin is off."""
    if not admin_token:
        return []
    guard = AdminGuard(admin_token)
    reloader = reloader or ArtifactReloader(router, settings)
    headers = {"Cache-Control": "no-store"}

    def _json(data: Any) -> Response[bytes]:
        return Response(_encoder.encode(data), media_type="application/json", headers=headers)

    @get("/admin/routing", sync_to_thread=False)
    def admin_routing(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        body = routing_body(router, runner, observed_share, reloader, sync)
        return Response(body, media_type="application/json", headers=headers)

    @post("/admin/router/reload", status_code=200)
    async def reload_router(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        described = await reloader.reload()
        if sync is not None:
            with contextlib.suppress(RedisError, OSError):  # this worker has it either way
                await sync.reloaded()
        return _json({"artifact": described})

    return [admin_routing, reload_router, _dial_handler(guard, router, sync)]


async def _turn(router: TierRouter, sync: DialSync | None, raw: bytes) -> dict[str, Any]:
    """Check and apply one ``PUT /admin/router/share`` body; the targets now in force."""
    change = _share_change(raw)
    if not isinstance(router.dial, TenantDial):
        raise Conflict(
            "Online control is off (router.threshold is fixed): the dial has no effect.",
            code="dial_fixed",
        )
    if sync is None:
        raise Conflict("The live dial is not available here.", code="dial_unavailable")
    try:
        targets = await sync.set_target(change.tenant, change.share, actor="admin")
    except (RedisError, OSError):
        raise DialStoreDown("The dial's store (Redis) is unreachable; nothing changed.") from None
    return {
        "default_target": targets.default,
        "tenant_targets": dict(targets.tenants),
        "version": targets.version,
    }


def _dial_handler(guard: AdminGuard, router: TierRouter, sync: DialSync | None) -> Any:
    """``PUT /admin/router/share``: the live dial (admin token)."""

    @put("/admin/router/share", status_code=200)
    async def dial_share(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        body = await _turn(router, sync, await request.body())
        return Response(
            _encoder.encode(body),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    return dial_share
