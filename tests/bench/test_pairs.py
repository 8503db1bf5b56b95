"""Round 18's within-source pairs: matched inside one source, trainable rows only, and a held-out
source's own pairs never in the fit that scores it."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.classify import pairs
from router_models.training.train import TrainSettings, prepare


def _row(text: str, label: int, source: str, **extra: Any) -> dict[str, Any]:
    kind = "complex" if label else "simple"
    return {"prompt": text, "label": kind, "source": source, **extra}


def _records() -> list[dict[str, Any]]:
    rows = [_row(f"hello there {i}", 0, "tiergate-gen", category="chitchat") for i in range(6)]
    rows += [
        _row(f"prove theorem {i} step by step", 1, "tiergate-gen", category="reasoning")
        for i in range(6)
    ]
    rows += [_row(f"add {i} and 2", 0, "a") for i in range(5)]
    rows += [_row(f"solve the system {i} in three steps", 1, "a") for i in range(3)]
    rows += [_row(f"held for eval {i}", 1, "a", use="eval") for i in range(4)]
    rows += [_row(f"what is {i}", 0, "b") for i in range(4)]  # one label: no pairs
    return rows


def test_pairs_are_matched_inside_one_source_from_trainable_rows() -> None:
    """Source a has 5 simple and 3 complex trainable rows: three pairs, each a complex and a
    simple row of a; the eval rows and the one-label source b give none."""
    data = prepare(_records(), TrainSettings())
    found = pairs.source_pairs(data, seed=0)
    assert set(found) == {"a"}
    complex_, simple = found["a"]
    assert complex_.size == simple.size == 3
    for i, j in zip(complex_, simple, strict=True):
        assert data.groups[i] == data.groups[j] == "a"
        assert (data.y[i], data.y[j]) == (1.0, 0.0)
        assert (bool(data.train_mask[i]), bool(data.train_mask[j])) == (True, True)
    again = pairs.source_pairs(data, seed=0)["a"]
    assert [x.tolist() for x in again] == [complex_.tolist(), simple.tolist()]


def test_each_external_row_gets_a_held_out_score(monkeypatch: Any) -> None:
    """Every external row is scored once, by a fit whose pairs leave its own source out."""
    data = prepare(_records(), TrainSettings())
    seen: list[int] = []
    real = pairs._pair_rows

    def counting(data_: Any, chosen: dict[str, Any], weight: float) -> pairs.PairRows:
        seen.append(len(chosen))
        return real(data_, chosen, weight)

    monkeypatch.setattr(pairs, "_pair_rows", counting)
    chosen = pairs.source_pairs(data, seed=0)
    scores = pairs.pair_loso_scores(data, TrainSettings(), chosen, pair_weight=1.0)
    external = np.array([not g.startswith("corpus/") for g in data.groups])
    assert not np.isnan(scores[external]).any()
    assert np.isnan(scores[~external]).all()
    assert ((scores[external] > 0) & (scores[external] < 1)).all()
    # the calibration fits see a's pairs; holding out a leaves none, holding out b keeps a's
    assert seen == [1, 0, 1]
