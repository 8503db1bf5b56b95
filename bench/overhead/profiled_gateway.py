"""Run ``tiergate`` with a profiler that SIGUSR1 starts and SIGUSR2 stops and writes out.

Usage: ``python -m bench.overhead.profiled_gateway STATS_FILE serve --config ...``

Only the requests sent between the two signals are in the stats (no start-up, warm-up or
shutdown). cProfile hooks the thread that enables it; the handlers run on the main thread,
which is the event loop's, so that is the thread profiled (background threads, such as the
span exporter's, are not). ``python -m cProfile`` would not do either: it profiles start-up
and shutdown too, and writes nothing here, because uvicorn re-raises SIGTERM after its
graceful shutdown with the default handler back in place.
"""

from __future__ import annotations

import cProfile
import signal
import sys
from types import FrameType


class Toggle:
    """The profiler and the file its stats go to."""

    def __init__(self, stats_file: str) -> None:
        self.stats_file = stats_file
        self.profiler = cProfile.Profile()

    def start(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: start profiling (from a clean slate)."""
        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR2: stop profiling and write the stats."""
        self.profiler.disable()
        self.profiler.dump_stats(self.stats_file)


def main(argv: list[str] | None = None) -> int:
    """Run ``tiergate ARGS...`` with the two signal handlers installed."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: profiled_gateway STATS_FILE TIERGATE_ARGS...", file=sys.stderr)
        return 2
    from gateway.__main__ import main as tiergate  # noqa: PLC0415  # after the usage check

    toggle = Toggle(args[0])
    signal.signal(signal.SIGUSR1, toggle.start)
    signal.signal(signal.SIGUSR2, toggle.stop)
    return tiergate(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
