"""The ``needs_shared`` marker: skip with the missing path named, fail instead under CI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import shared_data


class _Item:
    """The one thing ``check`` reads from a pytest item: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self._marks = [mark.mark for mark in marks]

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        return (mark for mark in self._marks if mark.name == name)


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for ``../shared`` with one dataset in it."""
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "here.jsonl").write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(shared_data, "SHARED", tmp_path)
    return tmp_path


def test_missing_file_skips_naming_the_path(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside CI a missing file skips, and the reason names ../shared/<path>."""
    monkeypatch.delenv("CI", raising=False)
    item = _Item(shared_data.needs_shared("datasets/here.jsonl", "datasets/gone.jsonl"))
    with pytest.raises(pytest.skip.Exception, match=r"needs \.\./shared/datasets/gone\.jsonl"):
        shared_data.check(item)


def test_missing_file_fails_in_ci(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CI=true a missing file is a failure, not a silent skip."""
    monkeypatch.setenv("CI", "true")
    item = _Item(shared_data.needs_shared("datasets/gone.jsonl"))
    with pytest.raises(pytest.fail.Exception, match=r"but missing \.\./shared/datasets/gone"):
        shared_data.check(item)


@pytest.mark.parametrize("ci", ["", "false", "true"])
def test_present_files_run(shared: Path, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    """When every named file exists the test runs, in CI or not."""
    monkeypatch.setenv("CI", ci)
    shared_data.check(_Item(shared_data.needs_shared("datasets/here.jsonl")))
    assert shared_data.missing(("datasets/here.jsonl",)) == []
