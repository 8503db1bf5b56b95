"""Classification latency on the request path: lean scorer vs scikit-learn, same run.

Scores ~1 KB prompts drawn from real external prompts (rendered text of 800 to 1,300 UTF-8
bytes), never from the project's corpus: every such prompt of
``../shared/datasets/router-dev2.jsonl`` (public datasets nobody on the project wrote; timing
is a measurement, not training, so its ``eval`` rows count too), or, where that file is absent,
of the committed ``router_models/training/data/external-train.jsonl`` (real public exam and
maths text). The report names the file it used. Each is timed with

* the lean scorer (``router_models.load().score``), warm word cache (steady state);
* the lean scorer with its word cache cleared before every call (worst case: all words new);
* scikit-learn: ``extract`` + CSR row + ``LogisticRegression.predict_proba``, with the same
  folded weights (the path the lean scorer replaces);
* scikit-learn ``predict_proba`` alone on a prebuilt CSR row.

Usage: ``.venv/bin/python bench/classify/run.py [--rounds 20] [--out FILE] [--prompts JSONL]``;
prints a Markdown report and writes it to ``bench/classify/results.md`` by default.
``--prompts`` draws from another file (the corpus, say, for a comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import router_models  # noqa: E402 - after the path setup above
from router_models.artifact import load as load_model  # noqa: E402
from router_models.features import extract, render  # noqa: E402
from router_models.records import body_of, read_jsonl  # noqa: E402
from router_models.scorer import LeanScorer  # noqa: E402
from router_models.training import EXTERNAL_TRAIN  # noqa: E402
from router_models.training.train import DEV2, featurize, sklearn_equivalent  # noqa: E402

DEFAULT_OUT = Path(__file__).parent / "results.md"


def typical_bodies(
    limit: int = 400, sources: Sequence[Path] = (DEV2, EXTERNAL_TRAIN)
) -> tuple[str, list[dict[str, Any]]]:
    """Bodies of real external prompts whose scored text is 800-1,300 UTF-8 bytes, from the
    first of ``sources`` that exists; that file's name and the bodies."""
    source = next(path for path in sources if path.is_file())
    bodies = []
    for record in read_jsonl(source):
        body = body_of(record)
        if 800 <= len(render(body).text.encode("utf-8")) <= 1300:
            bodies.append(body)
    return source.name, bodies[:limit]


def timed(fn: Callable[[Any], object], items: Sequence[Any], rounds: int) -> list[float]:
    """Microseconds per call of ``fn`` over ``items``, ``rounds`` times, after a warm-up."""
    for item in items:
        fn(item)
    samples = []
    for _ in range(rounds):
        for item in items:
            start = time.perf_counter_ns()
            fn(item)
            samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p90, p99 and mean in microseconds."""
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "mean": statistics.fmean(ordered),
    }


def run(rounds: int, prompts: Path | None = None) -> dict[str, Any]:
    """Measure every variant on the same bodies (from ``prompts`` when given)."""
    origin, bodies = typical_bodies() if prompts is None else typical_bodies(sources=(prompts,))
    router = router_models.load()
    lean = LeanScorer(load_model(router_models.DEFAULT_ARTIFACT))
    clf = sklearn_equivalent(load_model(router_models.DEFAULT_ARTIFACT))
    rows = [featurize([b]) for b in bodies]

    def cold(body: dict[str, Any]) -> float:
        lean._cache.clear()  # the benchmark measures the cold path on purpose
        return lean.score(body)

    results = {
        "lean scorer (warm cache)": summary(timed(router.score, bodies, rounds)),
        "lean scorer (cold cache)": summary(timed(cold, bodies, max(1, rounds // 4))),
        "sklearn extract + predict_proba": summary(
            timed(lambda b: clf.predict_proba(featurize([b])), bodies, max(1, rounds // 4))
        ),
        "sklearn predict_proba only": summary(timed(clf.predict_proba, rows, rounds)),
    }
    return {
        "bodies": len(bodies),
        "origin": origin,
        "mean_chars": statistics.fmean(len(render(b).text) for b in bodies),
        "mean_bytes": statistics.fmean(len(render(b).text.encode("utf-8")) for b in bodies),
        "rounds": rounds,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "results": results,
        "max_abs_diff_vs_sklearn": max(
            abs(router.score(b) - float(clf.predict_proba(featurize([b]))[0, 1])) for b in bodies
        ),
        "extract_check": len(extract(bodies[0])) > 0,
    }


def markdown(data: dict[str, Any]) -> str:
    """The report as Markdown."""
    lines = [
        "# Classification latency (router on the request path)",
        "",
        f"{data['bodies']} prompts of ~1 KB from {data['origin']} (mean "
        f"{data['mean_bytes']:.0f} bytes, {data['mean_chars']:.0f} chars), "
        f"{data['rounds']} rounds, Python {data['python']}, {data['cpu_count']} CPUs, "
        f"1-minute load average {data['load_average_1m']:.1f} when it started.",
        "",
        "| variant | p50 µs | p90 µs | p99 µs | mean µs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in data["results"].items():
        lines.append(
            f"| {name} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['mean']:.1f} |"
        )
    lines += [
        "",
        f"Largest |lean - sklearn| probability difference: {data['max_abs_diff_vs_sklearn']:.2e}",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark, print and save the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument(
        "--prompts", type=Path, default=None, help="another JSONL to draw the 1 KB prompts from"
    )
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    data = run(args.rounds, args.prompts)
    report = markdown(data)
    print(report)
    args.out.write_text(report, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
