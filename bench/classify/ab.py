"""Scorer latency, two or more revisions side by side (a same-run A/B of ``make bench-classify``).

Each revision's code runs from a detached worktree, in its own process, on the same prompts
(those ``bench/classify/run.py`` picks, written once to a file) and pinned to the same CPU;
rounds alternate the order (``bench/overhead/ab.py``'s ``round_order``). Per revision the report
gives the median over rounds of each round's p50, p90 and mean, and the ratio to the first
revision; every round is listed. Run:
``.venv/bin/python bench/classify/ab.py --revs BASE,HEAD [--rounds 6] [--out FILE]``
(the working tree counts as ``WORKTREE``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.classify.run import summary, typical_bodies  # noqa: E402
from bench.harness.markdown import report_head  # noqa: E402
from bench.overhead.ab import checkout, remove, resolve, round_order  # noqa: E402

WORKTREE = "WORKTREE"
# Runs in the revision's process: its own router_models (``-P`` keeps this checkout off the
# path), its own default artifact, the warm-cache timing of bench/classify/run.py.
CHILD = """
import json, os, sys, time
bodies = json.load(open(sys.argv[1], encoding="utf-8"))
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(sys.argv[3])})
import router_models
score = router_models.load().score
for body in bodies:
    score(body)
samples = []
for _ in range(int(sys.argv[2])):
    for body in bodies:
        start = time.perf_counter_ns()
        score(body)
        samples.append((time.perf_counter_ns() - start) / 1000)
print(json.dumps(samples))
"""


def measure(tree: Path, prompts: Path, passes: int, cpu: int) -> dict[str, float]:
    """One process of ``tree``'s code: p50 / p90 / p99 / mean µs of the lean scorer."""
    out = subprocess.run(
        [sys.executable, "-P", "-c", CHILD, str(prompts), str(passes), str(cpu)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"{tree}: the timing process failed: {out.stderr.strip()[-2000:]}")
    return summary(json.loads(out.stdout))


def report(revs: list[str], rounds: list[dict[str, dict[str, float]]], header: str) -> str:
    """Medians per revision, ratios to the first, every round."""
    keys = ("p50", "p90", "mean")
    med = {r: {k: statistics.median(x[r][k] for x in rounds) for k in keys} for r in revs}
    lines = [header, "", "| revision | p50 µs | p90 µs | mean µs | p50 / first | mean / first |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for rev in revs:
        m, first = med[rev], med[revs[0]]
        lines.append(
            f"| {rev} | {m['p50']:.1f} | {m['p90']:.1f} | {m['mean']:.1f} "
            f"| {m['p50'] / first['p50']:.3f} | {m['mean'] / first['mean']:.3f} |"
        )
    lines += ["", "Every round (p50 / p90 / mean µs):", ""]
    for number, result in enumerate(rounds, 1):
        cells = "; ".join(
            f"{r} {result[r]['p50']:.1f} / {result[r]['p90']:.1f} / {result[r]['mean']:.1f}"
            for r in round_order(revs, number)
        )
        lines.append(f"- round {number}: {cells}")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revs", required=True, help=f"comma-separated; {WORKTREE} for this tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--passes", type=int, default=5, help="passes over the prompts per round")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(r for r in args.revs.split(",") if r))
    origin, bodies = typical_bodies()
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-classify-ab-"))
    trees: dict[str, Path] = {}
    revs: list[str] = []
    try:
        for name in names:
            rev = name if name == WORKTREE else resolve(name)
            if rev in trees:  # two names of one commit
                continue
            trees[rev] = ROOT if rev == WORKTREE else checkout(rev, workdir)
            revs.append(rev)
        prompts = workdir / "prompts.json"
        prompts.write_text(json.dumps(bodies), encoding="utf-8")
        rounds = []
        for number in range(1, args.rounds + 1):
            result = {}
            for rev in round_order(revs, number):
                result[rev] = measure(trees[rev], prompts, args.passes, args.cpu)
            rounds.append(result)
            print(f"round {number}: " + ", ".join(f"{r} {result[r]['p50']:.1f}" for r in revs))
    finally:
        for rev, tree in trees.items():
            if rev != WORKTREE:
                remove(tree)
        shutil.rmtree(workdir, ignore_errors=True)
    command = ".venv/bin/python bench/classify/ab.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    setup = (
        f"{len(bodies)} prompts of ~1 KB from {origin}, {args.rounds} rounds of {args.passes} "
        f"passes per revision, one process per revision and round, pinned to CPU {args.cpu}; "
        f"1-minute load average {os.getloadavg()[0]:.1f} at the end."
    )
    header = "\n".join([*report_head("Scorer latency A/B", command), setup])
    text = report(revs, rounds, header)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
