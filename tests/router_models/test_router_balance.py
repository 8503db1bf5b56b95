"""Tests for ``TrainSettings.balance_source_labels``: within-source label balance of the
training weights (docs/router.md, "Round 13")."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from router_models.training.train import Prepared, TrainSettings, prepare
from tests.router_models.weight_mixes import (
    assert_weights_ignore_other_sources,
    loso_fits,
    mix_records,
)

# (group, simple rows, complex rows, eval rows); eval rows are labelled complex.
_MIX = (
    ("corpus/code", 6, 2, 0),
    ("skewed", 3, 9, 2),
    ("even", 4, 4, 0),
    ("one_label", 5, 0, 1),
    ("other_skew", 7, 1, 0),
)
_SETTINGS = TrainSettings(external_weight=0.5, balance_source_labels=True)


def _records() -> list[dict[str, Any]]:
    return mix_records(_MIX, lambda _: "complex")


def _label_sums(data: Prepared, rows: np.ndarray) -> dict[str, dict[float, float]]:
    sums: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for i in rows:
        sums[data.groups[i]][float(data.y[i])] += float(data.weight[i])
    return sums


def test_each_external_source_gives_its_labels_equal_weight() -> None:
    """Both-label sources: equal label sums, same total; everything else unchanged."""
    on = prepare(_records(), _SETTINGS)
    off = prepare(_records(), dataclasses.replace(_SETTINGS, balance_source_labels=False))
    names = np.asarray(on.groups)
    sums = _label_sums(on, np.flatnonzero(on.train_mask))
    for group in ("skewed", "even", "other_skew"):
        assert sums[group][0.0] == pytest.approx(sums[group][1.0])
        rows = (names == group) & on.train_mask
        assert on.weight[rows].sum() == pytest.approx(off.weight[rows].sum())
    assert on.weight[(names == "skewed") & (on.y == 0)] == pytest.approx(0.5 * 12 / 6)
    assert on.weight[(names == "skewed") & (on.y == 1) & on.train_mask] == pytest.approx(
        0.5 * 12 / 18
    )
    unchanged = np.isin(names, ["corpus/code", "even", "one_label"]) | ~on.train_mask
    np.testing.assert_array_equal(on.weight[unchanged], off.weight[unchanged])
    np.testing.assert_array_equal(off.weight, np.where(names == "corpus/code", 1.0, 0.5))


def test_a_rows_weight_ignores_every_other_source() -> None:
    """Dropping a source, or flipping its labels, leaves the other rows' weights as they are."""
    sources = ("skewed", "even", "one_label", "other_skew")
    assert_weights_ignore_other_sources(_records(), _SETTINGS, sources)


def test_every_loso_fold_trains_on_balanced_sources_without_the_held_out_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What each fit receives: the held-out source is absent, and every external source in it
    still has equal label sums (one-hot rows let the fake fitter see which rows it got)."""
    data = prepare(_records(), _SETTINGS)
    _, seen = loso_fits(data, _SETTINGS, monkeypatch)
    names = np.asarray(data.groups)
    trained_groups = {frozenset(names[rows].tolist()) for rows, _ in seen}
    for held in ("skewed", "even", "one_label", "other_skew"):
        assert frozenset(set(data.groups) - {held}) in trained_groups
    for rows, weight in seen:
        np.testing.assert_array_equal(weight, data.weight[rows])
        assert not (~data.train_mask[rows]).any()
        for group, by_label in _label_sums(data, rows).items():
            if len(by_label) == 2 and not group.startswith("corpus/"):
                assert by_label[0.0] == pytest.approx(by_label[1.0])
