"""``tiergate router`` subcommands: train, eval, score, calibrate.

``tiergate router ...`` delegates here; ``python -m router_models.cli ...`` works too. Training
and held-out evaluation (:mod:`router_models.training`) need scikit-learn, the ``train`` extra:
they are imported only when such a command runs, so the runtime install never loads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import router_models
from router_models.artifact import DEFAULT_ARTIFACT, ArtifactError
from router_models.records import RecordError, body_of, read_jsonl

TRAIN_EXTRA = "pip install 'tiergate[train]'"


def sklearn_missing() -> bool:
    """Is scikit-learn (the ``train`` extra) absent from this environment?"""
    return importlib.util.find_spec("sklearn") is None


def _train_description() -> str:
    """What ``tiergate router train --help`` says first: the extra, when it is missing."""
    if sklearn_missing():
        return f"Train an artifact. Needs scikit-learn, not installed here: {TRAIN_EXTRA}"
    return "Train an artifact (scikit-learn, the `train` extra)."


def _eval_arguments(ev: argparse.ArgumentParser) -> None:
    """``tiergate router eval``: the data, held-out runs, output and the artifact."""
    ev.add_argument("--data", type=Path, help="labelled JSONL scored with the artifact")
    ev.add_argument(
        "--held-out",
        action="store_true",
        help="leave-one-source-out and leave-one-family-out over the training data "
        "(needs scikit-learn: the `train` extra)",
    )
    ev.add_argument(
        "--train-data",
        type=Path,
        nargs="+",
        help="data for --held-out (default: corpus + router-dev2)",
    )
    ev.add_argument("--json", action="store_true", help="print JSON instead of text")
    ev.add_argument("--plot", type=Path, default=None, help="also write the curve as a PNG")
    ev.add_argument("--no-plot", action="store_true", help="accepted for old scripts (default)")
    ev.add_argument("--artifact", type=Path, default=None, help="artifact (default: shipped)")


def _score_arguments(score: argparse.ArgumentParser) -> None:
    """``tiergate router score``: the input, the artifact and how the threshold is set."""
    score.add_argument("file", type=Path, help="input JSONL ('-' for stdin)")
    score.add_argument("--artifact", type=Path, default=None)
    score.add_argument(
        "--target-share",
        type=float,
        default=None,
        help="share of traffic for the precise tier (sets the threshold)",
    )
    score.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="JSONL sample of your traffic to derive the threshold from",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiergate router", description="The tier router.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train", help="train an artifact from labelled JSONL", description=_train_description()
    )
    train.add_argument("--data", type=Path, nargs="+", help="labelled JSONL (default: corpus)")
    train.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT, help="artifact path")
    train.add_argument("--c", type=float, default=None, help="inverse regularisation strength")
    train.add_argument(
        "--external-weight",
        type=float,
        default=None,
        help="weight of non-corpus rows (default 0, see docs/router.md)",
    )
    _shadow_arguments(train)
    ev = sub.add_parser("eval", help="routing quality on labelled JSONL")
    _eval_arguments(ev)
    score = sub.add_parser("score", help="score JSONL lines with id and prompt/messages")
    _score_arguments(score)
    cal = sub.add_parser("calibrate", help="threshold for a target share from unlabelled traffic")
    # `tiergate router dial` talks to a running gateway and is dispatched before this parser
    # (gateway/__main__.py); it is listed here so that `tiergate router --help` names it.
    sub.add_parser(
        "dial", help="turn the share dial of a running gateway (tiergate router dial --help)"
    )
    cal.add_argument(
        "--sample",
        type=Path,
        required=True,
        help="JSONL of your own requests (prompt or messages; no labels needed)",
    )
    cal.add_argument(
        "--target-share",
        type=float,
        default=None,
        help="share of traffic for the precise tier (default: the artifact's)",
    )
    cal.add_argument("--artifact", type=Path, default=None)
    cal.add_argument("--out", type=Path, default=None, help="also write the YAML snippet here")
    return parser


def _shadow_arguments(train: argparse.ArgumentParser) -> None:
    train.add_argument(
        "--from-shadow",
        type=Path,
        default=None,
        metavar="STORE",
        help="also learn from a shadow store (router.shadow.store); needs --out",
    )
    train.add_argument(
        "--base",
        type=Path,
        default=None,
        help="with --from-shadow: the artifact compared against (default: shipped)",
    )
    train.add_argument(
        "--shadow-weight", type=float, default=None, help="weight of a shadow prompt (default 1.0)"
    )
    train.add_argument(
        "--held-out-share", type=float, default=None, help="shadow prompts held out (default 0.2)"
    )
    train.add_argument(
        "--shadow-label",
        choices=("agreement", "judge"),
        default="agreement",
        help="what labels a shadow prompt: the tiers' agreement (default) or the precise "
        "tier's rubric score of the fast answer (router.shadow.judge_ratio; complex at 3 of 5 "
        "or lower; prompts never judged are left out)",
    )
    train.add_argument(
        "--max-tenant-share",
        type=float,
        default=None,
        help="with --from-shadow: the most of the shadow weight one tenant's prompts may carry "
        "(default 0.5: none outweighs the others together; at least 1/tenants; 1: off)",
    )
    train.add_argument("--report", type=Path, default=None, help="also write the report as JSON")


def _train_from_shadow(args: argparse.Namespace, out: TextIO) -> int:
    from router_models.training.retrain import retrain  # noqa: PLC0415 - sklearn only when training
    from router_models.training.shadow_eval import render  # noqa: PLC0415
    from router_models.training.shadow_train import ShadowSettings  # noqa: PLC0415
    from router_models.training.train import DEFAULT_DATA  # noqa: PLC0415

    if args.out.resolve() == DEFAULT_ARTIFACT.resolve():
        raise ValueError("--from-shadow writes a new artifact: give --out (not the shipped one)")
    settings = ShadowSettings()
    if args.shadow_weight is not None:
        settings = dataclasses.replace(settings, shadow_weight=args.shadow_weight)
    if args.held_out_share is not None:
        settings = dataclasses.replace(settings, held_out_share=args.held_out_share)
    if args.max_tenant_share is not None:
        settings = dataclasses.replace(settings, max_tenant_share=args.max_tenant_share)
    settings = dataclasses.replace(settings, label=args.shadow_label)
    base = args.base or DEFAULT_ARTIFACT
    report = retrain(args.from_shadow, args.out, base, list(args.data or DEFAULT_DATA), settings)
    out.write(
        f"shadow store: {report['records']} records ({report['stale_records']} stale), "
        f"{report['prompts']} prompts, {report['train_prompts']} trained on\n"
        f"base {report['base_artifact']}\n"
    )
    balance = report["tenant_balance"]
    if balance["tenants"]:
        out.write(
            f"tenants: {balance['tenants']} ({balance['unknown_tenant_rows']} prompts without "
            f"one); the largest has {balance['largest_row_share']:.1%} of the prompts and "
            f"{balance['largest_weight_share']:.1%} of the weight (--max-tenant-share "
            f"{balance['max_tenant_share']})\n"
        )
    if "comparison" in report:
        out.write(render(report["comparison"]) + "\n")
    else:
        out.write("held-out prompts lack one of the labels: no comparison\n")
    out.write(f"wrote {args.out} ({report['artifact']['id']})\n")
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def _train(args: argparse.Namespace, out: TextIO) -> int:
    if args.from_shadow is not None:
        return _train_from_shadow(args, out)
    from router_models.artifact import save  # noqa: PLC0415 - only when training
    from router_models.training.train import DEFAULT_DATA, TrainSettings, train  # noqa: PLC0415

    paths = list(args.data or DEFAULT_DATA)
    settings = TrainSettings()
    if args.c is not None:
        settings = dataclasses.replace(settings, c=args.c)
    if args.external_weight is not None:
        settings = dataclasses.replace(settings, external_weight=args.external_weight)
    model = train(paths, settings)
    save(model, args.out)
    meta = model.metadata
    out.write(
        f"trained on {meta['n_examples']} examples ({meta['n_complex']} complex), "
        f"{meta['data_digest']}\nheld-out-group ROC AUC {meta['held_out_roc_auc']:.4f}, default "
        f"threshold {meta['default_threshold']:.4f} (share {meta['default_target_share']})\n"
        f"wrote {args.out}\n"
    )
    return 0


def _held_out(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from router_models.training import honest  # noqa: PLC0415 - sklearn only for held-out runs
    from router_models.training.train import HELD_OUT_DATA, TrainSettings, prepare  # noqa: PLC0415

    settings = TrainSettings()
    records = [r for p in (args.train_data or HELD_OUT_DATA) for r in read_jsonl(p)]
    report = honest.held_out_report(prepare(records, settings), settings)
    return report.as_dict(), honest.render_held_out(report)


def _eval(args: argparse.Namespace, out: TextIO) -> int:
    from router_models.training import evaluate  # noqa: PLC0415 - only eval needs it

    if args.data is None and not args.held_out:
        raise ValueError("give --data FILE, --held-out, or both")
    result: dict[str, Any] = {}
    texts: list[str] = []
    if args.data is not None:
        report = evaluate.evaluate(router_models.load(args.artifact), read_jsonl(args.data))
        result["data"] = report.as_dict()
        texts.append(
            f"== {args.data} (scored with the artifact) ==\n" + evaluate.render_text(report)
        )
        if args.plot is not None:
            evaluate.plot(report, args.plot)
            texts.append(f"plot written to {args.plot}")
    elif args.plot is not None:
        raise ValueError("--plot needs --data")
    if args.held_out:
        result["held_out"], text = _held_out(args)
        texts.append("== held-out evaluation (every fold trained without its group) ==\n" + text)
    out.write(json.dumps(result, indent=2) + "\n" if args.json else "\n\n".join(texts) + "\n")
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
        return router.threshold_for_share(
            share if share is not None else float(router.metadata["default_target_share"]), sample
        )
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


MIN_SAMPLE = 20
SMALL_SAMPLE = 1000


def _calibrate(args: argparse.Namespace, out: TextIO) -> int:
    router = router_models.load(args.artifact)
    share = args.target_share
    if share is None:
        share = float(router.metadata["default_target_share"])
    scores = [router.score(body_of(r)) for r in read_jsonl(args.sample)]
    if len(scores) < MIN_SAMPLE:
        raise ValueError(f"need at least {MIN_SAMPLE} requests in the sample, got {len(scores)}")
    threshold = router.threshold_for_share(share, scores)
    realised = sum(1 for s in scores if s >= threshold) / len(scores)
    snippet = (
        "router:\n"
        f"  target_precise_share: {share}\n"
        f"  threshold: {threshold:.6f}  # {len(scores)} requests of {args.sample.name}\n"
        "  online_control: true  # keeps the share as the traffic drifts\n"
    )
    out.write(
        f"scored {len(scores)} requests; threshold {threshold:.6f} sends "
        f"{realised:.1%} of them to the precise tier (target {share:.1%})\n\n{snippet}"
    )
    if len(scores) < SMALL_SAMPLE:
        error = (share * (1 - share) / len(scores)) ** 0.5
        sys.stderr.write(
            f"warning: {len(scores)} requests is a small sample; the share's "
            f"sampling error is about {error:.1%}\n"
        )
    if args.out is not None:
        args.out.write_text(snippet, encoding="utf-8")
        out.write(f"wrote {args.out}\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run a router subcommand; returns the process exit status."""
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    if args.command == "dial":
        sys.stderr.write("tiergate router dial: run it as `tiergate router dial SHARE ...`\n")
        return 2
    handlers = {"train": _train, "eval": _eval, "score": _score, "calibrate": _calibrate}
    trains = args.command == "train" or (args.command == "eval" and args.held_out)
    if trains and sklearn_missing():
        sys.stderr.write(
            f"tiergate router {args.command}: needs scikit-learn, which the gateway itself does "
            f"not: {TRAIN_EXTRA}\n"
        )
        return 2
    try:
        return handlers[args.command](args, stream)
    except (ArtifactError, RecordError, OSError, ValueError) as exc:
        sys.stderr.write(f"tiergate router {args.command}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
