"""Overhead benchmark: upstream direct vs TierGate vs its peers, same upstream, same wrk, one run.

Usage: ``.venv/bin/python bench/overhead/run.py [--quick] [--variant plain|full|full-trace100]
[--legs direct,nginx,vllm-router,python-floor,tiergate,portkey,litellm] [--skip-litellm]
[--out FILE]``.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bench.harness.legs import (
    REPO_ROOT,
    Leg,
    LegUnavailableError,
    Placement,
    start_fixed_upstream,
    start_simulator,
)
from bench.harness.points import Bench, Plan, Series, measure
from bench.harness.wrk import WrkRunner, ensure_wrk
from bench.overhead.legs import LITELLM_VERSION, start_litellm, start_tiergate
from bench.overhead.memory import CYCLE, MEMORY_CONCURRENCY, measure_memory
from bench.overhead.peers import (
    start_nginx,
    start_portkey,
    start_python_floor,
    start_vllm_router,
)
from bench.overhead.report import Report, render
from bench.overhead.variants import VARIANTS, Variant

LEGS = ("direct", "nginx", "vllm-router", "python-floor", "tiergate", "portkey", "litellm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description="TierGate overhead benchmark (see bench/README.md)")
    p.add_argument("--quick", action="store_true", help="3 s points, 5k/50k memory requests")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="plain")
    p.add_argument("--legs", default=",".join(LEGS), help="comma list of " + ",".join(LEGS))
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument("--upstream", choices=("auto", "fixed", "simulator"), default="auto")
    p.add_argument("--duration", type=float, help="seconds per point (default 10, quick 3)")
    p.add_argument(
        "--noisy-retries",
        type=int,
        default=0,
        help="rerun a proxy point up to N times while its server waits > 5%% for a CPU or other "
        "processes use > 5%% of the CPUs (the least disturbed attempt is kept)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each point, wait up to this many seconds for other processes to go quiet",
    )
    p.add_argument(
        "--memory-requests",
        type=memory_steps,
        help="cumulative request counts at which the memory phase reads RSS "
        "(default 20000,200000; quick 5000,50000)",
    )
    p.add_argument(
        "--memory-only",
        action="store_true",
        help="only the memory phase: no throughput points, no peers, the fixed upstream "
        "unmeasured (default out bench/results/overhead-VARIANT-memory.md)",
    )
    p.add_argument("--keep-workdir", action="store_true", help="keep configs and server logs")
    p.add_argument("--no-boost", action="store_true", help="do not run servers at nice -20")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes with taskset")
    p.add_argument(
        "--out", type=Path, help="Markdown file (default bench/results/overhead-VARIANT.md)"
    )
    return p.parse_args(argv)


def memory_steps(text: str) -> tuple[int, ...]:
    """Parse ``--memory-requests``: increasing cumulative request counts, at least two."""
    try:
        steps = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from exc
    if len(steps) < 2 or any(b <= a for a, b in itertools.pairwise(steps)):
        raise argparse.ArgumentTypeError("give at least two increasing counts, e.g. 20000,200000")
    if steps[0] <= 0:
        raise argparse.ArgumentTypeError("request counts must be positive")
    return steps


def make_plan(args: argparse.Namespace) -> Plan:
    """Durations and memory steps for a full or quick run."""
    retries, quiet = args.noisy_retries, args.quiet_wait
    if args.quick:
        steps = args.memory_requests or (5_000, 50_000)
        return Plan(args.duration or 3.0, 1.0, steps, retries, quiet)
    steps = args.memory_requests or (20_000, 200_000)
    return Plan(args.duration or 10.0, 2.0, steps, retries, quiet)


def _try(report: Report, name: str, action: Callable[[], Leg]) -> Leg | None:
    try:
        return action()
    except LegUnavailableError as exc:
        report.unavailable[name] = str(exc)
        print(f"  {name}: not available: {str(exc).splitlines()[0]}", flush=True)
        return None


def choose_upstream(report: Report, bench: Bench, which: str) -> Leg:
    """Measure the candidate upstreams direct; keep the fastest (at c=16) for the proxy legs."""
    starters: dict[str, Callable[[], Leg]] = {
        "fixed": lambda: start_fixed_upstream(bench.workdir, bench.pin),
        "simulator": lambda: start_simulator(bench.workdir, bench.pin),
    }
    candidates: list[tuple[Leg, Series]] = []
    for name, start in starters.items():
        if which not in ("auto", name):
            continue
        leg = _try(report, f"{name} upstream", start)
        if leg is None:
            continue
        try:
            candidates.append((leg, measure(leg, "upstream", bench)))
        except BaseException:
            for started in [leg, *(pair[0] for pair in candidates)]:
                started.stop()
            raise
    if not candidates:
        raise SystemExit("no upstream could start:\n" + "\n".join(report.unavailable.values()))
    best_leg, best = max(candidates, key=lambda pair: pair[1].rps(16) or 0.0)
    best.role = "direct"
    best.label += " — upstream used below"
    for leg, series in candidates:
        report.series.append(series)
        if leg is not best_leg:
            leg.stop()
    return best_leg


def run_tiergate(report: Report, bench: Bench, variant: Variant, upstream: Leg) -> None:
    """Throughput points on one gateway process, then memory on a fresh one."""
    name = f"TierGate ({variant.name})"
    leg = _try(report, name, lambda: start_tiergate(variant, upstream, bench.workdir, bench.pin))
    if leg is None:
        return
    try:
        series = measure(leg, "tiergate", bench, upstream)
        report.series.append(series)
    finally:
        leg.stop()
    run_memory(report, bench, variant, upstream)


def run_memory(report: Report, bench: Bench, variant: Variant, upstream: Leg) -> None:
    """The memory phase on a fresh gateway process."""
    name = f"TierGate ({variant.name}) memory"
    fresh = _try(report, name, lambda: start_tiergate(variant, upstream, bench.workdir, bench.pin))
    if fresh is None:
        return
    try:
        steps = bench.plan.memory_steps
        report.memory, report.memory_mix = measure_memory(
            fresh, bench.runner, steps, variant.needs_key
        )
    except LegUnavailableError as exc:
        report.unavailable[name] = str(exc)
    finally:
        fresh.stop()


PeerStarter = Callable[[Leg, Path, Placement], Leg]
PEERS: dict[str, tuple[str, PeerStarter]] = {
    # leg name on the command line: (report role and name, starter)
    "nginx": ("nginx", start_nginx),
    "vllm-router": ("vllm-router", start_vllm_router),
    "python-floor": ("Python floor", start_python_floor),
    "portkey": ("Portkey", start_portkey),
    "litellm": ("LiteLLM", start_litellm),
}


def run_peer(report: Report, bench: Bench, leg_name: str, upstream: Leg) -> None:
    """One peer's points, if it installs and starts; otherwise the report says why not."""
    role, start = PEERS[leg_name]
    leg = _try(report, role, lambda: start(upstream, bench.workdir, bench.pin))
    if leg is None:
        return
    try:
        report.series.append(measure(leg, leg_name, bench, upstream))
    finally:
        leg.stop()


def environment(
    wrk: str, plan: Plan, pin: Placement, variant: Variant, memory_only: bool = False
) -> list[str]:
    """Facts that make the numbers comparable: machine, tools, pinning, run lengths."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    wrk_version = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    commit = (
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or "uncommitted"
    )
    pinning = (
        "proxy alone on CPU 0; wrk -t1, the upstream (and Redis) on CPU 1"
        if "taskset" in pin.proxy
        else "no CPU pinning"
    ) + ("; every benchmark process at nice -20" if pin.boosted else "")
    return [
        f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; TierGate commit {commit}; "
        f"variant `{variant.name}`",
        f"machine: {os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}",
        f"load: {(wrk_version.stdout or wrk_version.stderr).splitlines()[0]} `-t1`, "
        + (
            "memory phase only (no throughput points)"
            if memory_only
            else f"{plan.duration_s:g} s per point after a {plan.warmup_s:g} s warm-up, "
            "POST of a small non-streaming chat completion"
        ),
        f"placement: {pinning}; one worker per server (nginx `worker_processes 1`, "
        "vllm-router and Portkey one process each, pinned like TierGate); "
        f"LiteLLM {LITELLM_VERSION}; peers' versions are in their row names",
        f"memory: fresh TierGate process driven at c={MEMORY_CONCURRENCY} with a mix of good "
        f"requests and refusals (cycle of {CYCLE}; table below), VmRSS of the process that owns "
        "the listening socket",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the selected legs and write the report."""
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every server this run started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    legs = {leg.strip() for leg in args.legs.split(",") if leg.strip()}
    if unknown := legs - set(LEGS):
        raise SystemExit(f"unknown legs {sorted(unknown)}; choose from {', '.join(LEGS)}")
    if args.skip_litellm:
        legs.discard("litellm")
    variant, plan = VARIANTS[args.variant], make_plan(args)
    pin = Placement.build(pin=not args.no_pin, boost=not args.no_boost)
    wrk = ensure_wrk()
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-"))
    bench = Bench(WrkRunner(wrk, workdir, pin.load, pin.boosted), plan, workdir, pin)
    command = shlex.join([".venv/bin/python", "bench/overhead/run.py", *(argv or sys.argv[1:])])
    report = Report(
        f"TierGate overhead benchmark — variant `{variant.name}`"
        + (" (quick)" if args.quick else ""),
        command,
        environment(wrk, plan, pin, variant, args.memory_only),
        variant=variant.name,
    )
    print(f"work directory (configs, logs): {workdir}", flush=True)
    if args.memory_only:
        report.memory_only = True
        upstream = start_fixed_upstream(workdir, pin)
    else:
        upstream = choose_upstream(report, bench, args.upstream)
    try:
        for name in LEGS if not args.memory_only else ():
            if name == "tiergate" and name in legs:
                run_tiergate(report, bench, variant, upstream)
            elif name in PEERS and name in legs:
                run_peer(report, bench, name, upstream)
        if args.memory_only:
            run_memory(report, bench, variant, upstream)
    finally:
        upstream.stop()
    write(report, args.out or default_out(variant, args.quick, args.memory_only))
    if args.keep_workdir or report.unavailable:
        print(f"configs and server logs kept in {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def default_out(variant: Variant, quick: bool, memory_only: bool = False) -> Path:
    """bench/results/overhead-VARIANT[-quick][-memory].md."""
    suffix = ("-quick" if quick else "") + ("-memory" if memory_only else "")
    return REPO_ROOT / "bench" / "results" / f"overhead-{variant.name}{suffix}.md"


def write(report: Report, out: Path) -> None:
    """Print the Markdown report and save it, with the raw numbers as JSON beside it."""
    text = render(report)
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    raw = {
        "series": [
            {
                "role": s.role,
                "label": s.label,
                "points": {str(c): {**asdict(p), "rps": p.rps} for c, p in s.points.items()},
            }
            for s in report.series
        ],
        "memory": [asdict(m) for m in report.memory],
        "unavailable": report.unavailable,
    }
    out.with_suffix(".json").write_text(json.dumps(raw, indent=2) + "\n")
    print(f"written: {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
