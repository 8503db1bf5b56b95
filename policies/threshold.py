"""The cost dial: turn a target share of precise-tier traffic into a score threshold.

A request goes to the precise tier when ``score >= threshold``.  Operators choose a *share*
("30 % of traffic may use the precise tier"), never a raw threshold:

* ``threshold_for_share`` derives the threshold once from a reference sample of scores, the
  way RouteLLM calibrates its routers (the ``1 - share`` quantile of the sample);
* ``ShareController`` keeps adjusting it online so the observed share stays near the target
  when the traffic mix drifts.

Pure standard library: this module is part of the policy core.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace


def _check_share(share: float) -> None:
    if not 0.0 <= share <= 1.0 or math.isnan(share):
        raise ValueError(f"share must be within [0, 1], got {share!r}")


def threshold_for_share(scores: Sequence[float], share: float) -> float:
    """Threshold that sends ``share`` of ``scores`` to the precise tier (``score >= t``).

    With ``k = ceil(share * n)`` the result is the k-th highest score, i.e. the empirical
    ``1 - share`` quantile.  Ties: every score equal to the threshold goes to the precise tier,
    so on a sample with ties at the boundary the realised share can exceed ``share`` (the dial
    errs on the side of quality).  ``share == 0`` gives a threshold just above the highest
    score (nothing is sent); ``share == 1`` gives the lowest score (everything is sent).
    """
    _check_share(share)
    if not scores:
        raise ValueError("need at least one reference score")
    if any(math.isnan(s) for s in scores):
        raise ValueError("reference scores contain NaN")
    return _threshold_of_ranked(sorted(scores), share)


def _threshold_of_ranked(ranked: Sequence[float], share: float) -> float:
    """:func:`threshold_for_share` of scores already in ascending order (at least one)."""
    n = len(ranked)
    k = math.ceil(share * n - 1e-9)
    if k <= 0:
        return math.nextafter(ranked[-1], math.inf)
    return ranked[n - min(k, n)]


def share_at_threshold(scores: Sequence[float], threshold: float) -> float:
    """Fraction of ``scores`` that a threshold sends to the precise tier."""
    if not scores:
        return 0.0
    return sum(1 for s in scores if s >= threshold) / len(scores)


def _share_of_ranked(ranked: Sequence[float], threshold: float) -> float:
    """:func:`share_at_threshold` of scores already in ascending order (at least one)."""
    return (len(ranked) - bisect_left(ranked, threshold)) / len(ranked)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Tuning of the online share controller.

    ``window``: how many recent requests the controller looks at.  ``adjust_every``: how many
    requests between two adjustments.  ``max_step``: the largest threshold change per
    adjustment.  ``score_dead_band``: with scores, no adjustment while the share the current
    threshold would give on the window is within ``target_share ± score_dead_band``; a move
    then goes to the window's own quantile, so one triggered by sampling noise only lands on
    the right threshold for that window.  1.5 points is about 2.3 standard deviations of a
    full window's share, ``sqrt(share * (1 - share) / window)`` (0.0065 for 30 % over 5,000
    requests); it was 3 points until the share-dial test was repeated over seeds (the share
    then settled near the band's edge: up to 2.8 points off, against 0.9 at 1.5 points).
    ``dead_band``: the same for decisions without scores, where moves are blind fixed steps
    and a wide band (several standard deviations) is what stops hunting.
    ``warm_start``: 0 (off), or a number of scores from which a young controller (its window
    not yet full) sets the threshold at every adjustment to the quantile of all the scores it
    has seen (no step bound, no dead band: that is the best estimate it has), and
    from which :meth:`ShareController.retarget` jumps at once (the live dial): the best
    estimate of the threshold is the quantile of every score seen so far.
    """

    target_share: float
    window: int = 5000
    adjust_every: int = 100
    min_samples: int = 1000
    max_step: float = 0.02
    dead_band: float = 0.03
    score_dead_band: float = 0.015
    min_threshold: float = 0.0
    max_threshold: float = 1.0
    warm_start: int = 0

    def __post_init__(self) -> None:
        _check_share(self.target_share)
        if self.window < 1 or self.adjust_every < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError("need window, adjust_every >= 1 and 1 <= min_samples <= window")
        if self.max_step <= 0 or self.dead_band < 0 or self.score_dead_band < 0:
            raise ValueError("max_step must be positive and dead_band non-negative")
        if self.min_threshold > self.max_threshold:
            raise ValueError("min_threshold must not exceed max_threshold")
        if not 0 <= self.warm_start <= self.window:
            raise ValueError("warm_start must be within [0, window]")


@dataclass(frozen=True, slots=True)
class ControllerState:
    """A snapshot for metrics: the threshold in force and what the window shows."""

    threshold: float
    target_share: float
    observed_share: float
    window_fill: int
    adjustments: int


class ShareController:
    """Keeps the precise-tier share near a target over a rolling window of requests.

    The gateway reports each classifier decision with ``observe(sent_precise, score)``.
    Every ``adjust_every`` observations the controller may move the threshold:

    * **with scores** (the normal case): it computes the share the *current* threshold gives
      on the window's scores.  Inside the dead band nothing changes.  Outside it, the threshold
      moves toward the window's ``1 - target`` quantile by at most ``max_step``.  The target of
      a move comes from scores, not from lagging decisions, and a move never passes it, so the
      threshold approaches the right value monotonically and does not overshoot or hunt.
    * **decisions only** (no scores reported): it compares the observed share with the target
      and, outside the dead band, moves by ``max_step`` in the direction that corrects it, then
      waits a whole window so the next judgement sees only decisions made under the new
      threshold (no reaction to its own lag).

    The window's scores are also kept in ascending order, updated as each one arrives and
    leaves (a binary search and a shift, about 1 µs for a window of 5,000), so an adjustment
    reads the share and the quantile at once instead of scanning and sorting the window: no
    request pays for the controller more than any other. A NaN score is not recorded. Both
    copies are arrays of doubles (16 bytes a score: 80 KB for a full window of 5,000), so a
    gateway can keep one controller per tenant.

    With ``warm_start`` set, a young window (not yet full) moves straight to its quantile, and
    :meth:`retarget` / :meth:`seed` re-aim the controller at once (see ``ControllerConfig``).

    Not thread-safe: use one per event loop (or guard it).
    """

    def __init__(self, config: ControllerConfig, initial_threshold: float) -> None:
        self._config = config
        self._threshold = self._clamp(initial_threshold)
        self._scores = array("d")  # the window's scores in arrival order (a ring once full)
        self._head = 0  # the oldest score's position once the ring is full
        self._ranked = array("d")  # the same scores in ascending order
        self._decisions: deque[bool] = deque(maxlen=config.window)
        self._precise = 0
        self._since_adjust = 0
        self._since_move = 0
        self._adjustments = 0

    @property
    def threshold(self) -> float:
        """The threshold currently in force."""
        return self._threshold

    def _clamp(self, value: float) -> float:
        return min(self._config.max_threshold, max(self._config.min_threshold, value))

    def decide(self, score: float) -> bool:
        """Whether ``score`` goes to the precise tier under the current threshold."""
        return score >= self._threshold

    def observe(self, sent_precise: bool, score: float | None = None) -> None:
        """Record one classifier decision (and its score, when known)."""
        if len(self._decisions) == self._config.window and self._decisions[0]:
            self._precise -= 1
        self._decisions.append(sent_precise)
        self._precise += sent_precise
        if score is not None and not math.isnan(score):
            self._record(score)
        self._since_adjust += 1
        self._since_move += 1
        if self._since_adjust >= self._config.adjust_every:
            self._since_adjust = 0
            self._adjust()

    def _record(self, score: float) -> None:
        scores, ranked = self._scores, self._ranked
        if len(scores) == self._config.window:
            head = self._head
            del ranked[bisect_left(ranked, scores[head])]
            scores[head] = score
            self._head = (head + 1) % len(scores)
        else:
            scores.append(score)
        insort(ranked, score)

    def _move(self, target: float, *, bounded: bool = True) -> None:
        step = target - self._threshold
        if bounded:
            step = max(-self._config.max_step, min(self._config.max_step, step))
        updated = self._clamp(self._threshold + step)
        if updated != self._threshold:
            self._threshold = updated
            self._adjustments += 1
            self._since_move = 0

    def _adjust(self) -> None:
        cfg = self._config
        ranked = self._ranked
        if 0 < cfg.warm_start <= len(ranked) < cfg.window:  # young: every score seen so far
            self._move(_threshold_of_ranked(ranked, cfg.target_share), bounded=False)
            return
        if len(ranked) >= cfg.min_samples:
            share = _share_of_ranked(ranked, self._threshold)
            if abs(share - cfg.target_share) > cfg.score_dead_band:
                self._move(_threshold_of_ranked(ranked, cfg.target_share))
            return
        if len(self._decisions) < cfg.min_samples or self._since_move < cfg.window:
            return
        error = self._precise / len(self._decisions) - cfg.target_share
        if abs(error) > cfg.dead_band:
            self._move(self._threshold + (cfg.max_step if error > 0 else -cfg.max_step))

    @property
    def config(self) -> ControllerConfig:
        """The tuning in force (its ``target_share`` changes with :meth:`retarget`)."""
        return self._config

    @property
    def scores(self) -> int:
        """How many scores the window holds."""
        return len(self._ranked)

    def retarget(self, share: float, fallback_threshold: float | None = None) -> None:
        """Aim at a new target share now (the live dial).

        With at least ``warm_start`` scores in the window (and ``warm_start`` on), the
        threshold jumps to the window's quantile for ``share``: the recent traffic says where
        the new target lies, so it holds from the next request. With fewer, it becomes
        ``fallback_threshold`` when one is given (the artifact's calibration) and the
        controller learns from there. The decision window restarts either way: decisions made
        under the old target say nothing about the new one.
        """
        _check_share(share)
        self._config = replace(self._config, target_share=share)
        self._decisions.clear()
        self._precise = 0
        self._since_adjust = 0
        warm = self._config.warm_start
        if warm and len(self._ranked) >= warm:
            self._move(_threshold_of_ranked(self._ranked, share), bounded=False)
        elif fallback_threshold is not None:
            self._move(fallback_threshold, bounded=False)

    def seed(self, scores: Iterable[float]) -> None:
        """Replace the window with ``scores`` (oldest first; the scores of recent traffic
        under a new artifact) and, with enough of them (``warm_start``, or 1 when off), set
        the threshold at once on their quantile for the current target."""
        kept = [s for s in scores if not math.isnan(s)][-self._config.window :]
        self._scores = array("d", kept)
        self._head = 0
        self._ranked = array("d", sorted(kept))
        self._decisions.clear()
        self._precise = 0
        self._since_adjust = 0
        if kept and len(kept) >= max(1, self._config.warm_start):
            self._move(_threshold_of_ranked(self._ranked, self._config.target_share), bounded=False)

    def state(self) -> ControllerState:
        """Current threshold, target, observed precise share over the window, and counters."""
        fill = len(self._decisions)
        return ControllerState(
            threshold=self._threshold,
            target_share=self._config.target_share,
            observed_share=self._precise / fill if fill else 0.0,
            window_fill=fill,
            adjustments=self._adjustments,
        )
