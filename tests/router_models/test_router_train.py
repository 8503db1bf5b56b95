"""Tests for router_models/training/train.py: determinism, reproducibility of the shipped artifact,
and a quality floor on a held-out part of our own corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import router_models
from router_models.artifact import load, save
from router_models.features import extract, parts_of, render
from router_models.records import body_of, label_of, read_jsonl
from router_models.training.train import DEFAULT_DATA, TrainSettings, featurize, prepare, train

# One training on the corpus took 123 s on the 2-core machine at load average 10 (2026-12-06).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _write(records: list[dict[str, object]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_training_is_deterministic(tmp_path: Path) -> None:
    """The same data and settings give byte-identical artifacts."""
    records = read_jsonl(DEFAULT_DATA[0])[:600]
    data = _write(records, tmp_path / "small.jsonl")
    settings = TrainSettings()
    save(train([data], settings), tmp_path / "a.npz")
    save(train([data], settings), tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_featurize_shares_word_ngrams_without_changing_a_bit() -> None:
    """``featurize`` (one word memo across the data set) gives each body exactly the vector
    ``extract(body)`` gives on its own: same indices, same values to the last bit."""
    records = read_jsonl(DEFAULT_DATA[0])[::10] + read_jsonl(DEFAULT_DATA[1])
    bodies = [body_of(r) for r in records]
    # Prompts with pasted material among them: the after-material n-grams are memoised too.
    assert any(parts_of(render(b).text)[0].material for b in bodies)
    x = featurize(bodies)
    for row, body in enumerate(bodies):
        alone = extract(body)
        start, end = x.indptr[row], x.indptr[row + 1]
        assert x.indices[start:end].tolist() == sorted(alone)
        assert (
            x.data[start:end].tobytes()
            == np.asarray([alone[k] for k in sorted(alone)], dtype=np.float64).tobytes()
        )


def test_shipped_artifact_is_rebuilt_from_the_repository(tmp_path: Path) -> None:
    """Training on the committed corpus reproduces the shipped default artifact."""
    rebuilt = train(list(DEFAULT_DATA))
    save(rebuilt, tmp_path / "rebuilt.npz")
    shipped = load(router_models.DEFAULT_ARTIFACT)
    again = load(tmp_path / "rebuilt.npz")
    assert np.array_equal(again.hashed_index, shipped.hashed_index)
    assert np.allclose(again.hashed_weight, shipped.hashed_weight, rtol=0, atol=1e-12)
    assert np.allclose(again.structural_weight, shipped.structural_weight, rtol=0, atol=1e-12)
    assert abs(again.intercept - shipped.intercept) <= 1e-12
    assert again.metadata["data_digest"] == shipped.metadata["data_digest"]
    assert abs(again.metadata["default_threshold"] - shipped.metadata["default_threshold"]) < 1e-9


def test_quality_floor_on_held_out_corpus() -> None:
    """Fitted on 80 % of the corpus, the router ranks the other 20 % with AUC >= 0.97.

    One fit of the shipped settings' learner, without the calibration's eighteen held-out
    fits: Platt's map is increasing, so the ranking, and the AUC, are the margins'."""
    records = read_jsonl(DEFAULT_DATA[0])
    order = np.random.default_rng(11).permutation(len(records))
    cut = int(0.8 * len(records))
    settings = TrainSettings()
    data = prepare([records[i] for i in order[:cut]], settings)
    model = settings.fitter()(data.x_fit, data.y, data.weight)
    test_part = [records[i] for i in order[cut:]]
    margins = model.margins(featurize([body_of(r) for r in test_part]))
    labels = [label_of(r) for r in test_part]
    assert roc_auc_score(labels, margins) >= 0.97
