"""Leave-one-source-out scores restricted to router-dev2, beside an older artifact's scores.

    .venv/bin/python bench/classify/loso_by_set.py --baseline OLD.npz [--out FILE]

Computes the shipped settings' LOSO scores (``router_models.honest.loso_scores``, the same
folds as ``tiergate router eval --held-out``) and reports ROC AUC / simple sent at 95 % caught
on subsets: every trainable row, by language, and router-dev2's rows (all, trainable,
evaluation-only, Chinese + Japanese).  The baseline artifact scores the router-dev2 rows as
shipped.  That is a held-out score only for an artifact that never trained on router-dev2 (v7
weighted those rows 0).  Writes Markdown to ``bench/classify/loso-by-set.md`` by default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import router_models  # noqa: E402 - after the path setup above
from router_models import honest  # noqa: E402
from router_models.records import body_of, read_jsonl  # noqa: E402
from router_models.train import DEV2, HELD_OUT_DATA, TrainSettings, prepare  # noqa: E402

Row = Mapping[str, Any]
SUBSETS: dict[str, Callable[[Row, bool], bool]] = {
    "every trainable row": lambda r, dev2: r.get("use") != "eval",
    "trainable, not Chinese/Japanese": lambda r, dev2: (
        r.get("use") != "eval" and honest.language_of(r) not in honest.CJK
    ),
    "trainable, Chinese + Japanese": lambda r, dev2: (
        r.get("use") != "eval" and honest.language_of(r) in honest.CJK
    ),
    "router-dev2, all rows": lambda r, dev2: dev2,
    "router-dev2, trainable rows": lambda r, dev2: dev2 and r.get("use") != "eval",
    "router-dev2, evaluation-only rows": lambda r, dev2: dev2 and r.get("use") == "eval",
    "router-dev2, Chinese + Japanese": lambda r, dev2: dev2 and honest.language_of(r) in honest.CJK,
}


def _figures(y: np.ndarray, p: np.ndarray) -> str:
    if y.size == 0 or y.sum() in (0, y.size):
        return "- | -"
    rel = honest.reliability(y.astype(np.int_), p)
    return f"{rel.roc_auc:.3f} | {rel.simple_sent_at_95:.1%}"


def main() -> int:
    """Compute and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "loso-by-set.md")
    args = parser.parse_args()
    settings = TrainSettings()
    records = [r for p in HELD_OUT_DATA for r in read_jsonl(p)]
    dev2_ids = {r["id"] for r in read_jsonl(DEV2)}
    data = prepare(records, settings)
    scores = honest.loso_scores(data, settings)
    rows = np.flatnonzero(~np.isnan(scores))
    base = router_models.load(args.baseline)
    lines = [
        "# LOSO by subset (shipped settings) beside a baseline artifact",
        "",
        f"`.venv/bin/python bench/classify/loso_by_set.py --baseline {args.baseline.name}`",
        "",
        "| subset | n | LOSO AUC | LOSO simple sent @95 % | baseline AUC | baseline sent @95 % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, keep in SUBSETS.items():
        idx = [int(i) for i in rows if keep(data.records[i], data.records[i]["id"] in dev2_ids)]
        y, p = data.y[idx], scores[idx]
        on_dev2 = all(data.records[i]["id"] in dev2_ids for i in idx)
        b = (
            _figures(y, np.array([base.score(body_of(data.records[i])) for i in idx]))
            if idx and on_dev2
            else "- | -"
        )
        lines.append(f"| {name} | {len(idx)} | {_figures(y, p)} | {b} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
