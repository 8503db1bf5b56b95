"""Old against new at equal complex caught, and quality retained by precise share."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.artifact import FloatArray
from router_models.training.shadow_eval import (
    at_equal_caught,
    compare,
    quality_curve,
    render,
    threshold_catching,
)
from router_models.training.tenant_balance import tenant_weights

Y = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=np.float64)
OLD = np.array([0.9, 0.8, 0.4, 0.3, 0.85, 0.5, 0.35, 0.1])
NEW = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.2, 0.1, 0.05])


def test_threshold_catching_is_the_kth_complex_score() -> None:
    """Catching 3 of 4 complex rows needs the third-highest complex score."""
    assert threshold_catching(OLD, Y, 0.75) == pytest.approx(0.4)
    assert threshold_catching(OLD, Y, 1.0) == pytest.approx(0.3)
    assert threshold_catching(OLD, Y, 0.01) == pytest.approx(0.9)


def test_equal_caught_counts_simple_rows_sent() -> None:
    """At all complex caught the old sends 3 of 4 simple rows, the new one none."""
    point = at_equal_caught(OLD, NEW, Y, 1.0)
    assert point["old"] == {"simple_sent": 0.75, "complex_caught": 1.0}
    assert point["new"] == {"simple_sent": 0.0, "complex_caught": 1.0}
    assert point["reduction"] == 1.0


def test_quality_curve_counts_precise_rows_as_kept() -> None:
    """Rows sent precise keep quality 1; rows sent fast keep their agreement."""
    agreement = np.array([0.0, 0.0, 1.0, 1.0])
    curve = quality_curve(np.array([0.9, 0.8, 0.2, 0.1]), agreement, (0.5, 0.0))
    assert curve == [
        {"precise_share": 0.5, "quality_retained": 1.0},
        {"precise_share": 0.0, "quality_retained": 0.5},
    ]


def test_compare_uses_the_old_operating_point_and_renders() -> None:
    """The headline point is what the old artifact catches at its own threshold."""
    result = compare(OLD, NEW, Y, 0.45)
    assert result["operating_point"]["old"]["complex_caught"] == 0.5
    assert result["operating_point"]["new"]["simple_sent"] == 0.0
    assert "fewer" in render(result)
    with pytest.raises(ValueError, match="both"):
        compare(OLD[:4], NEW[:4], Y[:4], 0.5)


# Held-out rows of two tenants: a floods (80 rows), b is small (10). The new artifact separates
# a's rows perfectly (the old one mixes them) and inverts b's (the old one separated them).
A_Y = np.repeat([1.0, 0.0], 40)
B_Y = np.repeat([1.0, 0.0], 5)
FLOOD_Y = np.concatenate([A_Y, B_Y])
FLOOD_TENANTS = ["a"] * 80 + ["b"] * 10
FLOOD_OLD: FloatArray = np.concatenate(
    [
        np.linspace(0.9, 0.5, 40),  # a complex
        np.linspace(0.7, 0.3, 40),  # a simple: overlaps a's complex
        np.array([0.95, 0.92, 0.9, 0.85, 0.8]),  # b complex
        np.array([0.2, 0.15, 0.1, 0.08, 0.05]),  # b simple: separated
    ]
)
FLOOD_NEW: FloatArray = np.concatenate(
    [
        np.linspace(0.9, 0.7, 40),
        np.linspace(0.4, 0.1, 40),  # a: separated
        np.array([0.5, 0.45, 0.4, 0.35, 0.3]),
        np.array([0.8, 0.75, 0.7, 0.65, 0.6]),  # b: inverted
    ]
)
# Fast answers of complex prompts disagree with precise ones; those of simple prompts agree.
FLOOD_AGREEMENT = np.where(FLOOD_Y == 1, 0.2, 0.9)


def test_a_flooding_tenant_cannot_make_the_held_out_comparison_claim_an_improvement() -> None:
    """Unweighted, a's 80 rows make the new artifact look better at every caught level and
    in quality retained although b (10 rows) got worse. Weighted as in training (a's rows at
    most half the weight), the comparison shows b's loss: the new artifact sends more simple
    rows to precise at equal complex caught and keeps less quality."""
    weights = tenant_weights(FLOOD_TENANTS, 0.5)
    plain = compare(FLOOD_OLD, FLOOD_NEW, FLOOD_Y, 0.5)
    weighted = compare(FLOOD_OLD, FLOOD_NEW, FLOOD_Y, 0.5, weights=weights)
    plain_reductions = [p["reduction"] for p in plain["curve"]]
    weighted_reductions = [p["reduction"] for p in weighted["curve"]]
    print("unweighted", plain_reductions, "weighted", weighted_reductions)  # pytest -s
    assert all(r > 0 for r in plain_reductions)  # the defect: "retraining helped"
    assert all(r < 0 for r in weighted_reductions)  # b's loss shows once a weighs half
    assert weighted["rows"] == plain["rows"] == 90  # row counts stay counts
    assert weighted["complex"] == 45
    assert weighted["tenant_weighted"] is True
    assert plain["tenant_weighted"] is False
    assert "tenant-weighted" in render(weighted)
    assert "(925.0% more)" in render(weighted)
    assert "tenant-weighted" not in render(plain)

    def quality(scores: FloatArray, w: FloatArray | None) -> float:
        return quality_curve(scores, FLOOD_AGREEMENT, (0.5,), weights=w)[0]["quality_retained"]

    assert quality(FLOOD_NEW, None) > quality(FLOOD_OLD, None)
    assert quality(FLOOD_NEW, weights) < quality(FLOOD_OLD, weights)


@pytest.mark.parametrize("weight", [1.0, 0.37, 1e-3])
def test_equal_weights_give_exactly_the_unweighted_comparison(weight: float) -> None:
    """Every row at one weight (no tenant capped, or one tenant) changes nothing, bit for bit."""
    rng = np.random.default_rng(7)
    for y, old, new in (
        (Y, OLD, NEW),
        (FLOOD_Y, FLOOD_OLD, FLOOD_NEW),
        (rng.integers(0, 2, 301).astype(np.float64), rng.random(301), rng.random(301)),
    ):
        weights = np.full(y.size, weight)
        plain, weighted = compare(old, new, y, 0.5), compare(old, new, y, 0.5, weights=weights)
        weighted.pop("tenant_weighted"), plain.pop("tenant_weighted")
        assert weighted == plain
        agreement = rng.random(y.size)
        shares = (0.0, 0.05, 0.1, 1 / 3, 0.5, 0.99, 1.0)
        assert quality_curve(old, agreement, shares, weights=weights) == quality_curve(
            old, agreement, shares
        )
        for caught in (0.01, 0.5, 0.8, 0.9, 0.95, 1.0):
            assert threshold_catching(old, y, caught, weights) == threshold_catching(old, y, caught)
