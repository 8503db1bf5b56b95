"""Old against new at equal complex caught, and quality retained by precise share."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.shadow_eval import (
    at_equal_caught,
    compare,
    quality_curve,
    render,
    threshold_catching,
)

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
