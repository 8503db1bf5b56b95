"""Leave-one-source-out over every external source of a training mix, at a chosen weight.

``tiergate router eval --held-out`` uses the shipped settings (external rows at weight 0, so
the folds learn from the corpus alone) and adds leave-one-family-out over the corpus.  This
script asks the question a new training source raises: trained at ``--external-weight`` on the
corpus plus every *other* source's trainable rows, how well is each held-out source ranked?
The fits, the per-fold Platt calibration and the figures are ``honest.loso_scores`` and
``honest.reliability``: the same code as the held-out report.

Usage (25-30 minutes on 2 shared cores at weight 1; run it under ``nice -n 19``)::

    .venv/bin/python bench/classify/loso_sources.py --external-weight 1 \\
        --data router_models/corpus/tiergate-corpus.jsonl router_models/corpus/hard-cases.jsonl \\
        router_models/training/data/external-train.jsonl ../shared/datasets/router-dev2.jsonl

``--balance-source-labels`` gives both labels of each external source equal total weight
(``TrainSettings.balance_source_labels``).  ``--drop-one-label-sources`` leaves every external
source whose trainable rows carry one label out of the fits (weight 0); such a source is still
held out and scored in its own fold (``TrainSettings.drop_one_label_sources``).

Prints the pooled figures (every held-out row; the rows of trainable sources only; the
Chinese + Japanese slice; each data file's rows) and one line per source and per language.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router_models.records import read_jsonl  # noqa: E402
from router_models.training.crossval import trainable  # noqa: E402
from router_models.training.honest import (  # noqa: E402
    Reliability,
    group_figures,
    group_lines,
    language_of,
    loso_scores,
    reliability,
)
from router_models.training.train import (  # noqa: E402
    Prepared,
    TrainSettings,
    one_label_sources,
    prepare,
)

CJK = frozenset(("zh", "ja"))


def _pooled(title: str, r: Reliability) -> str:
    return (
        f"{title}: n={r.n} ({r.n_complex} complex), ROC AUC {r.roc_auc:.4f}, simple sent "
        f"precise at 95 % caught {r.simple_sent_at_95:.1%}, ECE {r.ece:.4f}"
    )


def report(
    paths: Sequence[Path], external_weight: float, *, balance: bool = False, drop: bool = False
) -> str:
    """The LOSO report of the training mix in ``paths`` at ``external_weight`` (with each
    external source's labels given equal weight when ``balance``; with the one-label external
    sources left out of the fits when ``drop``)."""
    settings = dataclasses.replace(
        TrainSettings(),
        external_weight=external_weight,
        balance_source_labels=balance,
        drop_one_label_sources=drop,
    )
    per_file = [read_jsonl(p) for p in paths]
    data = prepare([r for records in per_file for r in records], settings)
    notes = "; labels balanced within each external source" if balance else ""
    if drop:
        names = one_label_sources(data.groups, data.y, data.train_mask)
        notes += f"; one-label sources left out of training: {', '.join(names) or 'none'}"
    head = f"external weight {external_weight}{notes}; data: {', '.join(str(p) for p in paths)}"
    return "\n".join([head, *lines(data, per_file, paths, loso_scores(data, settings))])


def lines(
    data: Prepared,
    per_file: Sequence[Sequence[object]],
    paths: Sequence[Path],
    scores: npt.NDArray[np.float64],
) -> list[str]:
    """The figures of held-out ``scores`` (NaN for rows not held out) of the rows of ``data``,
    read from ``paths`` (``per_file``: each file's records): pooled, per file, source and
    language."""
    # prepare keeps the rows in order: each row's file is where it falls in the concatenation
    origin = np.repeat(np.arange(len(paths)), [len(records) for records in per_file])
    rows = np.flatnonzero(~np.isnan(scores))
    y = data.y[rows].astype(np.int_)
    held = scores[rows]
    groups = [data.groups[i] for i in rows]
    langs = [language_of(data.records[i]) for i in rows]
    trainable_sources = {data.groups[i] for i in rows if trainable(data.records[i])}
    in_train = np.array([g in trainable_sources for g in groups], dtype=np.bool_)
    cjk = np.array([lang in CJK for lang in langs], dtype=np.bool_)
    pooled = reliability(y, held)
    out = [
        _pooled("every held-out row", pooled),
        _pooled("trainable sources only", reliability(y[in_train], held[in_train])),
        _pooled("non-CJK", reliability(y[~cjk], held[~cjk])),
    ]
    if cjk.any() and len(set(y[cjk].tolist())) == 2:
        out.append(_pooled("Chinese + Japanese", reliability(y[cjk], held[cjk])))
    for k, path in enumerate(paths):  # each file alone: router-dev2 as its own report pools
        mine = origin[rows] == k
        if len(set(y[mine].tolist())) == 2:
            out.append(_pooled(f"rows of {path.name}", reliability(y[mine], held[mine])))
    out += [
        "",
        *group_lines(
            "by source (sent@op: share sent at the pooled 95 % point)",
            group_figures(groups, y, held, pooled.op_threshold),
        ),
    ]
    out += ["", *group_lines("by language", group_figures(langs, y, held, pooled.op_threshold))]
    return out


def emit(text: str, out: Path | None) -> None:
    """Print a report, and write it to ``out`` when given."""
    sys.stdout.write(text + "\n")
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report (and write it with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, nargs="+", required=True)
    parser.add_argument("--external-weight", type=float, default=1.0)
    parser.add_argument(
        "--balance-source-labels",
        action="store_true",
        help="weight each external source's two labels equally (TrainSettings."
        "balance_source_labels; docs/router.md, Round 13)",
    )
    parser.add_argument(
        "--drop-one-label-sources",
        action="store_true",
        help="leave external sources whose trainable rows carry one label out of the fits "
        "(TrainSettings.drop_one_label_sources; docs/router.md, Round 14)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    text = report(
        args.data,
        args.external_weight,
        balance=args.balance_source_labels,
        drop=args.drop_one_label_sources,
    )
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
