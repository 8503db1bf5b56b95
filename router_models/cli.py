"""``tiergate router`` subcommands: train, eval, score.

``tiergate router ...`` delegates here; ``python -m router_models.cli ...`` works too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import router_models
from router_models.artifact import DEFAULT_ARTIFACT, ArtifactError
from router_models.records import RecordError, body_of, read_jsonl

DEFAULT_PLOT = Path("router-eval.png")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiergate router", description="The tier router.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an artifact from labelled JSONL")
    train.add_argument("--data", type=Path, nargs="+", help="labelled JSONL (default: corpus)")
    train.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT, help="artifact path")
    train.add_argument("--c", type=float, default=None, help="inverse regularisation strength")
    ev = sub.add_parser("eval", help="routing quality on labelled JSONL")
    ev.add_argument("--data", type=Path, required=True, help="labelled JSONL")
    ev.add_argument("--json", action="store_true", help="print JSON instead of text")
    ev.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help="PNG of the curve")
    ev.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    ev.add_argument("--artifact", type=Path, default=None, help="artifact (default: shipped)")
    score = sub.add_parser("score", help="score JSONL lines with id and prompt/messages")
    score.add_argument("file", type=Path, help="input JSONL ('-' for stdin)")
    score.add_argument("--artifact", type=Path, default=None)
    score.add_argument("--target-share", type=float, default=None,
                       help="share of traffic for the precise tier (sets the threshold)")
    score.add_argument("--reference", type=Path, default=None,
                       help="JSONL sample of your traffic to derive the threshold from")
    return parser


def _train(args: argparse.Namespace, out: TextIO) -> int:
    from router_models.artifact import save  # noqa: PLC0415 - sklearn only when training
    from router_models.train import DEFAULT_DATA, TrainSettings, train  # noqa: PLC0415

    paths = list(args.data or DEFAULT_DATA)
    settings = TrainSettings() if args.c is None else TrainSettings(c=args.c)
    model = train(paths, settings)
    save(model, args.out)
    meta = model.metadata
    out.write(
        f"trained on {meta['n_examples']} examples ({meta['n_complex']} complex), "
        f"{meta['data_digest']}\nout-of-fold ROC AUC {meta['cv_roc_auc']:.4f}, default "
        f"threshold {meta['default_threshold']:.4f} (share {meta['default_target_share']})\n"
        f"wrote {args.out}\n"
    )
    return 0


def _eval(args: argparse.Namespace, out: TextIO) -> int:
    from router_models import evaluate  # noqa: PLC0415 - only eval needs it

    records = read_jsonl(args.data)
    report = evaluate.evaluate(router_models.load(args.artifact), records)
    if args.json:
        out.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        out.write(evaluate.render_text(report) + "\n")
    if not args.no_plot:
        evaluate.plot(report, args.plot)
        if not args.json:
            out.write(f"\nplot written to {args.plot}\n")
    return 0


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if str(path) != "-":
        yield from read_jsonl(path)
        return
    for number, line in enumerate(sys.stdin, 1):
        if line.strip():
            record = json.loads(line)
            if not isinstance(record, dict):
                raise RecordError(f"stdin:{number}: expected a JSON object")
            yield record


def _threshold(router: router_models.Router, args: argparse.Namespace) -> float:
    share = args.target_share
    if args.reference is not None:
        sample = [router.score(body_of(r)) for r in read_jsonl(args.reference)]
        return router.threshold_for_share(share if share is not None else
                                          float(router.metadata["default_target_share"]), sample)
    if share is not None:
        return router.threshold_for_share(share)
    return router.default_threshold


def _score(args: argparse.Namespace, out: TextIO) -> int:
    router = router_models.load(args.artifact)
    threshold = _threshold(router, args)
    for record in _lines(args.file):
        score = router.score(body_of(record))
        tier = router_models.PRECISE if score >= threshold else router_models.FAST
        out.write(json.dumps({"id": record.get("id"), "score": score, "tier": tier}) + "\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run a router subcommand; returns the process exit status."""
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    handlers = {"train": _train, "eval": _eval, "score": _score}
    try:
        return handlers[args.command](args, stream)
    except (ArtifactError, RecordError, OSError, ValueError) as exc:
        sys.stderr.write(f"tiergate router {args.command}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
