"""``GET /admin/routing`` and the shadow-evaluation metrics (issue 17).

The routing view: the threshold in force, the precise share observed against its target, and
the shadow estimates (quality retained on fast-routed traffic, agreement of fast answers on
precise-routed traffic, outcome counts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from litestar import Request, Response, get
from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from gateway.admin_keys import AdminGuard
from gateway.routing import TierRouter
from gateway.shadow import ShadowRunner

_encoder = msgspec.json.Encoder()


class ShadowCollector(Collector):
    """``tiergate_shadow_total`` and ``tiergate_shadow_agreement``, read at scrape time."""

    def __init__(self, runner: ShadowRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        """Outcome counters and the agreement summary by direction and route-score bucket."""
        total = CounterMetricFamily(
            "tiergate_shadow", "Shadow requests by direction and outcome",
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


def routing_body(router: TierRouter, runner: ShadowRunner | None,
                 observed_share: Callable[[], float], target_share: float) -> bytes:
    """The JSON document of ``/admin/routing``."""
    view: dict[str, Any] = {
        "threshold": round(router.threshold.threshold, 6),
        "precise_share": {"observed": round(observed_share(), 4), "target": target_share},
    }
    if runner is not None:
        view.update(runner.routing_view())
    return _encoder.encode(view)


def admin_routing_handlers(router: TierRouter, runner: ShadowRunner | None,
                           observed_share: Callable[[], float], target_share: float,
                           admin_token: str | None) -> list[Any]:
    """The handler, or none when admin is off."""
    if not admin_token:
        return []
    guard = AdminGuard(admin_token)

    @get("/admin/routing", sync_to_thread=False)
    def admin_routing(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(request.headers.get("authorization"))
        return Response(routing_body(router, runner, observed_share, target_share),
                        media_type="application/json", headers={"Cache-Control": "no-store"})

    return [admin_routing]
