"""Round 18: leave-one-source-out with within-source pairs as training rows.

The in-distribution ceiling (docs/router.md) says the gap is transfer to an unseen source's
packaging. A pointwise row of an external source teaches its packaging along with its label;
the difference of two rows of one source (a complex one minus a simple one) does not, as what
both rows share cancels. This script measures a fit on the corpus (pointwise, as shipped) plus
such difference rows: each external source whose trainable rows carry both labels gives
``min(n_complex, n_simple)`` pairs, complex and simple rows matched at random (``--seed``),
each pair written twice (``x_c - x_s`` labelled complex, ``x_s - x_c`` simple) at ``--pair-weight``
each. External rows keep weight 0 as pointwise rows (the shipped setting).

Folds: every external source is held out in turn; its own pairs leave the fit with it. The
scores are calibrated with one Platt fit on the corpus rows' leave-one-family-out margins, as
the shipped report does; those calibration fits see every source's pairs (two numbers are
fitted there, so the held-out source's pairs can move the scale a little, not the ranking
within a fold). The figures are printed by ``loso_sources.lines``, as for every other round.

Usage (under ``nice -n 19``)::

    .venv/bin/python bench/classify/pairs.py --data router_models/corpus/tiergate-corpus.jsonl \\
        router_models/corpus/hard-cases.jsonl router_models/training/data/external-train.jsonl \\
        router_models/training/data/followbench.jsonl ../shared/datasets/router-dev2.jsonl \\
        --out bench/classify/loso-round18.txt
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import sparse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.classify.loso_sources import emit, lines  # noqa: E402
from router_models.artifact import FloatArray  # noqa: E402
from router_models.records import read_jsonl  # noqa: E402
from router_models.training.crossval import (  # noqa: E402
    FitFn,
    Linear,
    held_out_margins,
    platt,
    sigmoid,
)
from router_models.training.train import Prepared, TrainSettings, prepare  # noqa: E402

IndexArray = npt.NDArray[np.intp]
PairRows = tuple[sparse.csr_matrix, FloatArray, FloatArray]


def source_pairs(data: Prepared, seed: int) -> dict[str, tuple[IndexArray, IndexArray]]:
    """For each external source with both labels among its trainable rows: its pairs, as
    (complex row indices, simple row indices) of equal length, matched at random."""
    rng = np.random.default_rng(seed)
    names = np.asarray(data.groups)
    out: dict[str, tuple[IndexArray, IndexArray]] = {}
    for group in sorted(set(data.groups)):
        if group.startswith("corpus/"):
            continue
        mine = (names == group) & data.train_mask
        complex_ = rng.permutation(np.flatnonzero(mine & (data.y == 1)))
        simple = rng.permutation(np.flatnonzero(mine & (data.y == 0)))
        n = min(complex_.size, simple.size)
        if n:
            out[group] = (complex_[:n], simple[:n])
    return out


def _pair_rows(
    data: Prepared, pairs: dict[str, tuple[IndexArray, IndexArray]], weight: float
) -> PairRows:
    """The difference rows of ``pairs``, both ways, with their labels and weights."""
    if not pairs:
        empty = sparse.csr_matrix((0, data.x_fit.shape[1]))
        return empty, np.zeros(0), np.zeros(0)
    c = np.concatenate([p[0] for p in pairs.values()])
    s = np.concatenate([p[1] for p in pairs.values()])
    diff = data.x_fit[c] - data.x_fit[s]
    rows = sparse.vstack([diff, -diff]).tocsr()
    labels = np.concatenate([np.ones(c.size), np.zeros(c.size)])
    return rows, labels, np.full(2 * c.size, weight)


def _plus(settings: TrainSettings, extra: PairRows) -> FitFn:
    """The shipped settings' fitter, with the rows of ``extra`` added to every fit."""
    rows, labels, weights = extra
    fit = settings.fitter()

    def fit_with(x: sparse.csr_matrix, y: FloatArray, w: FloatArray) -> Linear:
        x = sparse.vstack([x, rows]).tocsr()
        return fit(x, np.concatenate([y, labels]), np.concatenate([w, weights]))

    return fit_with


def _held_out(data: Prepared, fit: FitFn, groups: Sequence[str]) -> FloatArray:
    return held_out_margins(
        data.x, data.y, data.weight, data.groups, data.train_mask, fit, groups, fit_x=data.x_fit
    )


def pair_loso_scores(
    data: Prepared,
    settings: TrainSettings,
    pairs: dict[str, tuple[IndexArray, IndexArray]],
    pair_weight: float,
) -> FloatArray:
    """The calibrated leave-one-source-out score of every external row (NaN elsewhere), each
    fold fitted with the ``pairs`` of every other source."""
    names = np.asarray(data.groups)
    corpus = sorted({g for g in data.groups if g.startswith("corpus/")})
    # Platt's inputs: each corpus family's margins from a fit without it (and with every pair)
    margins = _held_out(data, _plus(settings, _pair_rows(data, pairs, pair_weight)), corpus)
    calib = np.isin(names, corpus) & data.train_mask
    a, c = platt(margins[calib], data.y[calib])
    scores = np.full(data.y.size, np.nan)
    for group in sorted({g for g in data.groups if not g.startswith("corpus/")}):
        others = {g: p for g, p in pairs.items() if g != group}
        held = _held_out(data, _plus(settings, _pair_rows(data, others, pair_weight)), [group])
        inside = names == group
        scores[inside] = sigmoid(a * held[inside] + c)
        print(f"held out {group}: {int(inside.sum())} rows", file=sys.stderr, flush=True)
    return scores


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report (and write it with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, nargs="+", required=True)
    parser.add_argument("--pair-weight", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = TrainSettings()  # external rows at weight 0 as pointwise rows: the shipped fit
    per_file = [read_jsonl(p) for p in args.data]
    data = prepare([r for records in per_file for r in records], settings)
    pairs = source_pairs(data, args.seed)
    scores = pair_loso_scores(data, settings, pairs, args.pair_weight)
    head = (
        f"round 18: corpus + within-source pairs at weight {args.pair_weight} (seed {args.seed};"
        f" pairs: {', '.join(f'{g} {p[0].size}' for g, p in pairs.items())})"
    )
    emit("\n".join([head, *lines(data, per_file, args.data, scores)]), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
