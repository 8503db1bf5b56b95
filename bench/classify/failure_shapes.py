"""How far each failure shape keeps the router from issue 13's target (a counterfactual).

Computes the shipped settings' leave-one-source-out scores (the same fits and calibration as
``tiergate router eval --held-out``), then, for each group of sources below, scores those
sources' rows perfectly (0 for simple, 1 for complex) and recomputes the pooled ROC AUC and
"simple sent precise at 95 % of complex caught" with every other score unchanged.

Usage: ``.venv/bin/python bench/classify/failure_shapes.py [--out FILE]`` (about two minutes
on 2 cores); prints a Markdown table and writes it to ``bench/classify/failure-shapes.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router_models.records import read_jsonl  # noqa: E402
from router_models.training.honest import loso_scores, reliability, with_sources_perfect  # noqa: E402
from router_models.training.train import HELD_OUT_DATA, TrainSettings, prepare  # noqa: E402

# The failure shapes named in docs/router.md, by the router-dev2 sources that carry them.
SHAPES: tuple[tuple[str, frozenset[str]], ...] = (
    ("passages with a look-up question", frozenset({"xquad", "fairytaleqa"})),
    (
        "short factual questions",
        frozenset({"truthfulqa", "truthfulqa_multi", "jtruthfulqa"}),
    ),
    ("deduction puzzles", frozenset({"bbh", "logiqa"})),
    ("short code questions", frozenset({"conala", "mconala"})),
    (
        "passages and deduction puzzles together",
        frozenset({"xquad", "fairytaleqa", "bbh", "logiqa"}),
    ),
)


def report(paths: list[Path]) -> str:
    """The Markdown table for the held-out data in ``paths``."""
    settings = TrainSettings()
    data = prepare([r for p in paths for r in read_jsonl(p)], settings)
    scores = loso_scores(data, settings)
    rows = np.flatnonzero(~np.isnan(scores))
    groups = [data.groups[i] for i in rows]
    y = data.y[rows].astype(np.int_)
    held = scores[rows]
    base = reliability(y, held)
    lines = [
        "| scored perfectly | sources | ROC AUC | simple sent @95 % |",
        "|---|---|---:|---:|",
        f"| nothing (shipped settings) | - | {base.roc_auc:.3f} "
        f"| {100 * base.simple_sent_at_95:.1f} % |",
    ]
    for name, sources in SHAPES:
        present = sources & set(groups)
        if not present:
            continue
        fig = with_sources_perfect(groups, y, held, present)
        lines.append(
            f"| {name} | {', '.join(sorted(present))} | {fig.roc_auc:.3f} "
            f"| {100 * fig.simple_sent_at_95:.1f} % |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("failure-shapes.md"))
    args = parser.parse_args(argv)
    text = (
        "# Failure shapes against issue 13's target (leave-one-source-out, counterfactual)\n\n"
        "Command: `.venv/bin/python bench/classify/failure_shapes.py`. Each row scores the\n"
        "named sources perfectly and keeps every other leave-one-source-out score.\n\n"
        + report(list(HELD_OUT_DATA))
    )
    args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
