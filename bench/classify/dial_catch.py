"""What the share dial catches on traffic the router never trained on (issue 35's dial target).

Issue 35 measures the shipped artifact "at the default dial on traffic with 25 % complex
prompts: complex caught". This draws that traffic from labelled files the artifacts were not
trained on (by default router-dev2.jsonl and the committed external-train.jsonl and
followbench.jsonl; the shipped artifact trains on the corpus only), ``--draws`` times with a
fixed seed: every complex row the draw can hold against three times as many simple rows, sampled
without replacement. The dial's threshold is the score above which ``--share`` (0.30, the
default ``router.target_precise_share``) of that traffic lies, the point the online controller
converges to; the report gives the share of complex prompts above it, overall and for the
Chinese + Japanese rows, per artifact, as mean and range over the draws. Run:
``.venv/bin/python bench/classify/dial_catch.py [--artifacts A.npz,B.npz] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import router_models  # noqa: E402
from bench.harness.markdown import report_head  # noqa: E402
from router_models.records import body_of, label_of, read_jsonl  # noqa: E402
from router_models.training import EXTERNAL_TRAIN  # noqa: E402
from router_models.training.honest import language_of  # noqa: E402
from router_models.training.train import DEV2  # noqa: E402

FOLLOWBENCH = EXTERNAL_TRAIN.with_name("followbench.jsonl")
TITLE = "Complex prompts caught at the share dial, on traffic never trained on"


def cjk(record: dict[str, Any]) -> bool:
    """A Chinese or Japanese row, by the language its ``category`` names (as the held-out
    reports read it: ``language_of``)."""
    return language_of(record) in ("zh", "ja")


def caught(scores: list[float], labels: list[int], share: float) -> float:
    """Share of complex rows at or above the score the top ``share`` of all rows reach."""
    ordered = sorted(scores, reverse=True)
    threshold = ordered[max(0, round(share * len(ordered)) - 1)]
    complex_scores = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    return sum(s >= threshold for s in complex_scores) / len(complex_scores)


def draw(rows: list[tuple[float, int]], rng: random.Random, complex_share: float) -> list[int]:
    """Indices of a draw with ``complex_share`` complex rows, as large as the rows allow."""
    hard = [i for i, (_, y) in enumerate(rows) if y == 1]
    easy = [i for i, (_, y) in enumerate(rows) if y == 0]
    n_hard = min(len(hard), int(len(easy) * complex_share / (1 - complex_share)))
    n_easy = round(n_hard * (1 - complex_share) / complex_share)
    return rng.sample(hard, n_hard) + rng.sample(easy, n_easy)


def measure(
    artifact: Path, records: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """Mean and range of complex caught over the draws, overall and for zh + ja rows."""
    router = router_models.load(artifact)
    scored = [(router.score(body_of(r)), label_of(r)) for r in records]
    out: dict[str, Any] = {}
    for name, keep in (("all", lambda r: True), ("zh+ja", cjk)):
        rows = [s for s, r in zip(scored, records, strict=True) if keep(r)]
        rng = random.Random(args.seed)
        results = []
        for _ in range(args.draws):
            picked = draw(rows, rng, args.complex_share)
            results.append(caught([rows[i][0] for i in picked], [rows[i][1] for i in picked],
                                  args.share))  # fmt: skip
        out[name] = (statistics.fmean(results), min(results), max(results), len(picked))
    return out


def main(argv: list[str] | None = None) -> int:
    """Score, draw, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", default=str(router_models.DEFAULT_ARTIFACT))
    parser.add_argument("--data", nargs="+", type=Path, default=[DEV2, EXTERNAL_TRAIN, FOLLOWBENCH])
    parser.add_argument("--share", type=float, default=0.30)
    parser.add_argument("--complex-share", type=float, default=0.25)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    files = [p for p in args.data if p.is_file()]
    records = [r for p in files for r in read_jsonl(p)]
    command = ".venv/bin/python bench/classify/dial_catch.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    lines = [
        *report_head(
            "Complex prompts caught at the share dial, on traffic never trained on", command
        ),
        f"Rows: {len(records):,} from {', '.join(p.name for p in files)}; {args.draws} draws of "
        f"{args.complex_share:.0%} complex traffic (seed {args.seed}); threshold at the top "
        f"{args.share:.0%} of each draw.",
        "",
        "| artifact | complex caught, all (mean, min-max) | draw size "
        "| Chinese + Japanese | draw size |",
        "|---|---:|---:|---:|---:|",
    ]
    for artifact in args.artifacts.split(","):
        got = measure(Path(artifact), records, args)
        cells = [f"{m:.1%} ({lo:.1%}-{hi:.1%}) | {n:,}" for m, lo, hi, n in got.values()]
        lines.append(f"| {artifact} | {' | '.join(cells)} |")
    text = "\n".join([*lines, ""])
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
