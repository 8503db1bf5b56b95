"""Tests for policies/dial.py: per-tenant controllers, live targets, re-seeding, the sample."""

from __future__ import annotations

import random

import pytest

from policies.dial import (
    DialTargets,
    FixedDial,
    RecentSample,
    TenantDial,
    View,
    check_share,
    combine,
    dial_config,
)


def _calibrate(share: float) -> float:
    return 1.0 - share  # uniform scores: the threshold for a share


def _feed(dial: TenantDial, tenant: str, score: float) -> bool:
    sent = score >= dial.threshold_for(tenant)
    dial.observe(tenant, sent, score)
    return sent


def test_one_tenants_flood_does_not_move_anothers_threshold() -> None:
    """Tenant B's threshold is learnt from B's scores only: A's 20,000 scores of 0.99 leave it
    exactly where B's own traffic put it."""
    rng = random.Random(1)
    dial = TenantDial(dial_config(0.3), _calibrate)
    for _ in range(3_000):
        _feed(dial, "b", rng.random())
    before = dial.threshold_for("b")
    for _ in range(20_000):
        _feed(dial, "a", 0.99)
    assert dial.threshold_for("b") == before
    assert dial.threshold_for("a") == pytest.approx(0.99)


def test_a_new_tenant_meets_the_calibration_not_another_tenants_threshold() -> None:
    """A tenant never seen starts at the artifact's calibration for its own target."""
    dial = TenantDial(dial_config(0.3), _calibrate, DialTargets(0.3, {"c": 0.1}))
    for _ in range(1_000):
        _feed(dial, "a", 0.99)
    assert dial.threshold_for("new") == pytest.approx(0.7)
    assert dial.threshold_for("c") == pytest.approx(0.9)
    assert dial.state("new").window_fill == 0


def test_tenants_beyond_the_cap_are_dropped_least_recent_first() -> None:
    """With max_tenants 2, a third tenant evicts the least recently seen one, which then
    meets the calibration again."""
    dial = TenantDial(dial_config(0.3), _calibrate, max_tenants=2)
    for tenant in ("a", "b"):
        for _ in range(300):
            _feed(dial, tenant, 0.95)
    _feed(dial, "a", 0.95)  # a is now the most recent
    _feed(dial, "c", 0.5)
    assert dial.tenants() == ["a", "c"]
    assert dial.evicted == 1
    assert dial.threshold_for("b") == pytest.approx(0.7)


def test_turning_the_dial_re_aims_from_the_window_at_once() -> None:
    """A tenant with scores jumps to its window's quantile for the new target; one without
    meets the calibration of the new target; an untouched tenant keeps its threshold."""
    rng = random.Random(2)
    dial = TenantDial(dial_config(0.3), _calibrate)
    for _ in range(2_000):
        _feed(dial, "a", rng.random() * 0.5)  # a's scores are all below 0.5
        _feed(dial, "b", rng.random())
    b_before = dial.threshold_for("b")
    changed = dial.apply(DialTargets(0.3, {"a": 0.1}, version=1))
    assert changed == ["a"]
    assert dial.threshold_for("a") == pytest.approx(0.45, abs=0.01)  # quantile, not 0.9
    assert dial.threshold_for("b") == b_before
    assert dial.threshold_for("z") == pytest.approx(0.7)
    dial.apply(DialTargets(0.5, {"a": 0.1}, version=2))
    assert dial.threshold_for("b") == pytest.approx(0.5, abs=0.03)
    assert dial.threshold_for("z") == pytest.approx(0.5)


def test_reseed_sets_each_tenant_on_its_own_rescored_traffic() -> None:
    """After a reload, a tenant's threshold is the quantile of its recent traffic's new scores;
    a tenant without recent traffic starts from the new calibration."""
    dial = TenantDial(dial_config(0.3), _calibrate)
    for _ in range(300):
        _feed(dial, "a", 0.5)
        _feed(dial, "b", 0.5)
    new_scores = [i / 1000 * 0.1 for i in range(1000)]  # a new artifact scores all below 0.1
    dial.reseed(lambda share: 0.02, {"a": new_scores})
    assert dial.threshold_for("a") == pytest.approx(0.07, abs=0.001)
    assert dial.threshold_for("b") == 0.02
    assert dial.state("a").window_fill == 0  # decisions restart under the new artifact


def test_recent_sample_stays_tenant_balanced() -> None:
    """A tenant that floods cannot push another's items out below an even share."""
    sample: RecentSample[int] = RecentSample(100)
    for i in range(30):
        sample.add("victim", i)
    for i in range(10_000):
        sample.add("flood", i)
    kept = sample.by_tenant()
    assert len(sample) == 100
    assert kept["victim"] == list(range(30))
    assert kept["flood"] == list(range(9_930, 10_000))
    for i in range(200):
        sample.add(f"t{i}", i)
    assert len(sample) == 100


def test_fixed_dial_and_share_checks() -> None:
    """A fixed threshold ignores traffic and targets; a share is a number in [0, 1]."""
    fixed = FixedDial(0.6, DialTargets(0.3))
    fixed.observe("a", True, 0.99)
    assert fixed.apply(DialTargets(0.1, version=1)) == []
    assert fixed.threshold_for("a") == 0.6
    assert check_share(1) == 1.0
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="share"):
            check_share(bad)


def test_the_fleet_threshold_is_per_tenant_and_used_for_decisions() -> None:
    """combine weights each worker's threshold by its scores, per tenant, and skips views
    aimed at another target; the dial decides on the fleet's value once it has one."""
    targets = DialTargets(0.3, {"b": 0.1})
    views = [
        {"a": View(0.4, 1_000, 0.3), "b": View(0.9, 1_000, 0.1)},
        {"a": View(0.6, 3_000, 0.3), "b": View(0.2, 1_000, 0.3)},  # b: not applied yet
    ]
    assert combine(views, targets) == pytest.approx({"a": 0.55, "b": 0.9})
    dial = TenantDial(dial_config(0.3), _calibrate, targets)
    for _ in range(300):
        _feed(dial, "a", 0.5)
    assert dial.local_view()["a"].scores == 300
    dial.set_fleet({"a": 0.55})
    assert dial.threshold_for("a") == 0.55
    assert dial.own_threshold("a") == pytest.approx(0.5)
    dial.apply(DialTargets(0.2, {"b": 0.1}, version=1))
    assert dial.threshold_for("a") == dial.own_threshold("a")  # re-aimed: the fleet's is stale
