"""The per-tenant shadow sample cap is the gateway's, divided among its worker processes
(each keeps its count in memory): a tenant no longer takes N times the cap from N workers."""

from __future__ import annotations

import pytest

from gateway.config.router_settings import RouterSettings
from gateway.routing.accounting import shadow_config
from policies.shadow_budget import TenantSampleBudget, worker_share


@pytest.mark.parametrize(
    ("cap", "workers", "share"),
    [(30, 1, 30), (30, 2, 15), (30, 4, 7), (30, 7, 4), (2, 4, 1), (None, 4, None)],
)
def test_each_worker_takes_its_share_of_the_cap(
    cap: int | None, workers: int, share: int | None
) -> None:
    assert worker_share(cap, workers) == share
    if cap is not None and workers <= cap:
        assert share is not None
        assert share * workers <= cap  # the group stays under the cap


def test_the_shadow_runner_of_a_worker_counts_against_its_share() -> None:
    settings = RouterSettings.model_validate(
        {"shadow": {"fast_ratio": 1.0, "tenant_samples_per_minute": 30}}
    )
    assert shadow_config(settings).tenant_samples_per_minute == 30
    config = shadow_config(settings, workers=4)
    assert config.tenant_samples_per_minute == 7
    budget = TenantSampleBudget(config.tenant_samples_per_minute, clock=lambda: 0.0)
    taken = [budget.take("acme") for _ in range(4 * 30)]
    assert taken.count(True) == 7  # four such workers: 28 a minute, not 120
