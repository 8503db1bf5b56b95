"""How much of the leave-one-source-out gap is the sources, and how much the model?

Leave-one-source-out (``loso_sources.py``) scores each external source with a fit that never
saw it. This script scores the same trainable rows with fits that *did* see their source:
the external rows are split at random into ``--folds`` folds (stratified by source and
label), and each fold is scored by a fit on the corpus plus every other fold's external rows
(at ``--external-weight``). Nothing here is held out by source, so the figures are an upper
bound for this feature space and learner on these labels, not an estimate of quality on
unseen traffic; they say whether a target is out of reach of the model itself, whatever data
of these sources it is given.

Only rows that may be trained on are used (router-dev2's ``eval`` rows and router-dev.jsonl
never are). Scores are the fits' raw margins (ranking figures only; no calibration).

Usage (5 fits; about 10 minutes on 2 shared cores; run it under ``nice -n 19``)::

    .venv/bin/python bench/classify/ceiling.py --data \\
        router_models/corpus/tiergate-corpus.jsonl router_models/corpus/hard-cases.jsonl \\
        router_models/training/data/external-train.jsonl \\
        router_models/training/data/followbench.jsonl ../shared/datasets/router-dev2.jsonl \\
        --out bench/classify/ceiling-v8.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.classify.loso_sources import CJK, _pooled, emit  # noqa: E402
from router_models.records import read_jsonl  # noqa: E402
from router_models.training.honest import (  # noqa: E402
    group_figures,
    group_lines,
    language_of,
    reliability,
)
from router_models.training.train import TrainSettings, prepare  # noqa: E402


def fold_of(groups: Sequence[str], y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """A fold number per row: each (source, label) cell dealt round-robin after a shuffle."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(groups), dtype=np.int_)
    cells: dict[tuple[str, int], list[int]] = {}
    for i, (group, label) in enumerate(zip(groups, y.tolist(), strict=True)):
        cells.setdefault((group, int(label)), []).append(i)
    for members in cells.values():
        order = rng.permutation(len(members))
        for rank, k in enumerate(order):
            out[members[k]] = rank % folds
    return out


def report(paths: Sequence[Path], external_weight: float, folds: int, seed: int) -> str:
    """Random-split cross-validation over the trainable external rows of ``paths``."""
    settings = dataclasses.replace(TrainSettings(), external_weight=external_weight)
    data = prepare([r for p in paths for r in read_jsonl(p)], settings)
    external = np.array([not g.startswith("corpus/") for g in data.groups], dtype=np.bool_)
    scored = external & data.train_mask
    fold = fold_of(data.groups, data.y, folds, seed)
    margins = np.full(data.y.size, np.nan)
    fit = settings.fitter()
    for k in range(folds):
        inside = scored & (fold == k)
        use = data.train_mask & ~inside
        model = fit(data.x_fit[use], data.y[use], data.weight[use])
        rows = np.flatnonzero(inside)
        margins[rows] = model.margins(data.x[rows])
    rows = np.flatnonzero(scored)
    y = data.y[rows].astype(np.int_)
    held = 1.0 / (1.0 + np.exp(-margins[rows]))  # ranks as the margins do
    groups = [data.groups[i] for i in rows]
    langs = [language_of(data.records[i]) for i in rows]
    cjk = np.array([lang in CJK for lang in langs], dtype=np.bool_)
    pooled = reliability(y, held)
    lines = [
        f"random {folds}-fold split (seed {seed}) of the trainable external rows, each fold "
        f"scored by a fit on the corpus and the other folds at external weight "
        f"{external_weight}; raw margins (ECE not meaningful); data: "
        + ", ".join(str(p) for p in paths),
        _pooled("every trainable external row", pooled),
        _pooled("non-CJK", reliability(y[~cjk], held[~cjk])),
    ]
    if cjk.any() and len(set(y[cjk].tolist())) == 2:
        lines.append(_pooled("Chinese + Japanese", reliability(y[cjk], held[cjk])))
    lines += [
        "",
        *group_lines(
            "by source (sent@op: share sent at the pooled 95 % point)",
            group_figures(groups, y, held, pooled.op_threshold),
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report (and write it with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, nargs="+", required=True)
    parser.add_argument("--external-weight", type=float, default=1.0)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    text = report(args.data, args.external_weight, args.folds, args.seed)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
