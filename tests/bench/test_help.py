"""Every runnable script under bench/ answers ``--help`` with its usage, exit 0, and writes
nothing: a reader who asks what a benchmark does must not overwrite its committed report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    path.relative_to(REPO)
    for path in (REPO / "bench").rglob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def _files(root: Path) -> dict[str, float]:
    return {str(path.relative_to(root)): path.stat().st_mtime for path in root.rglob("*")}


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of bench/ in a folder of its own: a script that ran instead of
    printing its usage writes there, never into the checkout."""
    root = tmp_path_factory.mktemp("benchcopy")
    shutil.copytree(REPO / "bench", root / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_list_holds_the_scripts_the_docs_name() -> None:
    """The discovery finds the benchmarks the docs run (a broken glob would pass vacuously)."""
    names = {str(path) for path in SCRIPTS}
    assert {"bench/packaging/run.py", "bench/overhead/run.py", "bench/streams/run.py"} <= names
    assert len(names) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help_prints_usage_and_writes_nothing(copy: Path, script: Path) -> None:
    """``python -m bench.X --help``: exit 0, a usage line, no file created or changed."""
    before = _files(copy)
    module = ".".join(script.with_suffix("").parts)
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    assert _files(copy) == before
