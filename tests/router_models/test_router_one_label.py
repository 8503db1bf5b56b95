"""Tests for ``TrainSettings.drop_one_label_sources``: external sources whose trainable rows
carry one label are left out of the fits (docs/router.md, "Round 14")."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from router_models.training.train import TrainSettings, one_label_sources, prepare
from tests.router_models.weight_mixes import (
    assert_weights_ignore_other_sources,
    loso_fits,
    mix_records,
)

# (group, simple rows, complex rows, eval rows of the other label)
_MIX = (
    ("corpus/code", 6, 0, 0),  # one label, but corpus: kept
    ("both", 3, 9, 0),
    ("all_simple", 5, 0, 2),  # its eval rows are complex: still one trainable label
    ("all_complex", 0, 4, 0),
    ("eval_only", 0, 0, 3),  # no trainable row: nothing to leave out
    ("even", 4, 4, 0),
)
_SETTINGS = TrainSettings(external_weight=0.5, drop_one_label_sources=True)
_DROPPED = ["all_complex", "all_simple"]


def _records() -> list[dict[str, Any]]:
    # eval rows carry the other label: "all_simple" stays one-label in its trainable rows
    return mix_records(_MIX, lambda n_simple: "complex" if n_simple else "simple")


def test_one_label_sources_are_named_from_trainable_rows_only() -> None:
    data = prepare(_records(), _SETTINGS)
    assert one_label_sources(data.groups, data.y, data.train_mask) == _DROPPED
    assert one_label_sources(data.groups, data.y, np.ones_like(data.train_mask)) == [
        "all_complex",
        "eval_only",
    ]


def test_only_the_one_label_sources_lose_their_weight() -> None:
    on = prepare(_records(), _SETTINGS)
    off = prepare(_records(), dataclasses.replace(_SETTINGS, drop_one_label_sources=False))
    dropped = np.isin(on.groups, _DROPPED)
    assert (on.weight[dropped] == 0.0).all()
    np.testing.assert_array_equal(on.weight[~dropped], off.weight[~dropped])
    np.testing.assert_array_equal(
        off.weight, np.where(np.asarray(on.groups) == "corpus/code", 1, 0.5)
    )
    np.testing.assert_array_equal(on.train_mask, off.train_mask)
    np.testing.assert_array_equal(on.y, off.y)


def test_it_combines_with_label_balance() -> None:
    both = dataclasses.replace(_SETTINGS, balance_source_labels=True)
    balanced = dataclasses.replace(both, drop_one_label_sources=False)
    on, ref = prepare(_records(), both), prepare(_records(), balanced)
    dropped = np.isin(on.groups, _DROPPED)
    assert (on.weight[dropped] == 0.0).all()
    np.testing.assert_array_equal(on.weight[~dropped], ref.weight[~dropped])


def test_a_rows_weight_ignores_every_other_source() -> None:
    """Removing a source, or flipping its labels, leaves every other row's weight as it is."""
    sources = sorted({g for g, *_ in _MIX} - {"corpus/code"})
    assert_weights_ignore_other_sources(_records(), _SETTINGS, sources)


def test_every_loso_fold_trains_without_one_label_sources_and_scores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each fit gets the one-label sources at weight 0 and never the held-out source; the
    one-label sources are still held out and scored (one-hot rows show the fitter its rows)."""
    data = prepare(_records(), _SETTINGS)
    scores, seen = loso_fits(data, _SETTINGS, monkeypatch)
    names = np.asarray(data.groups)
    assert not np.isnan(scores[names != "corpus/code"]).any()
    trained_groups = {frozenset(names[rows].tolist()) for rows, _ in seen}
    for held in ("both", "all_simple", "all_complex", "even"):
        assert frozenset(set(names[data.train_mask].tolist()) - {held}) in trained_groups
    for rows, weight in seen:
        np.testing.assert_array_equal(weight, data.weight[rows])
        assert not (~data.train_mask[rows]).any()
        assert (weight[np.isin(names[rows], _DROPPED)] == 0.0).all()
        assert (weight[~np.isin(names[rows], _DROPPED)] > 0.0).all()


def test_weight_zero_rows_fit_as_if_absent() -> None:
    """liblinear gives the same model with the dropped rows at weight 0 as without them."""
    data = prepare(_records(), _SETTINGS)
    fit = _SETTINGS.fitter()
    rows = data.train_mask
    kept = rows & (data.weight > 0)
    with_zero = fit(data.x_fit[rows], data.y[rows], data.weight[rows])
    without = fit(data.x_fit[kept], data.y[kept], data.weight[kept])
    np.testing.assert_allclose(with_zero.coef, without.coef, rtol=0, atol=1e-12)
    assert with_zero.intercept == pytest.approx(without.intercept, rel=0, abs=1e-12)


def test_no_change_at_the_shipped_external_weight() -> None:
    """At external weight 0 (the shipped setting) every external row already weighs 0."""
    shipped = dataclasses.replace(_SETTINGS, external_weight=0.0)
    on = prepare(_records(), shipped)
    off = prepare(_records(), dataclasses.replace(shipped, drop_one_label_sources=False))
    np.testing.assert_array_equal(on.weight, off.weight)
