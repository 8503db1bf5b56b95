"""``tiergate serve`` with every automatic garbage collection off and a probe on SIGUSR1.

    python -m tests.integration.gc_probe_serve serve --config cfg.yaml --port 8080 --workers 1

For tests/integration/test_gc_cycles.py only. The server is the real one, but after start-up
(:func:`gateway.http.collector.settle_at_start`) the collector is disabled and the periodic full
pass never runs, so every reference cycle the process leaves waits for the probe: on SIGUSR1 it
runs a full collection that keeps what it finds (``gc.DEBUG_SAVEALL``), appends one JSON line to
``$TIERGATE_GC_PROBE_OUT`` (how many objects, their types, the functions of the frames and the
exception types among them), then frees them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

from gateway import __main__ as cli
from gateway.http import collector

_settle = collector.settle_at_start


def _settle_and_disable() -> tuple[int, int, int]:
    before = _settle()
    gc.disable()
    return before


async def _no_full_passes(busy_connections: Callable[[], int], *_: Any) -> None:
    del busy_connections
    await asyncio.Event().wait()


def _where(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({os.path.basename(code.co_filename)})"


def _probe(signum: int, frame: types.FrameType | None) -> None:
    del signum, frame
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        frames = Counter(_where(o) for o in gc.garbage if isinstance(o, types.FrameType))
        errors = Counter(type(o).__qualname__ for o in gc.garbage if isinstance(o, BaseException))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    gc.collect()
    line = {
        "found": found,
        "kinds": kinds.most_common(12),
        "frames": frames.most_common(12),
        "errors": errors.most_common(6),
    }
    with open(os.environ["TIERGATE_GC_PROBE_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def main() -> int:
    """``tiergate serve`` with the probe in place."""
    collector.settle_at_start = _settle_and_disable
    collector.collect_periodically = _no_full_passes  # type: ignore[assignment]
    signal.signal(signal.SIGUSR1, _probe)
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
