"""Garbage collection for a server that holds thousands of long-lived streams.

Each open stream keeps about 90 objects the cyclic collector tracks (its task, coroutine frames,
protocol, transport, buffers). CPython's default schedule scans them again and again while they
live: a middle-generation collection took 66-91 ms and each young one 4-17 ms with 4,000
streams open, and a full one 242 ms, a pause for every stream at once (bench/results/
streams-gc.md). Almost none of it is garbage: the request path is written not to leave
reference cycles, so nearly everything dies by reference counting.

The schedule here:

* at start, everything built so far is collected once and frozen (never scanned again);
* automatic collections scan only the youngest generation (:data:`YOUNG_THRESHOLD` net
  allocations); what survives one waits in the older generations, which only a full pass scans;
* a full pass runs every :data:`FULL_INTERVAL_S`, the wait doubling up to
  :data:`FULL_LONGEST_S` while passes find little garbage (under :data:`MUCH_GARBAGE` objects);
* a due pass waits for a quiet moment, at most :data:`QUIET_CONNECTIONS` connections with a
  request in progress (idle keep-alive ones are not counted), because its pause grows with
  what is open.
* Memory comes first where garbage may be piling up. A due pass does not wait after a pass
  that found much garbage, nor past :data:`DEFER_LONGEST_S` since the last pass, nor once the
  heap has grown by :data:`HEAP_GROWTH_BLOCKS` allocated blocks since then (open streams' own
  objects, about 180 blocks each, 4,000 streams 0.72 million, stay under it up to about
  11,000 streams), nor once resident memory has grown by :data:`RESIDENT_GROWTH_BYTES`.
  Garbage holding large buffers (request bodies, answers) adds few blocks: allocations over
  512 bytes are not blocks (2,000 cycles holding 64 KiB each, 125 MiB, are 6,000 blocks), and
  with ``PYTHONMALLOC=malloc`` the block count is always 0.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Final

import structlog

_log = structlog.get_logger("tiergate.server")

YOUNG_THRESHOLD: Final = 1_000
# Thresholds the older generations never reach: they are scanned only by the full pass.
_NEVER: Final = 1 << 30
FULL_INTERVAL_S: Final = 10.0
FULL_LONGEST_S: Final = 160.0
QUIET_CONNECTIONS: Final = 200
DEFER_LONGEST_S: Final = 600.0
MUCH_GARBAGE: Final = 10_000
HEAP_GROWTH_BLOCKS: Final = 2_000_000
# Open streams hold about 19 KiB of resident memory each (bench/results/streams-gc.md): 4,000
# of them 75 MiB, well under this.
RESIDENT_GROWTH_BYTES: Final = 512 * 1024 * 1024
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_POLL_S: Final = 1.0


def settle_at_start() -> tuple[int, int, int]:
    """Collect once, freeze what lives, and leave only young collections automatic; returns
    the thresholds it replaced (for :func:`unsettle`)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, _NEVER, _NEVER)
    return before


def unsettle(thresholds: tuple[int, int, int]) -> None:
    """Give the thresholds back once the full passes stop (the app shut down): without it, a
    process that goes on (a test run's, after an in-process app) would never collect its older
    generations again. What was frozen stays frozen: unfrozen, each later start-up's collection
    would scan all of it again (172 against 71 ms per in-process app in a test process)."""
    gc.set_threshold(*thresholds)


def next_wait(wait_s: float, found: int) -> float:
    """The wait before the next full pass, after one that found ``found`` objects."""
    return FULL_INTERVAL_S if found >= MUCH_GARBAGE else min(2 * wait_s, FULL_LONGEST_S)


def may_run(
    since_last_s: float,
    last_found: int,
    busy_connections: int,
    grown: int,
    grown_bytes: int = 0,
) -> bool:
    """Whether a due full pass runs now, rather than waiting for a quiet moment (``grown``:
    allocated blocks gained since the last pass; ``grown_bytes``: resident memory gained)."""
    return (
        busy_connections <= QUIET_CONNECTIONS
        or last_found >= MUCH_GARBAGE
        or since_last_s >= DEFER_LONGEST_S
        or grown >= HEAP_GROWTH_BLOCKS
        or grown_bytes >= RESIDENT_GROWTH_BYTES
    )


def resident_bytes() -> int:
    """The process's resident memory (0 where ``/proc`` does not say)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


async def collect_periodically(
    busy_connections: Callable[[], int],
    clock: Callable[[], float] = time.monotonic,
    heap_blocks: Callable[[], int] = sys.getallocatedblocks,
    resident: Callable[[], int] = resident_bytes,
) -> None:
    """Run the full passes of the schedule above, forever (cancel to stop)."""
    wait = FULL_INTERVAL_S
    found = 0
    last = clock()
    blocks = heap_blocks()
    memory = resident()
    while True:
        remaining = wait - (clock() - last)
        await asyncio.sleep(remaining if remaining > 0 else _POLL_S)
        try:
            started = clock()
            if started - last < wait:
                continue
            grown, grown_bytes = heap_blocks() - blocks, resident() - memory
            if not may_run(started - last, found, busy_connections(), grown, grown_bytes):
                continue
            found = gc.collect()
            pause_s = clock() - started
            _log.debug(
                "server.gc_full_pass",
                found=found,
                pause_ms=round(pause_s * 1000, 1),
                deferred_s=round(started - last - wait, 1),
                busy_connections=busy_connections(),
            )
        except Exception:  # noqa: BLE001  # nothing else scans the older generations: go on
            _log.exception("server.gc_full_pass_failed")
            found = 0
        last = clock()
        blocks = heap_blocks()
        memory = resident()
        wait = next_wait(wait, found)
