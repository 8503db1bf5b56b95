"""The ceiling benchmark's split: every (source, label) cell dealt evenly over the folds."""

from __future__ import annotations

from collections import Counter

import numpy as np

from bench.classify.ceiling import fold_of


def test_each_source_and_label_is_spread_evenly_over_the_folds() -> None:
    """Source a: 10 simple, 7 complex; source b: 3 complex; five folds. Each cell's rows land
    in folds whose counts differ by at most one, so every fold holds both labels of a."""
    groups = ["a"] * 17 + ["b"] * 3
    y = np.array([0.0] * 10 + [1.0] * 7 + [1.0] * 3)
    fold = fold_of(groups, y, 5, seed=3)
    for cell in (range(10), range(10, 17), range(17, 20)):
        counts = Counter(int(fold[i]) for i in cell)
        assert max(counts.values()) - min(counts.values(), default=0) <= 1
        assert sum(counts.values()) == len(cell)
    assert set(fold[:10].tolist()) == set(fold[10:17].tolist()) == set(range(5))


def test_the_split_depends_on_the_seed_only() -> None:
    """The same seed deals the same folds; another seed deals others."""
    groups = ["a"] * 50
    y = np.array([0.0, 1.0] * 25)
    assert fold_of(groups, y, 5, seed=0).tolist() == fold_of(groups, y, 5, seed=0).tolist()
    assert fold_of(groups, y, 5, seed=0).tolist() != fold_of(groups, y, 5, seed=1).tolist()
