"""A progress line on stderr: redrawn in place on a terminal, one line per point otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 24


class Progress:
    """Counts finished requests of the whole run and of the current grid point."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._label = ""
        self._started = time.monotonic()
        self._drawn = 0.0

    def begin(self, label: str) -> None:
        """A new grid point starts."""
        self._label = label
        self._draw(force=True)

    def step(self) -> None:
        """One request finished (or was given up)."""
        self.done += 1
        self._draw()

    def end_point(self, summary: str) -> None:
        """A grid point finished: keep its line."""
        if self.live:
            self.stream.write("\r\x1b[2K")
        self.stream.write(f"{self._label}: {summary}\n")
        self.stream.flush()

    def _draw(self, *, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._drawn < 0.1 and self.done < self.total:
            return
        self._drawn = now
        filled = int(_WIDTH * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (_WIDTH - filled)
        elapsed = now - self._started
        self.stream.write(
            f"\r\x1b[2K[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {self._label}"
        )
        self.stream.flush()
