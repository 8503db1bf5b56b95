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

import argparse
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead.profiled_gateway",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("stats_file", help="where SIGUSR2 writes the cProfile stats")
    parser.add_argument("tiergate_args", nargs=argparse.REMAINDER, help="e.g. serve --config F")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``tiergate ARGS...`` with the two signal handlers installed."""
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # --help (0) or a usage error (2), as a return code
        return stop.code if isinstance(stop.code, int) else 2
    if not args.tiergate_args:
        parser.print_usage(sys.stderr)
        return 2
    from gateway.__main__ import main as tiergate  # noqa: PLC0415  # after the usage check

    toggle = Toggle(args.stats_file)
    signal.signal(signal.SIGUSR1, toggle.start)
    signal.signal(signal.SIGUSR2, toggle.stop)
    return tiergate(args.tiergate_args)


if __name__ == "__main__":
    raise SystemExit(main())
