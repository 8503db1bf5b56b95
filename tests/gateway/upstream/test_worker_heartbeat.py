"""A worker's heartbeat (its metrics file, which the supervisor watches to kill a worker whose
event loop stopped) depends on that event loop alone, not on the loop's shared thread pool."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.upstream.worker_share import METRICS_PUBLISH_S, GroupMetrics, WorkerRole, metrics_file
from tests.processes import patience


def _mtime_ns(path: Path) -> int | None:
    """The file's modification time; None while it does not exist."""
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


async def _next_change(path: Path, after_ns: int | None, within_s: float) -> int | None:
    """The file's next modification time after ``after_ns``; fails after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (mtime := _mtime_ns(path)) == after_ns:
        assert time.monotonic() < deadline, f"{path.name} not rewritten for {within_s:g} s"
        await asyncio.sleep(0.05)
    return mtime


async def test_the_heartbeat_goes_on_while_the_default_thread_pool_is_busy(
    tmp_path: Path,
) -> None:
    """Every thread of the event loop's default pool is taken (slow DNS lookups of upstream or
    media hosts, file reads: ``loop.getaddrinfo`` and ``asyncio.to_thread`` share it), while
    the loop itself runs freely: the metrics file is still rewritten every second. It was
    written through that pool, so it stopped until a thread came free, and after
    ``server.worker_stall_s`` the supervisor killed a worker serving its streams."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(pool)
    release = threading.Event()
    busy: list[asyncio.Future[bool]] = []
    group = GroupMetrics(WorkerRole(0, 2, tmp_path), CollectorRegistry())
    path = metrics_file(tmp_path, 0)
    group.start()
    try:
        await _next_change(path, None, within_s=patience(5))  # the first beat
        busy = [loop.run_in_executor(None, release.wait) for _ in range(2)]
        mtime = _mtime_ns(path)
        for _ in range(2):  # two beats in a row while the pool stays taken
            mtime = await _next_change(path, mtime, within_s=3 * METRICS_PUBLISH_S)
        assert not any(f.done() for f in busy), "the pool came free: nothing was shown"
    finally:
        release.set()
        await asyncio.gather(*busy)
        await group.stop()
        pool.shutdown()
