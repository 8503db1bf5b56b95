"""bench/overhead/ab.py's report: medians per revision, ratios to the first, every round."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from bench.overhead.ab import REPO_ROOT, Point, launcher, report, round_order


def test_report_takes_medians_and_ratios_against_the_first_revision() -> None:
    """Three rounds: the middle value wins; the base's CPU ratio is 1."""
    args = argparse.Namespace(variant="full", rounds=3, duration=5.0, concurrency=16)
    points = {
        "aaa1111": [
            Point(1000, 900, 1.0, 3.0),
            Point(1200, 800, 0.9, 2.0),
            Point(1100, 1000, 2.0, 4.0),
        ],
        "bbb2222": [
            Point(1300, 700, 0.8, 1.5),
            Point(1250, 720, 0.7, 2.5),
            Point(900, 1100, 1.9, 9.0),
        ],
    }
    text = report(args, ["aaa1111", "bbb2222"], points)
    assert "| aaa1111 | 1,100 | 900 | 1.000 | 3.000 | 1.000 |" in text
    assert "| bbb2222 | 1,250 | 720 | 0.800 | 2.500 | 0.800 |" in text
    assert "| 3 | bbb2222 | 900 | 1,100 | 1.900 | 9.000 |" in text
    assert "variant `full`" in text


def test_launcher_imports_the_gateway_from_the_tree_not_the_working_directory(
    tmp_path: Path,
) -> None:
    """Started from this checkout (as the legs are), the process must still run ``tree``'s code:
    ``python -c`` puts the working directory ahead of ``PYTHONPATH`` unless told not to."""
    tree = tmp_path / "tree"
    (tree / "gateway").mkdir(parents=True)
    (tree / "gateway" / "__init__.py").write_text("")
    (tree / "gateway" / "cli.py").write_text(
        "def main() -> int:\n    print('from-the-tree')\n    return 0\n"
    )
    out = subprocess.run(
        launcher(tree), cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "from-the-tree"


def test_a_launched_gateways_workers_also_run_the_trees_code(tmp_path: Path) -> None:
    """``--workers N`` starts each worker as ``python -m gateway`` from the same working
    directory (this checkout): the workers must import ``tree``'s code too, or a
    ``tiergate-2w@REV`` leg runs REV's supervisor over this checkout's workers. ``-P`` is not
    passed on to a child; ``PYTHONSAFEPATH`` in the environment is."""
    tree = tmp_path / "tree"
    (tree / "gateway").mkdir(parents=True)
    (tree / "gateway" / "__init__.py").write_text("")
    (tree / "gateway" / "probe.py").write_text("print('worker-from-the-tree')\n")
    (tree / "gateway" / "cli.py").write_text(
        "import subprocess, sys\n"
        "def main() -> int:\n"
        "    return subprocess.run([sys.executable, '-m', 'gateway.probe']).returncode\n"
    )
    out = subprocess.run(
        launcher(tree), cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=60
    )
    assert out.stdout.strip() == "worker-from-the-tree", out.stderr[-500:]


def test_rounds_alternate_the_order_of_the_revisions() -> None:
    """Odd rounds measure the revisions as given, even rounds in reverse: no revision always
    gets the faster first slot."""
    revs = ["a", "b", "c"]
    assert [round_order(revs, n) for n in (1, 2, 3)] == [revs, ["c", "b", "a"], revs]
