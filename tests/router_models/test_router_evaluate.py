"""Tests for router_models/training/evaluate.py: the operating point and the share curve."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.training.evaluate import operating_threshold, roc_auc, share_curve


def test_operating_threshold_catches_95_percent() -> None:
    """The operating threshold catches at least 95 % of complex items, and is the highest such."""
    rng = np.random.default_rng(0)
    scores = rng.random(1000)
    labels = (rng.random(1000) < 0.4).astype(np.int_)
    t = operating_threshold(scores, labels)
    complex_scores = scores[labels == 1]
    assert (complex_scores >= t).mean() >= 0.95
    assert (complex_scores > t).mean() < 0.95


def test_share_curve_is_monotonic_and_complete() -> None:
    """The curve rises from the top-scored items to (1, 1), collapsing tied scores."""
    scores = np.array([0.9, 0.8, 0.8, 0.3, 0.1])
    labels = np.array([1, 1, 0, 1, 0])
    curve = share_curve(scores, labels)
    assert [p["threshold"] for p in curve] == [0.9, 0.8, 0.3, 0.1]
    shares = [p["precise_share"] for p in curve]
    caught = [p["complex_caught"] for p in curve]
    assert shares == sorted(shares)
    assert caught == sorted(caught)
    assert curve[-1]["precise_share"] == curve[-1]["complex_caught"] == 1.0
    assert curve[1]["simple_sent"] == 0.5


def test_roc_auc_matches_scikit_learn_with_ties() -> None:
    """Our rank-based AUC equals scikit-learn's, including tied scores."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    labels = (rng.random(500) < 0.3).astype(np.int_)
    scores = np.round(rng.random(500) + 0.3 * labels, 1).astype(np.float64)
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
