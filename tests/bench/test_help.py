"""Every runnable script under bench/ answers ``--help`` with its usage, exit 0, and writes
nothing: a reader who asks what a benchmark does must not overwrite its committed report.

Each script runs in a process of its own, forked from one server that imported beforehand what
the scripts import at module level (numpy, scikit-learn, the gateway...): 35 fresh interpreters
spent most of their seconds importing the same modules again."""

from __future__ import annotations

import ast
import multiprocessing
import multiprocessing.context
import os
import shutil
from pathlib import Path

import pytest

from tests.processes import run_module_forked

REPO = Path(__file__).resolve().parents[2]


def _bench_sources() -> list[Path]:
    """The Python files of bench/, not those under a hidden folder: ``bench/.peers`` holds
    the peers' virtual environments once a peer test installed them (thousands of
    site-packages files; preloading their imports broke the fork server on mypy's)."""
    root = REPO / "bench"
    return [
        path
        for path in root.rglob("*.py")
        if not any(part.startswith(".") for part in path.relative_to(root).parts)
    ]


SCRIPTS = sorted(
    path.relative_to(REPO)
    for path in _bench_sources()
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def _files(root: Path) -> dict[str, float]:
    return {str(path.relative_to(root)): path.stat().st_mtime for path in root.rglob("*")}


def _module_level_imports() -> list[str]:
    """What the files under bench/ import at module level, but bench itself (it runs from the
    copy) and tests (test modules import bench)."""
    names: set[str] = set()
    for path in _bench_sources():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in ("bench", "tests", "__future__"))


@pytest.fixture(scope="module")
def forks() -> multiprocessing.context.ForkServerContext:
    """The fork server the scripts run from, with their imports preloaded (a server some other
    test started first lacks them: the scripts then import them themselves, only slower)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.processes", *_module_level_imports()])
    return context


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of bench/ in a folder of its own: a script that ran instead of
    printing its usage writes there, never into the checkout."""
    root = tmp_path_factory.mktemp("benchcopy")
    skip = shutil.ignore_patterns("__pycache__", ".*")  # hidden: the peers' environments
    shutil.copytree(REPO / "bench", root / "bench", ignore=skip)
    return root


def test_the_list_holds_the_scripts_the_docs_name() -> None:
    """The discovery finds the benchmarks the docs run (a broken glob would pass vacuously)."""
    names = {str(path) for path in SCRIPTS}
    assert {"bench/packaging/run.py", "bench/overhead/run.py", "bench/streams/run.py"} <= names
    assert len(names) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help_prints_usage_and_writes_nothing(
    forks: multiprocessing.context.ForkServerContext, copy: Path, script: Path
) -> None:
    """``python -m bench.X --help``: exit 0, a usage line, no file created or changed."""
    before = _files(copy)
    module = ".".join(script.with_suffix("").parts)
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    done = run_module_forked(forks, module, "--help", cwd=copy, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    assert _files(copy) == before
