"""Tests for policies/threshold.py: the share dial and the online share controller."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from policies.threshold import (
    ControllerConfig,
    ShareController,
    share_at_threshold,
    threshold_for_share,
)


def test_threshold_sends_the_requested_share() -> None:
    """With distinct scores, exactly ceil(share * n) of them reach the threshold."""
    scores = [i / 100 for i in range(100)]
    for share in (0.01, 0.1, 0.3, 0.55, 0.99):
        t = threshold_for_share(scores, share)
        assert sum(s >= t for s in scores) == math.ceil(share * 100 - 1e-9)


def test_threshold_ties_go_to_the_precise_tier() -> None:
    """Scores tied at the boundary are all sent, so the realised share may exceed the target."""
    scores = [0.1, 0.5, 0.5, 0.5, 0.9]
    t = threshold_for_share(scores, 0.4)
    assert t == 0.5
    assert share_at_threshold(scores, t) == pytest.approx(0.8)


def test_threshold_extremes() -> None:
    """Share 0 sends nothing (threshold above the maximum); share 1 sends everything."""
    scores = [0.2, 0.7, 0.4]
    assert share_at_threshold(scores, threshold_for_share(scores, 0.0)) == 0.0
    assert threshold_for_share(scores, 0.0) > 0.7
    assert threshold_for_share(scores, 1.0) == 0.2


def test_threshold_is_monotonic_in_share() -> None:
    """A larger share never yields a higher threshold."""
    rng = random.Random(7)
    scores = [rng.random() for _ in range(500)]
    thresholds = [threshold_for_share(scores, s / 20) for s in range(21)]
    assert all(a >= b for a, b in itertools.pairwise(thresholds))


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_threshold_rejects_bad_share(share: float) -> None:
    """Shares outside [0, 1] are refused."""
    with pytest.raises(ValueError, match="share"):
        threshold_for_share([0.5], share)


def test_threshold_rejects_empty_or_nan_sample() -> None:
    """An empty sample or one with NaN cannot define a quantile."""
    with pytest.raises(ValueError, match="at least one"):
        threshold_for_share([], 0.3)
    with pytest.raises(ValueError, match="NaN"):
        threshold_for_share([0.1, float("nan")], 0.3)


def test_controller_config_validation() -> None:
    """Nonsensical controller settings are refused at construction."""
    with pytest.raises(ValueError, match="share"):
        ControllerConfig(target_share=2.0)
    with pytest.raises(ValueError, match="min_samples"):
        ControllerConfig(target_share=0.3, window=10, min_samples=20)
    with pytest.raises(ValueError, match="max_step"):
        ControllerConfig(target_share=0.3, max_step=0.0)


def _feed(controller: ShareController, score: float, *, with_score: bool = True) -> None:
    """Route one request the way the gateway does: decide, then report the decision."""
    controller.observe(controller.decide(score), score if with_score else None)


def test_controller_holds_still_inside_the_dead_band() -> None:
    """A threshold that already gives the target share is never touched."""
    rng = random.Random(1)
    config = ControllerConfig(target_share=0.3)
    controller = ShareController(config, initial_threshold=0.7)
    for _ in range(20_000):
        _feed(controller, rng.random())
    assert controller.threshold == 0.7
    assert controller.state().adjustments == 0
    assert abs(controller.state().observed_share - 0.3) < config.dead_band


def test_controller_steps_are_bounded() -> None:
    """No single adjustment moves the threshold by more than max_step."""
    config = ControllerConfig(
        target_share=0.3, window=2000, max_step=0.01, min_samples=100, adjust_every=50
    )
    controller = ShareController(config, initial_threshold=0.99)
    rng = random.Random(2)
    previous = controller.threshold
    for _ in range(5_000):
        _feed(controller, rng.random())
        assert abs(controller.threshold - previous) <= config.max_step + 1e-12
        previous = controller.threshold


def _reversals(values: list[float]) -> int:
    steps = [b - a for a, b in itertools.pairwise(values) if b != a]
    return sum(1 for a, b in itertools.pairwise(steps) if (a > 0) != (b > 0))


def test_controller_tracks_a_traffic_shift_without_oscillating() -> None:
    """When traffic gets harder, then easier, the share returns to target monotonically."""
    rng = random.Random(3)
    config = ControllerConfig(target_share=0.3)
    controller = ShareController(config, initial_threshold=0.7)
    phases: list[tuple[Callable[[], float], int]] = [  # (score distribution, requests)
        (lambda: rng.betavariate(2, 2), 20_000),
        (lambda: rng.betavariate(5, 2), 30_000),
        (lambda: rng.betavariate(2, 5), 30_000),
    ]
    for draw, count in phases:
        trajectory = []
        for i in range(count):
            _feed(controller, draw())
            if i % config.adjust_every == 0:
                trajectory.append(controller.threshold)
        assert _reversals(trajectory) <= 1, "threshold hunted up and down within a phase"
        settled = trajectory[len(trajectory) // 2 :]
        assert max(settled) - min(settled) <= config.max_step + 1e-12, "no steady state"
        window_scores = [draw() for _ in range(20_000)]
        realised = share_at_threshold(window_scores, controller.threshold)
        assert abs(realised - config.target_share) <= config.dead_band + 0.015
        assert abs(controller.state().observed_share - config.target_share) <= 0.06
    assert controller.state().adjustments > 0


def test_controller_without_scores_converges_by_bounded_steps() -> None:
    """Fed decisions only, the controller walks the threshold into the band and stays there."""
    rng = random.Random(4)
    config = ControllerConfig(target_share=0.3, window=2000, min_samples=1000, max_step=0.02)
    controller = ShareController(config, initial_threshold=0.9)
    trajectory = []
    for i in range(120_000):
        _feed(controller, rng.random(), with_score=False)
        if i % config.window == 0:
            trajectory.append(controller.threshold)
    assert _reversals(trajectory) <= 1
    assert abs(controller.threshold - 0.7) <= config.dead_band + config.max_step
    assert abs(controller.state().observed_share - 0.3) <= config.dead_band + 0.02


def test_controller_records_reported_decisions() -> None:
    """The observed share counts what the gateway reports, including overridden decisions."""
    controller = ShareController(ControllerConfig(target_share=0.5, window=4, min_samples=4), 0.9)
    controller.observe(True, 0.1)
    controller.observe(controller.decide(0.95), 0.95)
    controller.observe(controller.decide(0.2), 0.2)
    state = controller.state()
    assert state.window_fill == 3
    assert state.observed_share == pytest.approx(2 / 3)
    assert state.target_share == 0.5


def test_controller_window_forgets_old_decisions() -> None:
    """Only the last ``window`` decisions count toward the observed share."""
    config = ControllerConfig(target_share=0.5, window=10, min_samples=10, adjust_every=10_000)
    controller = ShareController(config, initial_threshold=0.5)
    for _ in range(10):
        controller.observe(True)
    for _ in range(10):
        controller.observe(False)
    assert controller.state().observed_share == 0.0
    assert controller.state().window_fill == 10
