"""bench/requestpath drives the real service: both settings answer 200 and the report says so."""

from __future__ import annotations

from pathlib import Path

from bench.requestpath.run import main


def test_both_settings_are_measured_with_the_command(tmp_path: Path) -> None:
    """A short run writes a row per setting (the run stops on any non-200 answer)."""
    out = tmp_path / "requestpath.md"
    assert main(["--requests", "20", "--rounds", "1", "--profile", "--out", str(out)]) == 0
    text = out.read_text()
    assert ".venv/bin/python bench/requestpath/run.py --requests 20" in text
    assert "| plain | " in text
    assert "| keys | " in text
    assert "cProfile, `keys`" in text
