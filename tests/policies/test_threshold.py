"""Tests for policies/threshold.py: the share dial and the online share controller."""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
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
    """A threshold that already gives the target share stays: fed decisions only it is never
    touched; with scores, a move set off by sampling noise (the band is 2.3 standard
    deviations of a full window) lands on the window's own quantile, next to where it was."""
    rng = random.Random(1)
    config = ControllerConfig(target_share=0.3)
    blind = ShareController(config, initial_threshold=0.7)
    for _ in range(20_000):
        _feed(blind, rng.random(), with_score=False)
    assert blind.threshold == 0.7
    assert blind.state().adjustments == 0
    controller = ShareController(config, initial_threshold=0.7)
    for _ in range(20_000):
        _feed(controller, rng.random())
    assert abs(controller.threshold - 0.7) <= 0.015
    assert controller.state().adjustments <= 10
    assert abs(controller.state().observed_share - 0.3) < config.score_dead_band


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


class _ScanningController:
    """The controller as first written: every adjustment scans, and on a move sorts, a copy of
    the whole window. The reference the incremental controller must match move for move."""

    def __init__(self, config: ControllerConfig, initial: float) -> None:
        self.config = config
        self.threshold = initial
        self.scores: deque[float] = deque(maxlen=config.window)
        self.since_adjust = 0

    def observe(self, score: float) -> None:
        cfg = self.config
        self.scores.append(score)
        self.since_adjust += 1
        if self.since_adjust < cfg.adjust_every:
            return
        self.since_adjust = 0
        if len(self.scores) < cfg.min_samples:
            return
        window = list(self.scores)
        if abs(share_at_threshold(window, self.threshold) - cfg.target_share) > cfg.score_dead_band:
            target = threshold_for_share(window, cfg.target_share)
            step = max(-cfg.max_step, min(cfg.max_step, target - self.threshold))
            self.threshold = min(cfg.max_threshold, max(cfg.min_threshold, self.threshold + step))


@pytest.mark.parametrize("seed", range(6))
def test_incremental_window_moves_exactly_like_a_full_scan(seed: int) -> None:
    """Keeping the window's scores sorted as they come and go changes no decision: on traffic
    with drifts, heavy ties (scores from a coarse grid) and a window that wraps many times,
    the threshold after every request equals the one a full scan and sort gives."""
    rng = random.Random(seed)
    config = ControllerConfig(
        target_share=rng.choice((0.1, 0.3, 0.5)),
        window=rng.choice((50, 200, 1000)),
        adjust_every=rng.choice((1, 7, 50)),
        min_samples=20,
        max_step=0.05,
        score_dead_band=rng.choice((0.0, 0.02)),
    )
    incremental = ShareController(config, initial_threshold=0.6)
    reference = _ScanningController(config, 0.6)
    for i in range(6_000):
        mix = 0.2 if (i // 1500) % 2 else 0.7  # the traffic mix flips every 1,500 requests
        score = rng.random() if rng.random() < mix else rng.random() * 0.4
        if rng.random() < 0.5:
            score = round(score, 1)  # ties at the boundary
        incremental.observe(incremental.decide(score), score)
        reference.observe(score)
        assert incremental.threshold == reference.threshold, f"request {i}"
    assert incremental.state().adjustments > 0


def test_controller_ignores_nan_scores() -> None:
    """A NaN score (a broken model) is not put in the window and stops nothing: the controller
    keeps adjusting on the real scores around it."""
    config = ControllerConfig(target_share=0.3, window=200, min_samples=50, adjust_every=10)
    controller = ShareController(config, initial_threshold=0.99)
    rng = random.Random(3)
    for i in range(3_000):
        score = math.nan if i % 3 == 0 else rng.random()
        controller.observe(controller.decide(score), score)
    assert controller.threshold < 0.9
    assert abs(controller.threshold - 0.7) < 0.1
