"""Profile TierGate's request path under a fixed request mix: where does each request's time go?

Usage: ``.venv/bin/python bench/overhead/profile.py [--variant full] [--duration 10]
[--concurrency 16] [--top 30] [--out bench/results/profile-full.md] [--stats FILE]``

The gateway of the chosen variant (default ``full``: file keys, the Redis limiter, ``model:
auto`` through the classifier, tracing at 10 %) runs under ``cProfile`` in front of the fixed
upstream, pinned and boosted as in the overhead benchmark. wrk sends the benchmark's small chat
completion: a warm-up, ``--duration`` seconds without the profiler (the reference rate), then
``--duration`` seconds with it (started and stopped by signals, see ``profiled_gateway.py``,
so start-up and shutdown are not in the stats), and the report lists own time by area and the
functions with the most own and cumulative time, each in microseconds per request. cProfile's
hooks slow every Python call, so absolute numbers are inflated (the report states both rates);
the shares are what to read. A coroutine counts one call per resumption, so "calls / request"
of async functions is their number of steps, not of invocations. A hand-written section after
the ``<!-- findings -->`` marker in the output file is kept when the report is rewritten.
"""

from __future__ import annotations

import argparse
import os
import pstats
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness.legs import Leg, Placement, start_fixed_upstream  # noqa: E402  # after the path fix
from bench.harness.markdown import report_head  # noqa: E402  # same
from bench.harness.wrk import WrkRunner, ensure_wrk, lua_script  # noqa: E402  # same
from bench.overhead.legs import start_tiergate  # noqa: E402  # same
from bench.overhead.variants import VARIANTS  # noqa: E402  # same

WARMUP_S = 3.0
FINDINGS = "<!-- findings -->"  # what follows it in the output file survives a rerun

# Groups of functions whose cumulative time is reported as one line, by where they live.
AREAS = {
    "litestar request handling (routing, request, response)": "/litestar/",
    "uvicorn + httptools (HTTP parsing, ASGI glue)": "/uvicorn/",
    "aiohttp (health probes; the request path's client until 2026-12-03)": "/aiohttp/",
    "gateway's own upstream client (gateway/upstream_*.py)": "/gateway/upstream_",
    "redis client (limiter round trips)": "/redis/",
    "opentelemetry (spans, sampling, export)": "/opentelemetry/",
    "structlog (logging)": "/structlog/",
    "router_models (classifier)": "/router_models/",
    "policies (pure decisions)": "/policies/",
    "gateway (our IO shell)": "/gateway/",
    "asyncio / uvloop event loop": "/asyncio/",
    "json / msgspec / orjson": "json",
}


@dataclass(frozen=True)
class Run:
    """What the profiled run did."""

    requests: int
    profiled_rps: float
    unprofiled_rps: float
    command: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="full")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of profiled load")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--top", type=int, default=30, help="functions listed per table")
    p.add_argument("--out", type=Path, help="default bench/results/profile-VARIANT.md")
    p.add_argument("--stats", type=Path, help="also save the raw cProfile stats here")
    args = p.parse_args(argv)
    if args.duration < 1 or args.concurrency < 1 or args.top < 1:
        p.error("--duration >= 1, --concurrency >= 1 and --top >= 1")
    return args


def _signal(leg: Leg, signum: int) -> None:
    os.kill(leg.main.listener_pid(), signum)


def _wait_for(path: Path, workdir: Path) -> None:
    for _ in range(100):
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.2)  # let the dump finish
            return
        time.sleep(0.1)
    raise SystemExit(f"the gateway wrote no stats to {path}; logs in {workdir}")


def profile_gateway(args: argparse.Namespace, workdir: Path, stats_path: Path) -> Run:
    """The rate without the profiler, then the same load with it, on the same kind of gateway."""
    pin = Placement.build(pin=True, boost=True)
    runner = WrkRunner(ensure_wrk(), workdir, pin.load, pin.boosted)
    variant = VARIANTS[args.variant]
    upstream = start_fixed_upstream(workdir, pin)
    try:
        launcher = (sys.executable, "-m", "bench.overhead.profiled_gateway", str(stats_path))
        leg = start_tiergate(variant, upstream, workdir, pin, launcher=launcher)
        script = lua_script(leg.body(), leg.api_key, headers=leg.headers)
        try:
            runner.run(leg.chat_url, script, args.concurrency, WARMUP_S)
            unprofiled = runner.run(leg.chat_url, script, args.concurrency, args.duration)
            _signal(leg, signal.SIGUSR1)
            profiled = runner.run(leg.chat_url, script, args.concurrency, args.duration)
            _signal(leg, signal.SIGUSR2)
            _wait_for(stats_path, workdir)
        finally:
            leg.stop()
    finally:
        upstream.stop()
    bad = profiled.errors + profiled.non_2xx
    if bad:
        raise SystemExit(f"{bad} of the profiled requests failed; logs in {workdir}")
    command = shlex.join([".venv/bin/python", "bench/overhead/profile.py", *sys.argv[1:]])
    return Run(profiled.requests, profiled.rps, unprofiled.rps, command)


def _where(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name
    for marker in ("site-packages/", str(REPO_ROOT) + "/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line} {name}"


def table(stats: pstats.Stats, key: str, top: int, requests: int) -> list[str]:
    """The ``top`` functions by own (``tottime``) or cumulative time, µs per request."""
    raw = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table untyped
    rows = sorted(raw.items(), key=lambda item: item[1][2 if key == "tottime" else 3], reverse=True)
    lines = ["| function | calls / request | own µs / request | cumulative µs / request |"]
    lines.append("|---|---:|---:|---:|")
    for func, (_, ncalls, tottime, cumtime, _) in rows[:top]:
        lines.append(
            f"| `{_where(func)}` | {ncalls / requests:.2f} | {tottime / requests * 1e6:.1f} | "
            f"{cumtime / requests * 1e6:.1f} |"
        )
    return lines


def areas(stats: pstats.Stats, requests: int) -> list[str]:
    """Own time summed by library or package, µs per request and share of the total."""
    raw = stats.stats  # type: ignore[attr-defined]  # same
    total = sum(v[2] for v in raw.values()) or 1.0
    sums = dict.fromkeys(AREAS, 0.0)
    other = 0.0
    for (path, _, name), value in raw.items():
        where = path if path != "~" else name
        area = next((a for a, marker in AREAS.items() if marker in where), None)
        if area is None:
            other += value[2]
        else:
            sums[area] += value[2]
    lines = ["| where (own time) | µs / request | share |", "|---|---:|---:|"]
    for area, seconds in sorted(sums.items(), key=lambda kv: kv[1], reverse=True):
        lines.append(f"| {area} | {seconds / requests * 1e6:.1f} | {seconds / total:.1%} |")
    lines.append(
        f"| everything else (C builtins, stdlib) | {other / requests * 1e6:.1f} | "
        f"{other / total:.1%} |"
    )
    return lines


def render(run: Run, stats: pstats.Stats, variant: str, top: int) -> str:
    """The Markdown report."""
    raw = stats.stats  # type: ignore[attr-defined]  # same
    total = sum(v[2] for v in raw.values())
    return "\n".join(
        [
            *report_head(f"Profile of TierGate's `{variant}` path", run.command),
            f"- {run.requests:,} requests profiled (the benchmark's small non-streaming chat "
            "completion, wrk -t1, pinned and boosted as `bench/overhead`), fixed upstream;",
            f"- rate: {run.unprofiled_rps:,.0f} req/s without the profiler, "
            f"{run.profiled_rps:,.0f} req/s under cProfile; profiled CPU time "
            f"{total / run.requests * 1e6:,.0f} µs per request (all functions' own time);",
            f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}.",
            "",
            "## Own time by area",
            "",
            *areas(stats, run.requests),
            "",
            f"## Top {top} functions by own time",
            "",
            *table(stats, "tottime", top, run.requests),
            "",
            f"## Top {top} functions by cumulative time",
            "",
            *table(stats, "cumtime", top, run.requests),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Profile, then write the report."""
    args = parse_args(argv)
    out = args.out or REPO_ROOT / "bench" / "results" / f"profile-{args.variant}.md"
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-profile-"))  # kept when something fails
    stats_path = workdir / "tiergate.prof"
    run = profile_gateway(args, workdir, stats_path)
    stats = pstats.Stats(str(stats_path))
    text = render(run, stats, args.variant, args.top)
    if args.stats:
        stats.dump_stats(str(args.stats))
    shutil.rmtree(workdir, ignore_errors=True)
    if out.exists() and FINDINGS in (old := out.read_text()):
        text += "\n" + old[old.index(FINDINGS) :]
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written: {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
