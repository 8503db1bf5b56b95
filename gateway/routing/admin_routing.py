"""``GET /admin/routing``, ``POST /admin/router/reload`` and the shadow metrics (issue 17).

The routing view: the threshold in force, the precise share observed against its target, and
the shadow estimates (quality retained on fast-routed traffic, agreement of fast answers on
precise-routed traffic, outcome counts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

import router_models
from gateway.access.admin_keys import AdminGuard
from gateway.config.settings import RouterSettings
from gateway.routing.routing import TierRouter, threshold_policy
from gateway.routing.shadow import ShadowRunner
from policies.errors import InvalidRequest
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
    in place and answers 400 with the reason.
    """

    def __init__(self, router: TierRouter, settings: RouterSettings) -> None:
        self.router = router
        self.settings = settings
        self.loaded_at = time.time()

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
        }

    def reload(self) -> dict[str, Any]:
        """Load the artifact file again; swap classifier and threshold together."""
        try:
            classifier = router_models.load(self.settings.artifact)
        except (OSError, router_models.ArtifactError) as exc:
            raise InvalidRequest(
                f"The router artifact could not be loaded: {exc}", code="artifact_invalid"
            ) from None
        s = self.settings
        self.router.replace(
            classifier,
            threshold_policy(s.threshold, s.target_precise_share, s.online_control, classifier),
        )
        self.loaded_at = time.time()
        return self.describe()


def routing_body(
    router: TierRouter,
    runner: ShadowRunner | None,
    observed_share: Callable[[], float],
    target_share: float,
    reloader: ArtifactReloader | None = None,
) -> bytes:
    """The JSON document of ``/admin/routing``."""
    view: dict[str, Any] = {
        "threshold": round(router.threshold.threshold, 6),
        "precise_share": {"observed": round(observed_share(), 4), "target": target_share},
    }
    if reloader is not None:
        view["artifact"] = reloader.describe()
    if runner is not None:
        view.update(runner.routing_view())
    return _encoder.encode(view)


def admin_routing_handlers(
    router: TierRouter,
    runner: ShadowRunner | None,
    observed_share: Callable[[], float],
    settings: RouterSettings,
    admin_token: str | None,
) -> list[Any]:
    """``GET /admin/routing`` and ``POST /admin/router/reload``, or none when admin is off."""
    if not admin_token:
        return []
    guard = AdminGuard(admin_token)
    reloader = ArtifactReloader(router, settings)
    headers = {"Cache-Control": "no-store"}

    @get("/admin/routing", sync_to_thread=False)
    def admin_routing(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(request.headers.get("authorization"))
        body = routing_body(router, runner, observed_share, settings.target_precise_share, reloader)
        return Response(body, media_type="application/json", headers=headers)

    @post("/admin/router/reload", status_code=200, sync_to_thread=False)
    def reload_router(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(request.headers.get("authorization"))
        return Response(
            _encoder.encode({"artifact": reloader.reload()}),
            media_type="application/json",
            headers=headers,
        )

    return [admin_routing, reload_router]
