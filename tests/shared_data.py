"""Tests that read ``../shared`` (the CI-only checkout beside the repository) say so.

A user's clone has no ``../shared``; CI has one. Mark a test (or a module, with
``pytestmark``) with the files it reads:

    @needs_shared("datasets/router-dev.jsonl", "datasets/router-dev2.jsonl")
    def test_...(): ...

Where a named file is missing the test is skipped with a reason that names it, unless the
environment says CI (``CI=true``, as ``.ci/run`` sets): there the test fails instead, so a CI
run without ``../shared`` is loud rather than silently thinner. ``tests/conftest.py`` applies it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

import pytest

REPO: Final = Path(__file__).resolve().parents[1]
SHARED: Final = REPO.parent / "shared"
SHARED_DATASETS: Final = SHARED / "datasets"
MARKER: Final = "needs_shared"  # the name pytest.mark.needs_shared carries


class Marked(Protocol):
    """What ``check`` reads from a test item: its markers of one name."""

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        """The markers named ``name``, closest first."""
        ...


def needs_shared(*relative: str) -> pytest.MarkDecorator:
    """The marker for a test that reads these files under ``../shared``."""
    return pytest.mark.needs_shared.with_args(*relative)


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI`` set to anything but false)."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def missing(relative: tuple[str, ...]) -> list[str]:
    """Those of ``relative`` (paths under ``../shared``) that do not exist, as ``../shared/…``."""
    return [f"../shared/{name}" for name in relative if not (SHARED / name).exists()]


def check(item: Marked) -> None:
    """Skip (or, in CI, fail) ``item`` when a file one of its markers names is missing."""
    names = tuple(name for mark in item.iter_markers(MARKER) for name in mark.args)
    absent = missing(names)
    if not absent:
        return
    what = ", ".join(absent)
    if in_ci():
        pytest.fail(f"CI=true but missing {what}: CI must check out ../shared beside the repo")
    pytest.skip(f"needs {what} (a CI-only checkout beside the repo)")
