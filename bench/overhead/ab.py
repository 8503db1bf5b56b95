"""Before and after on a noisy machine: gateway versions measured interleaved, round by round.

Usage: ``.venv/bin/python bench/overhead/ab.py --revs 6190865,HEAD [--variant full]
[--rounds 3] [--duration 5] [--out bench/results/ab-VARIANT.md]``

Each revision is checked out into a temporary git worktree (``HEAD`` and other names are
resolved first, so the report names commits) and run with that tree first on ``PYTHONPATH``
(the gateway, the router artifact and the policies all come from the tree; the benchmark's
own code and this checkout's virtual environment are shared). One fixed upstream serves
every round; each round starts every revision's gateway in turn (the variant's config, pinned
and boosted as ``bench/overhead``), warms it, and measures req/s at c=16 (``--concurrency``),
the gateway's CPU time per request there (user + system of all its threads, from ``/proc``)
and p50 and p99 at c=1.
Rounds interleave the revisions, so a machine that slows down (another tenant, CPU steal) slows
every revision alike, and alternate their order (the first slot of a round was measured faster);
the medians over rounds are compared within the run. CPU per request
is the figure least moved by such noise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness.legs import Placement, start_fixed_upstream  # noqa: E402  # after the path fix
from bench.harness.markdown import report_head  # noqa: E402  # same
from bench.harness.wrk import WrkRunner, ensure_wrk, lua_script  # noqa: E402  # same
from bench.overhead.legs import start_tiergate  # noqa: E402  # same
from bench.overhead.variants import VARIANTS  # noqa: E402  # same

WARMUP_S = 2.0


@dataclass(frozen=True)
class Point:
    """One revision in one round."""

    rps_loaded: float
    cpu_us_per_request: float
    p50_c1_ms: float
    p99_c1_ms: float


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of ``pid``."""
    ticks = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def resolve(rev: str) -> str:
    """The short commit id of ``rev`` in this repository."""
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", rev],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def checkout(commit: str, where: Path) -> Path:
    """A detached worktree of ``commit`` under ``where``."""
    tree = where / commit
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "--quiet", str(tree), commit],
        check=True,
    )
    return tree


def remove(tree: Path) -> None:
    """Drop a worktree made by :func:`checkout`."""
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False
    )
    shutil.rmtree(tree, ignore_errors=True)


def launcher(tree: Path) -> tuple[str, ...]:
    """Run ``tiergate`` with ``tree``'s code first on the path.

    ``-P``: ``python -c`` would otherwise put the working directory (this checkout, where the
    legs start) ahead of ``PYTHONPATH``, and every revision would run this checkout's code.
    ``PYTHONSAFEPATH`` does the same for the processes it starts (``--workers N``: each
    worker is ``python -m gateway``), which ``-P`` does not reach.
    """
    # The gateway's command line moved from gateway/cli.py to gateway/__main__.py (issue 19).
    module = "gateway.__main__" if (tree / "gateway" / "__main__.py").exists() else "gateway.cli"
    main = f"import sys; from {module} import main; sys.exit(main())"
    return ("env", f"PYTHONPATH={tree}", "PYTHONSAFEPATH=1", sys.executable, "-P", "-c", main)


def round_order(commits: list[str], number: int) -> list[str]:
    """The order of round ``number`` (from 1): as given in odd rounds, reversed in even ones.
    On this machine the revision measured first in a round ran about 4 % faster whichever it
    was (`bench/results/ab-plain-fixes*.md`); alternating spreads that over every revision."""
    return list(commits) if number % 2 else list(reversed(commits))


def run(args: argparse.Namespace, commits: list[str], workdir: Path) -> dict[str, list[Point]]:
    """Every round, every revision: the points."""
    trees = {commit: checkout(commit, workdir) for commit in commits}
    pin = Placement.build(pin=True, boost=True)
    runner = WrkRunner(ensure_wrk(), workdir, pin.load, pin.boosted)
    variant = VARIANTS[args.variant]
    points: dict[str, list[Point]] = {commit: [] for commit in commits}
    upstream = start_fixed_upstream(workdir, pin)
    try:
        for number in range(1, args.rounds + 1):
            for commit in round_order(commits, number):
                leg = start_tiergate(
                    variant, upstream, workdir, pin, launcher=launcher(trees[commit])
                )
                try:
                    script = lua_script(leg.body(), leg.api_key, headers=leg.headers)
                    runner.run(leg.chat_url, script, args.concurrency, WARMUP_S)
                    pid = leg.main.listener_pid()
                    before = cpu_seconds(pid)
                    loaded = runner.run(leg.chat_url, script, args.concurrency, args.duration)
                    spent = cpu_seconds(pid) - before
                    single = runner.run(leg.chat_url, script, 1, args.duration)
                finally:
                    leg.stop()
                bad = loaded.errors + loaded.non_2xx + single.errors + single.non_2xx
                if bad:
                    raise SystemExit(f"{commit}: {bad} requests failed; logs in {workdir}")
                point = Point(
                    loaded.rps, spent / loaded.requests * 1e6, single.p50_ms, single.p99_ms
                )
                points[commit].append(point)
                print(
                    f"round {number} {commit}: c={args.concurrency} {point.rps_loaded:,.0f} req/s, "
                    f"{point.cpu_us_per_request:,.0f} µs CPU/request, c=1 p50 "
                    f"{point.p50_c1_ms:.3f} ms, p99 {point.p99_c1_ms:.3f} ms",
                    flush=True,
                )
    finally:
        upstream.stop()
        for tree in trees.values():
            remove(tree)
    return points


def report(args: argparse.Namespace, commits: list[str], points: dict[str, list[Point]]) -> str:
    """The Markdown report: medians, ratios to the first revision, every round."""
    given = " ".join(sys.argv[1:])
    base = commits[0]
    c = args.concurrency

    def med(commit: str, attr: str) -> float:
        return float(statistics.median(float(getattr(p, attr)) for p in points[commit]))

    lines = [
        *report_head(
            f"Before and after, interleaved: variant `{args.variant}`",
            f".venv/bin/python bench/overhead/ab.py {given}".rstrip(),
        ),
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; {args.rounds} rounds of "
        f"{args.duration:g} s points, revisions interleaved in each round; pinned and boosted "
        "as `bench/overhead`, fixed upstream; medians over the rounds.",
        "",
        f"| revision | c={c} req/s | CPU µs / request at c={c} | c=1 p50 ms | c=1 p99 ms | "
        f"CPU / request vs {base} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for commit in commits:
        cpu = med(commit, "cpu_us_per_request")
        lines.append(
            f"| {commit} | {med(commit, 'rps_loaded'):,.0f} | {cpu:,.0f} | "
            f"{med(commit, 'p50_c1_ms'):.3f} | {med(commit, 'p99_c1_ms'):.3f} | "
            f"{cpu / med(base, 'cpu_us_per_request'):.3f} |"
        )
    lines += [
        "",
        "Every round:",
        "",
        f"| round | revision | c={c} req/s | CPU µs / request | c=1 p50 ms | c=1 p99 ms |",
    ]
    lines.append("|---:|---|---:|---:|---:|---:|")
    for number in range(args.rounds):
        for commit in commits:
            p = points[commit][number]
            lines.append(
                f"| {number + 1} | {commit} | {p.rps_loaded:,.0f} | {p.cpu_us_per_request:,.0f} | "
                f"{p.p50_c1_ms:.3f} | {p.p99_c1_ms:.3f} |"
            )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    """Parse, measure, write."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--revs", required=True, help="comma list of git revisions, first is the base")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="full")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--concurrency", type=int, default=16, help="connections of the loaded point (default 16)"
    )
    p.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    p.add_argument("--out", type=Path, help="default bench/results/ab-VARIANT.md")
    args = p.parse_args(argv)
    commits = [resolve(rev) for rev in args.revs.split(",")]
    if len(commits) < 2 or args.rounds < 1 or args.duration < 1:
        p.error("two or more revisions, --rounds >= 1, --duration >= 1")
    out = args.out or REPO_ROOT / f"bench/results/ab-{args.variant}.md"
    with tempfile.TemporaryDirectory(prefix="tiergate-ab-") as workdir:
        points = run(args, commits, Path(workdir))
    text = report(args, commits, points)
    out.write_text(text, encoding="utf-8")
    print(text)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
