"""Deterministic training of the tier router.

1. Read the labelled files, keeping only rows that may be trained on (``"use": "eval"`` rows
   never are), and featurise them with ``features.extract`` (the function serving uses too).
2. Held-out margins by *group* (an external source, or one generator family of our corpus):
   each row's margin comes from a model that never saw its group, so the margins look like
   those of traffic the router was not written for.
3. Platt calibration ``p = sigmoid(a·m + c)`` fitted on those held-out margins: a realistic
   mixture, not a corpus whose classes are trivially separable.
4. The final logistic regression on all the data (liblinear's dual coordinate descent with a
   fixed seed: deterministic, single-threaded).  External rows weigh ``external_weight``
   (default 0: the held-out evaluation shows they hurt on unseen sources).
5. Reference sample = calibrated held-out scores, stratified to a traffic-like mix of
   ``REFERENCE_COMPLEX_SHARE`` complex requests; its quantiles and the default threshold (for
   ``DEFAULT_TARGET_SHARE``) go into the artifact metadata.

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
from router_models.features import FEATURE_SPEC, HASH_SIZE, WordMemo, extract, n_features
from router_models.records import body_of, data_digest, label_of, read_jsonl
from router_models.training.crossval import (
    BoolArray,
    FitFn,
    group_of,
    held_out_margins,
    liblinear,
    platt,
    sigmoid,
    trainable,
)

MODEL_VERSION: Final = "tiergate-router-2"
# The second external set lives beside the repository (read at training time, never copied).
SHARED_DATASETS: Final = Path(__file__).resolve().parents[3] / "shared" / "datasets"
DEV2: Final = SHARED_DATASETS / "router-dev2.jsonl"
DEFAULT_DATA: Final = (DEFAULT_CORPUS, HARD_CASES)
# What ``tiergate router eval --held-out`` holds out, source by source.
HELD_OUT_DATA: Final = (DEFAULT_CORPUS, HARD_CASES, DEV2)
DEFAULT_TARGET_SHARE: Final = 0.30
QUANTILE_POINTS: Final = 101
REFERENCE_COMPLEX_SHARE: Final = 0.25


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """Hyper-parameters; the defaults build the shipped artifact."""

    # 4 since tiergate-hashed-v7 (2 before): chosen with the after-material weight by the
    # selection in docs/router.md, "Instruction words after material (v7)".
    c: float = 4.0
    seed: int = 0
    tol: float = 1e-7
    # Weight of external (non-corpus) rows in the fits.  Leave-one-source-out over
    # router-dev2 falls as it grows (ROC AUC 0.72 at 0, 0.69 at 0.05, 0.66 at 0.25, 0.63 at 1):
    # rows of a few single-label sources teach their packaging, not the task.
    external_weight: float = 0.0
    # Whether external rows' hashed n-grams take part in the fits.  When False they teach
    # only the structural and shape signals (see ``Prepared.x_fit``).
    external_hashed: bool = True
    # Weight of external rows' group-held-out margins in the Platt fit (corpus rows weigh 1).
    # At 0 the calibration sees only the generated corpus; above 0 it sees the mixture of
    # sources the router will meet, so a score means the same on external traffic.
    calibration_external_weight: float = 0.0
    # Whether each external source's trainable rows are reweighted so that its two labels carry
    # equal total weight (``source_label_balance``).  Off: docs/router.md, "Round 13".
    balance_source_labels: bool = False
    # Whether external sources whose trainable rows all carry one label are left out of the
    # fits (weight 0; ``one_label_sources``).  Off: docs/router.md, "Round 14".
    drop_one_label_sources: bool = False
    target_share: float = DEFAULT_TARGET_SHARE

    def fitter(self) -> FitFn:
        """The deterministic liblinear fitter these settings describe."""
        return liblinear(self.c, self.tol, self.seed)


@dataclass(frozen=True, slots=True)
class Prepared:
    """Featurised records with everything the group-held-out fits need."""

    records: list[dict[str, Any]]
    x: sparse.csr_matrix
    x_fit: sparse.csr_matrix
    y: FloatArray
    weight: FloatArray
    calib_weight: FloatArray
    groups: list[str]
    train_mask: BoolArray


def prepare(records: Sequence[dict[str, Any]], settings: TrainSettings) -> Prepared:
    """Featurise labelled records; ``train_mask`` marks the rows that may be trained on."""
    rows = list(records)
    groups = [group_of(r) for r in rows]
    external = np.array([not g.startswith("corpus/") for g in groups], dtype=np.bool_)
    x = featurize([body_of(r) for r in rows])
    y = np.asarray([label_of(r) for r in rows], dtype=np.float64)
    train_mask = np.array([trainable(r) for r in rows], dtype=np.bool_)
    weight = np.where(external, settings.external_weight, 1.0).astype(np.float64)
    if settings.balance_source_labels:
        weight = weight * source_label_balance(groups, y, train_mask)
    if settings.drop_one_label_sources:
        dropped = one_label_sources(groups, y, train_mask)
        weight = np.where(np.isin(groups, dropped), 0.0, weight)
    return Prepared(
        records=rows,
        x=x,
        x_fit=x if settings.external_hashed else _without_hashed(x, external),
        y=y,
        weight=weight,
        calib_weight=np.where(external, settings.calibration_external_weight, 1.0).astype(
            np.float64
        ),
        groups=groups,
        train_mask=train_mask,
    )


def _label_counts(
    groups: Sequence[str], y: FloatArray, train_mask: BoolArray
) -> dict[str, tuple[BoolArray, int, int]]:
    """Each external source (not ``corpus/...``): its trainable rows, and how many of them are
    simple and complex. Both rules below read a source's own trainable rows only."""
    names = np.asarray(groups)
    out = {}
    for group in sorted(set(groups)):
        if not group.startswith("corpus/"):
            rows = (names == group) & train_mask
            n_complex = int(np.count_nonzero(y[rows] == 1.0))
            out[group] = (rows, int(np.count_nonzero(rows)) - n_complex, n_complex)
    return out


def source_label_balance(groups: Sequence[str], y: FloatArray, train_mask: BoolArray) -> FloatArray:
    """Per-row weight factors that give both labels of each external source equal weight.

    A trainable row of external source ``s`` with label ``l`` gets ``n_s / (2 * n_s,l)``,
    counting the trainable rows of ``s`` only, so each label carries half of the source's
    total and the total is unchanged.  Corpus rows (``corpus/...``), sources with a single
    trainable label, and rows never trained on get 1.  A row's factor depends on its own
    source alone: holding another source out of a fit leaves it as it is.
    """
    factor = np.ones(len(groups), dtype=np.float64)
    for rows, n_simple, n_complex in _label_counts(groups, y, train_mask).values():
        if n_complex and n_simple:
            total = n_complex + n_simple
            factor[rows & (y == 1.0)] = total / (2 * n_complex)
            factor[rows & (y != 1.0)] = total / (2 * n_simple)
    return factor


def one_label_sources(groups: Sequence[str], y: FloatArray, train_mask: BoolArray) -> list[str]:
    """The external sources whose trainable rows all carry the same label, sorted.

    Corpus groups (``corpus/...``) and sources with no trainable row are never named.  Whether
    a source is named depends on its own trainable rows alone, so a leave-one-source-out fold
    names the same sources among the rows it trains on as the full mix does.
    """
    counts = _label_counts(groups, y, train_mask)
    return [
        g for g, (_, n_simple, n_complex) in counts.items() if bool(n_simple) != bool(n_complex)
    ]


def _without_hashed(x: sparse.csr_matrix, rows: BoolArray) -> sparse.csr_matrix:
    """``x`` with the hashed n-gram block of ``rows`` set to zero (structural block kept)."""
    keep = sparse.diags(np.where(rows, 0.0, 1.0))
    hashed = (keep @ x[:, :HASH_SIZE]).tocsr()
    out = sparse.hstack([hashed, x[:, HASH_SIZE:]], format="csr")
    out.eliminate_zeros()
    return sparse.csr_matrix(out)


def load_training(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The records of ``paths`` that may be trained on, in file order."""
    return [r for p in paths for r in read_jsonl(p) if trainable(r)]


def featurize(bodies: Sequence[Mapping[str, Any]]) -> sparse.csr_matrix:
    """CSR matrix with one row of ``extract(body)`` per body (one word memo for them all)."""
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    memo = WordMemo()
    for body in bodies:
        feats = extract(body, memo)
        keys = sorted(feats)
        indices.extend(keys)
        values.extend(feats[k] for k in keys)
        indptr.append(len(indices))
    return sparse.csr_matrix(
        (np.asarray(values, dtype=np.float64), np.asarray(indices, dtype=np.int32), indptr),
        shape=(len(bodies), n_features()),
    )


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
    paths: Sequence[Path], data: Prepared, held: FloatArray, settings: TrainSettings
) -> dict[str, Any]:
    ref = reference_sample(held, data.y, REFERENCE_COMPLEX_SHARE)
    scores = ref.tolist()
    return {
        "model_version": MODEL_VERSION,
        "data_files": [p.name for p in paths],
        "data_digest": data_digest(paths),
        "n_examples": int(data.y.size),
        "n_complex": int(data.y.sum()),
        "groups": sorted(set(data.groups)),
        "feature_spec": FEATURE_SPEC,
        "default_target_share": settings.target_share,
        "default_threshold": threshold_for_share(scores, settings.target_share),
        "reference": {
            "sample": "calibrated group-held-out scores of the training data, stratified",
            "complex_share": REFERENCE_COMPLEX_SHARE,
            "size": len(scores),
            "quantiles": np.quantile(ref, np.linspace(0, 1, QUANTILE_POINTS)).tolist(),
        },
        "training": {
            "estimator": "LogisticRegression(solver=liblinear, dual=True)",
            "C": settings.c,
            "seed": settings.seed,
            "tol": settings.tol,
            "external_weight": settings.external_weight,
            "external_hashed": settings.external_hashed,
            "calibration_external_weight": settings.calibration_external_weight,
            # Named only when on, so the shipped artifact's bytes stay as they were.
            **({"balance_source_labels": True} if settings.balance_source_labels else {}),
            **({"drop_one_label_sources": True} if settings.drop_one_label_sources else {}),
            "calibration": "Platt on group-held-out margins (source / generator family)",
        },
        "held_out_roc_auc": round(float(roc_auc_score(data.y, held)), 6),
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


def calibrate_held_out(data: Prepared, settings: TrainSettings) -> tuple[FloatArray, float, float]:
    """Group-held-out margins of every trainable row and the Platt fit on them."""
    mask = data.train_mask
    groups = sorted({g for g, m in zip(data.groups, mask, strict=True) if m})
    margins = held_out_margins(
        data.x, data.y, data.weight, data.groups, mask, settings.fitter(), groups, fit_x=data.x_fit
    )
    a, c = platt(margins[mask], data.y[mask], data.calib_weight[mask])
    return margins, a, c


def train(paths: Sequence[Path], settings: TrainSettings | None = None) -> RouterModel:
    """Fit a calibrated router on labelled JSONL files (``"use": "eval"`` rows skipped)."""
    settings = settings or TrainSettings()
    data = prepare(load_training(paths), settings)
    if np.unique(data.y).size < 2:
        raise ValueError("training data needs both simple and complex examples")
    margins, a, c = calibrate_held_out(data, settings)
    final = settings.fitter()(data.x_fit, data.y, data.weight)
    hashed = final.coef[:HASH_SIZE]
    nonzero = np.flatnonzero(hashed).astype(np.int32)
    return RouterModel(
        hashed_index=nonzero,
        hashed_weight=hashed[nonzero].astype(np.float64),
        structural_weight=final.coef[HASH_SIZE:].astype(np.float64),
        intercept=final.intercept,
        platt_a=a,
        platt_c=c,
        metadata=_metadata(paths, data, sigmoid(a * margins + c), settings),
    )
