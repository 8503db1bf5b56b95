"""Deterministic training of the tier router.

1. Featurise every record with ``features.extract`` (the function serving uses too).
2. Out-of-fold margins from a K-fold split fixed by a seeded permutation.
3. Platt calibration ``p = sigmoid(a·m + c)`` fitted on those out-of-fold margins.
4. The final logistic regression on all the data (liblinear's dual coordinate descent with a
   fixed seed: deterministic, single-threaded).
5. Reference sample = calibrated out-of-fold scores, stratified to a traffic-like mix of
   ``REFERENCE_COMPLEX_SHARE`` complex requests (the corpus itself is almost half complex);
   its quantiles and the default threshold (for ``DEFAULT_TARGET_SHARE``) go into the
   artifact metadata.

Same data and settings give the same artifact bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from policies.threshold import threshold_for_share
from router_models.artifact import FloatArray, RouterModel
from router_models.corpus.build import DEFAULT_CORPUS, HARD_CASES
from router_models.features import FEATURE_SPEC, HASH_SIZE, extract, n_features
from router_models.records import body_of, data_digest, load_labelled

MODEL_VERSION: Final = "tiergate-router-1"
DEFAULT_DATA: Final = (DEFAULT_CORPUS, HARD_CASES)
DEFAULT_TARGET_SHARE: Final = 0.30
QUANTILE_POINTS: Final = 101
REFERENCE_COMPLEX_SHARE: Final = 0.25


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """Hyper-parameters; the defaults build the shipped artifact."""

    c: float = 2.0
    folds: int = 5
    seed: int = 0
    tol: float = 1e-7
    target_share: float = DEFAULT_TARGET_SHARE


def featurize(bodies: Sequence[Mapping[str, Any]]) -> sparse.csr_matrix:
    """CSR matrix with one row of ``extract(body)`` per body."""
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    for body in bodies:
        feats = extract(body)
        keys = sorted(feats)
        indices.extend(keys)
        values.extend(feats[k] for k in keys)
        indptr.append(len(indices))
    return sparse.csr_matrix(
        (np.asarray(values, dtype=np.float64), np.asarray(indices, dtype=np.int32), indptr),
        shape=(len(bodies), n_features()),
    )


def _classifier(settings: TrainSettings) -> LogisticRegression:
    return LogisticRegression(
        C=settings.c,
        solver="liblinear",
        dual=True,  # far fewer samples than hashed features: the dual is ~15x faster
        tol=settings.tol,
        max_iter=5000,
        random_state=settings.seed,
    )


def out_of_fold_margins(
    x: sparse.csr_matrix, y: FloatArray, settings: TrainSettings
) -> FloatArray:
    """Decision values of each row from a model that did not see it."""
    order = np.random.default_rng(settings.seed).permutation(x.shape[0])
    fold_of = np.empty(x.shape[0], dtype=np.int64)
    fold_of[order] = np.arange(x.shape[0]) % settings.folds
    margins = np.zeros(x.shape[0], dtype=np.float64)
    for fold in range(settings.folds):
        test = fold_of == fold
        model = _classifier(settings).fit(x[~test], y[~test])
        margins[test] = model.decision_function(x[test])
    return margins


def platt(margins: FloatArray, y: FloatArray) -> tuple[float, float]:
    """Slope and offset of ``sigmoid(a·m + c)`` fitted to labels (almost unregularised)."""
    model = LogisticRegression(C=1e6, solver="lbfgs", tol=1e-10, max_iter=1000)
    model.fit(margins.reshape(-1, 1), y)
    return float(model.coef_[0, 0]), float(model.intercept_[0])


def reference_sample(scores: FloatArray, y: FloatArray, complex_share: float) -> FloatArray:
    """All simple scores plus an evenly spaced (stratified) subset of the complex ones, so
    that complex requests make up ``complex_share`` of the sample."""
    simple = np.sort(scores[y == 0])
    complex_ = np.sort(scores[y == 1])
    wanted = round(simple.size * complex_share / (1.0 - complex_share))
    wanted = max(1, min(complex_.size, wanted))
    picks = np.linspace(0, complex_.size - 1, wanted).round().astype(np.int64)
    return np.concatenate([simple, complex_[picks]])


def _metadata(
    paths: Sequence[Path], y: FloatArray, oof: FloatArray, settings: TrainSettings
) -> dict[str, Any]:
    ref = reference_sample(oof, y, REFERENCE_COMPLEX_SHARE)
    scores = ref.tolist()
    return {
        "model_version": MODEL_VERSION,
        "data_files": [p.name for p in paths],
        "data_digest": data_digest(paths),
        "n_examples": int(y.size),
        "n_complex": int(y.sum()),
        "feature_spec": FEATURE_SPEC,
        "default_target_share": settings.target_share,
        "default_threshold": threshold_for_share(scores, settings.target_share),
        "reference": {
            "sample": "calibrated out-of-fold scores of the training corpus, stratified",
            "complex_share": REFERENCE_COMPLEX_SHARE,
            "size": len(scores),
            "quantiles": np.quantile(ref, np.linspace(0, 1, QUANTILE_POINTS)).tolist(),
        },
        "training": {
            "estimator": "LogisticRegression(solver=liblinear, dual=True)",
            "C": settings.c,
            "folds": settings.folds,
            "seed": settings.seed,
            "tol": settings.tol,
            "calibration": "Platt on out-of-fold margins",
        },
        "cv_roc_auc": round(float(roc_auc_score(y, oof)), 6),
    }


def sklearn_equivalent(model: RouterModel) -> LogisticRegression:
    """A scikit-learn classifier with the artifact's calibrated weights folded in.

    Its ``predict_proba(featurize([body]))[:, 1]`` is what the lean scorer must reproduce;
    tests and the latency benchmark compare the two.
    """
    dense, bias = model.folded_weights()
    clf = LogisticRegression()
    clf.classes_ = np.array([0, 1])
    clf.coef_ = dense.reshape(1, -1)
    clf.intercept_ = np.array([bias])
    clf.n_features_in_ = n_features()
    return clf


def train(paths: Sequence[Path], settings: TrainSettings | None = None) -> RouterModel:
    """Fit a calibrated router on labelled JSONL files."""
    settings = settings or TrainSettings()
    records, labels = load_labelled(paths)
    if len(set(labels)) < 2:
        raise ValueError("training data needs both simple and complex examples")
    x = featurize([body_of(r) for r in records])
    y = np.asarray(labels, dtype=np.float64)
    margins = out_of_fold_margins(x, y, settings)
    a, c = platt(margins, y)
    reference = 1.0 / (1.0 + np.exp(-(a * margins + c)))
    final = _classifier(settings).fit(x, y)
    coef = final.coef_[0]
    hashed = coef[:HASH_SIZE]
    nonzero = np.flatnonzero(hashed).astype(np.int32)
    return RouterModel(
        hashed_index=nonzero,
        hashed_weight=hashed[nonzero].astype(np.float64),
        structural_weight=coef[HASH_SIZE:].astype(np.float64),
        intercept=float(final.intercept_[0]),
        platt_a=a,
        platt_c=c,
        metadata=_metadata(paths, y, reference, settings),
    )
