"""A worker's heartbeat (its metrics file, which the supervisor watches to kill a worker whose
event loop stopped) depends on that event loop alone, not on the loop's shared thread pool."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.upstream.worker_share import METRICS_PUBLISH_S, GroupMetrics, WorkerRole, metrics_file
from tests.processes import patience

POOL_FILLER = 64


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
    release = threading.Event()
    busy: list[asyncio.Future[bool]] = []
    group = GroupMetrics(WorkerRole(0, 2, tmp_path), CollectorRegistry())
    path = metrics_file(tmp_path, 0)
    group.start()
    try:
        await _next_change(path, None, within_s=patience(5))  # the first beat
        # More jobs than the pool has threads (CPython: at most 32): every thread is taken.
        busy = [loop.run_in_executor(None, release.wait) for _ in range(POOL_FILLER)]
        mtime = _mtime_ns(path)
        for _ in range(2):  # two beats in a row while the pool stays taken
            mtime = await _next_change(path, mtime, within_s=3 * METRICS_PUBLISH_S)
        assert not any(f.done() for f in busy), "the pool came free: nothing was shown"
    finally:
        release.set()
        await asyncio.gather(*busy)
        await group.stop()


PASS_S = 0.5  # one pass of an overloaded event loop: thousands of streams' callbacks


async def test_the_heartbeat_lags_a_slow_loop_by_one_pass_at_most(tmp_path: Path) -> None:
    """Under overload every pass of the event loop takes long (here 0.5 s: a callback that
    blocks that long, once per pass). The heartbeat may be late by the pass it waits for, no
    more: at most 1 s + one pass (+ a pass of margin) between two rewrites (1.5 s). Written
    with a sleep, then a write whose completion the loop must pick up, then the task woken
    up, each beat waited for about four passes: at 8,000 streams on one core the file went
    5.4 s unchanged, half the watchdog's 10 s, while the loop ran."""
    loop = asyncio.get_running_loop()
    group = GroupMetrics(WorkerRole(0, 2, tmp_path), CollectorRegistry())
    path = metrics_file(tmp_path, 0)
    slow = True

    def one_slow_pass() -> None:
        time.sleep(PASS_S)  # blocks the loop (not the GIL: the writer thread runs meanwhile)
        if slow:
            loop.call_soon(one_slow_pass)

    group.start()
    try:
        await _next_change(path, None, within_s=patience(5))  # the first beat
        loop.call_soon(one_slow_pass)
        changes: list[float] = []
        mtime = _mtime_ns(path)
        while len(changes) < 4:  # sampled from this thread would need the loop: poll files
            mtime = await asyncio.to_thread(_wait_change, path, mtime, 10.0)
            changes.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        assert max(gaps) <= METRICS_PUBLISH_S + 2 * PASS_S, gaps
    finally:
        slow = False
        await group.stop()


def _wait_change(path: Path, after_ns: int | None, within_s: float) -> int | None:
    """Like :func:`_next_change`, on a thread of its own (the loop is kept busy)."""
    deadline = time.monotonic() + within_s
    while (mtime := _mtime_ns(path)) == after_ns:
        assert time.monotonic() < deadline, f"{path.name} not rewritten for {within_s:g} s"
        time.sleep(0.01)
    return mtime


BLOCKED_S = 3.0  # three beats' time


async def test_a_blocked_loop_stops_the_heartbeat(tmp_path: Path) -> None:
    """The writer thread writes only what the loop's timer asks for: while the loop is blocked
    (a call that never yields) the file is rewritten at most once (a write asked for just
    before), so the watchdog still sees the silence, though the thread itself is free."""
    group = GroupMetrics(WorkerRole(0, 2, tmp_path), CollectorRegistry())
    path = metrics_file(tmp_path, 0)
    group.start()
    try:
        await _next_change(path, None, within_s=patience(5))  # the first beat
        seen = _versions_while_blocked(path, BLOCKED_S)  # called here: it blocks the loop
        assert len(seen) <= 2, f"{len(seen) - 1} rewrites while the loop was blocked"
    finally:
        await group.stop()


def _versions_while_blocked(path: Path, seconds: float) -> set[int | None]:
    """The file's modification times seen over ``seconds`` (from a thread of its own), while
    this call, run on the loop, blocks it."""
    seen: set[int | None] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.add(_mtime_ns(path))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    time.sleep(seconds)
    stop.set()
    sampler.join()
    return seen
