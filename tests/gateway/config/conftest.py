"""Fixtures shared by the settings tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees no TIERGATE_* variable but its own."""
    for name in list(os.environ):
        if name.upper().startswith("TIERGATE_"):
            monkeypatch.delenv(name)
