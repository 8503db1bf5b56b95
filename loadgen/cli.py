"""``tiergate bench``: measure TTFT, TPOT, ITL and E2E latency of a gateway or a backend."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shlex
import sys
from pathlib import Path

from loadgen import spec
from loadgen.plot import PlotUnavailable, write_plot
from loadgen.progress import Progress
from loadgen.prompts import load_jsonl
from loadgen.report import document, markdown
from loadgen.runner import Plan, run
from loadgen.spec import Load, SpecError, Target

_EPILOG = """\
examples:
  tiergate bench --url http://127.0.0.1:8080 --model fast,precise --api-key-env TIERGATE_KEY
  tiergate bench --target name=direct,url=http://127.0.0.1:8001,model=tiergate-fast \\
                 --target name=gateway,url=http://127.0.0.1:8080,model=fast \\
                 --concurrency 1,4,16 --slo ttft_ms=500,tpot_ms=50 --out bench-out
API keys are read from an environment variable or a file, never from the command line.
"""


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    """What is measured: the server, the models, named targets and their API keys."""
    add = parser.add_argument
    add("--url", help="server to measure (the gateway or a backend), e.g. http://127.0.0.1:8080")
    add(
        "--model",
        help="model(s) to ask for, comma-separated: fast, precise, auto or a served "
        "model name; each is one target with --url",
    )
    add(
        "--target",
        action="append",
        default=[],
        metavar="SPEC",
        help="name=N,url=U[,model=M][,vs=OTHER][,api-key-env=VAR|api-key-file=PATH]; repeat "
        "to run the same load against several legs (e.g. direct and through the "
        "gateway); vs= names the target this one is compared with",
    )
    add(
        "--baseline",
        help="target the others are compared with (default: the first --target "
        "when there are several and none has vs=; 'none' to skip)",
    )
    add("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    add("--api-key-file", metavar="PATH", help="file holding the API key")


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    """The load: prompts, answer lengths, concurrency and arrivals."""
    add = parser.add_argument
    add(
        "--prompt-tokens",
        default="short=128,long=1024",
        help="synthetic prompt lengths in tokens (default short=128,long=1024)",
    )
    add(
        "--output-tokens",
        default="short=32,long=256",
        help="max_tokens per request (default short=32,long=256)",
    )
    add(
        "--prompts",
        type=Path,
        metavar="JSONL",
        help='your prompts, one {"prompt": ...} or {"messages": [...]} per line '
        "(replaces --prompt-tokens)",
    )
    add("--concurrency", default="1,4", help="concurrency levels (default 1,4; 0: no cap)")
    add("--request-rate", default="inf", help="requests/s, comma-separated (default inf)")
    add(
        "--arrival",
        choices=("poisson", "fixed"),
        default="poisson",
        help="inter-arrival times with a finite rate (default poisson)",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How each grid point runs: requests, duration, rounds, warm-up, timeout, endpoint."""
    add = parser.add_argument
    add("--num-requests", type=int, default=32, help="requests per target and grid point")
    add(
        "--max-duration",
        type=float,
        default=120.0,
        help="seconds after which a grid point starts no more requests (default 120)",
    )
    add(
        "--rounds",
        type=int,
        default=1,
        help="split each point's requests into rounds, the targets taking turns, so that a "
        "passing slowdown hits every target alike (default 1)",
    )
    add(
        "--warmup",
        type=int,
        default=2,
        help="unmeasured requests per target before measuring (at least 1; default 2)",
    )
    add("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    add("--endpoint", choices=("chat", "completions"), default="chat")
    add(
        "--no-ignore-eos",
        action="store_true",
        help="do not send ignore_eos (for servers that reject unknown fields)",
    )


def _add_result_options(parser: argparse.ArgumentParser) -> None:
    """The seed, goodput limits, the trimmed mean and where results go."""
    add = parser.add_argument
    add("--seed", type=int, default=0, help="seed of the synthetic prompts and arrivals")
    add("--slo", help="goodput limits, e.g. ttft_ms=500,tpot_ms=50,e2el_ms=10000")
    add(
        "--trim",
        type=float,
        default=0.05,
        help="fraction cut from each end for the trimmed mean (default 0.05)",
    )
    add("--out", type=Path, help="directory for bench.json, bench.md and bench.png")
    add("--no-plot", action="store_true", help="skip the PNG plot")


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="tiergate bench",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_target_options(parser)
    _add_load_options(parser)
    _add_run_options(parser)
    _add_result_options(parser)
    return parser


def _targets(args: argparse.Namespace) -> list[Target]:
    if args.url and args.target:
        raise SpecError("give --url or --target, not both")
    if args.target:
        targets = [
            spec.parse_target(t, args.model, args.api_key_env, args.api_key_file)
            for t in args.target
        ]
    elif args.url:
        if not args.model:
            raise SpecError("--url needs --model (fast, precise, auto or a served model name)")
        url = spec.normalise_url(args.url, "--url")
        key = spec.read_api_key(args.api_key_env, args.api_key_file, "--url")
        models = [m.strip() for m in args.model.split(",") if m.strip()]
        targets = [Target(name=m, url=url, model=m, api_key=key) for m in models]
    else:
        raise SpecError("give --url (with --model) or one or more --target")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise SpecError(f"target names repeat: {', '.join(names)}")
    for target in targets:
        if target.vs is not None and target.vs not in names:
            raise SpecError(f"--target {target.name}: vs={target.vs} is not a target name")
    return targets


def _baseline(args: argparse.Namespace, targets: list[Target]) -> str | None:
    if args.baseline == "none":
        return None
    if args.baseline:
        if args.baseline not in {t.name for t in targets}:
            raise SpecError(f"--baseline {args.baseline} is not a target name")
        return str(args.baseline)
    if any(t.vs for t in targets):
        return None  # the targets say what they are compared with
    return targets[0].name if len(args.target) > 1 else None


def _check_numbers(args: argparse.Namespace) -> None:
    if args.num_requests < 1:
        raise SpecError("--num-requests must be >= 1")
    if not 1 <= args.rounds <= args.num_requests:
        raise SpecError("--rounds must be between 1 and --num-requests")
    if args.warmup < 1:
        raise SpecError("--warmup must be >= 1: the first request checks the target")
    if not args.max_duration > 0 or not args.timeout > 0:
        raise SpecError("--max-duration and --timeout must be > 0")
    if not 0 <= args.trim < 0.5:
        raise SpecError("--trim must be in [0, 0.5)")


def _check_out(out: Path | None) -> None:
    """Create the output directory now, so that a bad path fails before the run, not after."""
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--out {out}: cannot create the directory: {exc.strerror}") from None


def build_plan(args: argparse.Namespace) -> Plan:
    """Validate everything before the first request is sent."""
    _check_numbers(args)
    chat = args.endpoint == "chat"
    file_prompts = load_jsonl(args.prompts, chat=chat) if args.prompts else None
    prompts = None if file_prompts else spec.parse_lengths(args.prompt_tokens, "--prompt-tokens")
    outputs = spec.parse_lengths(args.output_tokens, "--output-tokens")
    loads = [
        Load(c, r, args.arrival)
        for r in spec.parse_rates(args.request_rate)
        for c in spec.parse_concurrency(args.concurrency)
    ]
    if any(load.concurrency is None and load.rate == float("inf") for load in loads):
        raise SpecError("no concurrency cap and an infinite rate: give --request-rate too")
    per_round = args.num_requests // args.rounds
    top = max((load.concurrency or 0 for load in loads), default=0)
    if args.rounds > 1 and per_round < top:
        raise SpecError(
            f"--rounds {args.rounds} leaves rounds of {per_round} requests, fewer "
            f"than concurrency {top}: the load would never reach it (use "
            f"--num-requests >= {args.rounds * top})"
        )
    return Plan(
        targets=_targets(args),
        shapes=spec.grid(prompts, outputs),
        loads=loads,
        num_requests=args.num_requests,
        max_duration_s=args.max_duration,
        warmup=args.warmup,
        chat=chat,
        ignore_eos=not args.no_ignore_eos,
        timeout_s=args.timeout,
        seed=args.seed,
        slo=spec.parse_slo(args.slo) if args.slo else spec.Slo(),
        trim=args.trim,
        file_prompts=file_prompts,
        rounds=args.rounds,
        run_id=secrets.token_hex(4),
    )


def _write(out: Path, doc: dict[str, object], table: str, *, plot: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (out / "bench.md").write_text(table, encoding="utf-8")
    written = [out / "bench.json", out / "bench.md"]
    if plot:
        try:
            write_plot(doc, out / "bench.png")
            written.append(out / "bench.png")
        except PlotUnavailable as exc:
            print(f"tiergate bench: plot skipped: {exc}", file=sys.stderr)
    print("tiergate bench: wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point; 0 when the run finished, 2 on bad input or a target that cannot answer."""
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    try:
        plan = build_plan(args)
        _check_out(args.out)
        baseline = _baseline(args, plan.targets)
        total = len(plan.targets) * len(plan.shapes) * len(plan.loads) * plan.num_requests
        points = asyncio.run(run(plan, Progress(total)))
    except SpecError as exc:
        print(f"tiergate bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tiergate bench: interrupted", file=sys.stderr)
        return 130
    doc = document(plan, points, baseline, "tiergate bench " + shlex.join(raw))
    table = markdown(doc)
    sys.stdout.write(table)
    if args.out:
        _write(args.out, doc, table, plot=not args.no_plot)
    return 0
