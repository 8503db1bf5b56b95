"""docs/replicas.md's defaults: the strategy, ejection after 5 failures (never more than half a
tier; 4xx never count), the retry budget's 20 % of 10 s plus 3 a second, fallback and spill
defaults, and the 3 slow scrapes after which a reading is dropped."""

from __future__ import annotations

import pytest

from gateway.composition import build_backends
from gateway.config.router_settings import RouterSettings, SpilloverSettings
from gateway.config.settings import RetrySettings, Settings
from gateway.config.tier_settings import TierSettings
from gateway.upstream.attempt import AttemptFailed
from gateway.upstream.health import STALE_SCRAPES
from gateway.upstream.retry import RetryPolicy


def test_a_default_gateways_replicas_are_ejected_after_5_failures_at_most_half_a_tier() -> None:
    """The default settings reach every pool: 5 in a row, at most half the tier ejected."""
    settings = Settings()
    pools, _, _ = build_backends(settings.tiers, settings.health, settings.balancing)
    for pool in pools.values():
        assert pool.ejection.eject_after == 5
        assert pool.ejection.max_share == 0.5
    assert TierSettings.model_fields["strategy"].default == "prefix_affinity"


@pytest.mark.parametrize("status", [None, 500, 502, 503])
def test_connection_failures_and_5xx_count_against_a_replica(status: int | None) -> None:
    """A refused connection (no status) or a 5xx counts towards ejection."""
    kind = "connect" if status is None else f"status_{status}"
    assert AttemptFailed(kind, "x", status=status).counts_against_replica


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 429])
def test_4xx_never_count_against_a_replica(status: int) -> None:
    """The caller's errors (and a busy 429) say nothing of the replica's health."""
    assert not AttemptFailed(f"status_{status}", "x", status=status).counts_against_replica


def test_the_retry_budget_fallback_and_spill_defaults() -> None:
    """20 % of the last 10 s plus 3 a second; fast -> precise on, precise -> fast off; spill
    margin 0.25 s and 1 s per request ahead before a drain is seen; 3 slow scrapes."""
    retry = RetrySettings()
    assert (retry.budget_ratio, retry.budget_window_s, retry.budget_min) == (0.2, 10.0, 3.0)
    policy = RetryPolicy(**retry.model_dump())
    assert (policy.budget_ratio, policy.budget_min) == (0.2, 3.0)
    router = RouterSettings()
    assert router.fallback_to_precise
    assert not router.downgrade_to_fast
    spill = SpilloverSettings()
    assert (spill.enabled, spill.margin_s, spill.assumed_request_s) == (False, 0.25, 1.0)
    assert STALE_SCRAPES == 3
