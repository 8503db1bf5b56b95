"""Group-held-out fitting: the margins of every row from a model that never saw its group.

A *group* is an external source (``xquad``, ``conala``, ...) or, for the project's own corpus,
a generator family (``corpus/<category>``).  Random K-fold splits put near-duplicates of a
prompt on both sides and measure memorisation; holding whole groups out measures what the
router does on traffic it was not written for.  Training uses these margins for Platt
calibration (a realistic mixture), ``tiergate router eval`` for leave-one-source-out and
leave-one-family-out figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from scipy import sparse
from sklearn.linear_model import LogisticRegression

from router_models.artifact import FloatArray

CORPUS_SOURCES: Final = frozenset(("tiergate-gen", "tiergate-hard"))
BoolArray = npt.NDArray[np.bool_]


def group_of(record: Mapping[str, Any]) -> str:
    """The held-out unit of a record: its source, or its generator family for our corpus."""
    source = str(record.get("source", "-"))
    if source in CORPUS_SOURCES:
        return f"corpus/{record.get('category', '-')}"
    return source


def trainable(record: Mapping[str, Any]) -> bool:
    """Whether a record may be trained on (rows marked ``"use": "eval"`` never are)."""
    return bool(record.get("use", "train") != "eval")


@dataclass(frozen=True, slots=True)
class Linear:
    """A fitted linear model: ``margin = x·coef + intercept``."""

    coef: FloatArray
    intercept: float

    def margins(self, x: sparse.csr_matrix) -> FloatArray:
        """Decision values of the rows of ``x``."""
        return np.asarray(x @ self.coef, dtype=np.float64) + self.intercept


FitFn = Callable[[sparse.csr_matrix, FloatArray, FloatArray], Linear]


def used_columns(x: sparse.csr_matrix) -> tuple[npt.NDArray[np.int64], sparse.csr_matrix]:
    """The columns ``x`` stores an entry in (sorted), and ``x`` narrowed to them.

    The narrowing keeps each row's entries in their order (the new index of a column grows
    with the old one), so a solver that reads rows entry by entry does the same arithmetic."""
    seen = np.zeros(x.shape[1], dtype=np.bool_)
    seen[x.indices] = True
    seen[0] |= not x.nnz  # no entry at all: keep one (empty) column for the solver
    used = np.flatnonzero(seen).astype(np.int64)
    new_index = np.cumsum(seen, dtype=np.int32) - 1
    narrow = new_index[x.indices]
    return used, sparse.csr_matrix((x.data, narrow, x.indptr), shape=(x.shape[0], used.size))


def liblinear(c: float, tol: float, seed: int) -> FitFn:
    """A deterministic liblinear logistic-regression fitter with sample weights.

    The fit sees only the columns ``x`` has an entry in: a hashed block of 2**18 columns is
    mostly empty, and liblinear's dual coordinate descent reads and writes the weights of a
    row's own entries only, in their order (the row order depends on the seed and the number
    of rows alone). So the weights are the same to the last bit, those of the empty columns
    stay 0, and the weight vector the solver writes at random is a third of the size: about
    a sixth less time per fit on the corpus (``tests/router_models/test_router_train.py``
    checks the shipped artifact is rebuilt as it was)."""

    def fit(x: sparse.csr_matrix, y: FloatArray, weight: FloatArray) -> Linear:
        model = LogisticRegression(
            C=c,
            solver="liblinear",
            dual=True,  # far fewer samples than hashed features: the dual is ~15x faster
            tol=tol,
            max_iter=5000,
            random_state=seed,
        )
        used, narrow = used_columns(sparse.csr_matrix(x))
        model.fit(narrow, y, sample_weight=weight)
        coef = np.zeros(x.shape[1], dtype=np.float64)
        coef[used] = model.coef_[0]
        return Linear(coef, float(model.intercept_[0]))

    return fit


def held_out_margins(  # noqa: PLR0917 - the arrays of one Prepared, kept explicit
    x: sparse.csr_matrix,
    y: FloatArray,
    weight: FloatArray,
    groups: Sequence[str],
    train_mask: BoolArray,
    fit: FitFn,
    held_out: Sequence[str],
    *,
    fit_x: sparse.csr_matrix | None = None,
) -> FloatArray:
    """For each group in ``held_out``: fit on the trainable rows of every *other* group and
    write the margins of all that group's rows.  Rows of other groups stay NaN.

    ``fit_x`` (same shape as ``x``) is what the fits see, when it differs from the scored
    features (``Prepared.x_fit``)."""
    fit_rows = x if fit_x is None else fit_x
    names = np.asarray(groups)
    margins = np.full(x.shape[0], np.nan, dtype=np.float64)
    for group in held_out:
        inside = names == group
        use = train_mask & ~inside
        if np.unique(y[use]).size < 2:
            raise ValueError(f"holding out {group!r} leaves a single label to train on")
        model = fit(fit_rows[use], y[use], weight[use])
        margins[inside] = model.margins(x[inside])
    return margins


def platt(
    margins: FloatArray, y: FloatArray, weight: FloatArray | None = None
) -> tuple[float, float]:
    """Slope and offset of ``sigmoid(a·m + c)`` fitted to labels (almost unregularised)."""
    model = LogisticRegression(C=1e6, solver="lbfgs", tol=1e-10, max_iter=1000)
    model.fit(margins.reshape(-1, 1), y, sample_weight=weight)
    return float(model.coef_[0, 0]), float(model.intercept_[0])


def sigmoid(values: FloatArray) -> FloatArray:
    """Elementwise logistic function, safe for large magnitudes."""
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * values)), dtype=np.float64)
