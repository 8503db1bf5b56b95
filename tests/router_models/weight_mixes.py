"""Small training mixes and the checks that the training-weight tests share (the label balance
of docs/router.md "Round 13" and the one-label sources of "Round 14")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from scipy import sparse

from router_models.artifact import FloatArray
from router_models.training.crossval import Linear
from router_models.training.honest import loso_scores
from router_models.training.train import Prepared, TrainSettings, prepare

# (group, simple rows, complex rows, eval rows): a group named corpus/... is the corpus.
Mix = Sequence[tuple[str, int, int, int]]
Fit = tuple[np.ndarray, FloatArray]  # the rows one fit received, and their weights


def mix_records(mix: Mix, eval_label: Callable[[int], str]) -> list[dict[str, Any]]:
    """The records of ``mix``; a group's eval rows get ``eval_label(its simple rows)``."""
    out: list[dict[str, Any]] = []
    for group, n_simple, n_complex, n_eval in mix:
        source, category = ("tiergate-gen", "code") if group == "corpus/code" else (group, "x")
        labels = ["simple"] * n_simple + ["complex"] * n_complex
        labels += [eval_label(n_simple)] * n_eval
        for i, label in enumerate(labels):
            record = {"source": source, "category": category, "label": label}
            record["prompt"] = f"{group} prompt {i}: {label}"
            if i >= n_simple + n_complex:
                record["use"] = "eval"
            out.append(record)
    return out


def assert_weights_ignore_other_sources(
    records: list[dict[str, Any]], settings: TrainSettings, sources: Sequence[str]
) -> None:
    """Removing one of ``sources``, or flipping its labels, leaves every other row's weight."""
    full = prepare(records, settings)
    for held in sources:
        kept = [r for r in records if r["source"] != held]
        flipped = [
            {**r, "label": "simple" if r["label"] == "complex" else "complex"}
            if r["source"] == held
            else r
            for r in records
        ]
        others = np.asarray(full.groups) != held
        np.testing.assert_array_equal(prepare(kept, settings).weight, full.weight[others])
        np.testing.assert_array_equal(
            prepare(flipped, settings).weight[others], full.weight[others]
        )


def loso_fits(
    data: Prepared, settings: TrainSettings, monkeypatch: pytest.MonkeyPatch
) -> tuple[FloatArray, list[Fit]]:
    """Leave-one-source-out over ``data`` with a fake fitter that records what each fit gets
    (one-hot rows let it see which rows those are); the scores and every fit's rows."""
    n = data.y.size
    ident = sparse.identity(n, format="csr", dtype=np.float64)
    one_hot = dataclasses.replace(data, x=ident, x_fit=ident)
    seen: list[Fit] = []

    def fitter(_: TrainSettings) -> Any:
        def fit(x: sparse.csr_matrix, y: FloatArray, weight: FloatArray) -> Linear:
            seen.append((np.asarray(x.indices), weight.copy()))
            return Linear(np.zeros(n), 0.0)

        return fit

    monkeypatch.setattr(TrainSettings, "fitter", fitter)
    return loso_scores(one_hot, settings), seen
