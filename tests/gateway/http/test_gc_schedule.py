"""The gateway's garbage-collection schedule (gateway/http/collector.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from litestar.testing import TestClient

from gateway.composition import create_app
from gateway.config.settings import AuthSettings, Settings
from gateway.config.tier_settings import TierSettings
from gateway.http import collector


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_at_start_only_young_collections_run_by_themselves(restore_gc: None) -> None:
    """After start-up, allocating many long-lived objects runs young collections only: the
    survivors are never scanned again until a full pass."""
    collector.settle_at_start()
    assert gc.get_freeze_count() > 0
    generations: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.callbacks.append(record)
    try:
        kept = [[i] for i in range(300_000)]  # survivors, as open streams' objects are
    finally:
        gc.callbacks.remove(record)
    assert len(kept) == 300_000
    assert generations, "no young collection ran"
    assert set(generations) == {0}


def test_the_wait_doubles_to_the_longest_while_passes_find_little() -> None:
    waits = [collector.FULL_INTERVAL_S]
    for found in [0, 5, 9_999, 0, 0, 0]:
        waits.append(collector.next_wait(waits[-1], found))
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 160.0, 160.0]
    assert collector.next_wait(160.0, collector.MUCH_GARBAGE) == collector.FULL_INTERVAL_S


def test_a_due_pass_waits_for_a_quiet_moment_but_not_forever_nor_after_much_garbage() -> None:
    busy = collector.QUIET_CONNECTIONS + 1
    grown = collector.HEAP_GROWTH_BLOCKS
    assert collector.may_run(10.0, 0, collector.QUIET_CONNECTIONS, 0)
    assert not collector.may_run(10.0, 0, busy, grown - 1)
    assert not collector.may_run(collector.DEFER_LONGEST_S - 1, 0, busy, 0)
    assert collector.may_run(collector.DEFER_LONGEST_S, 0, busy, 0)
    assert collector.may_run(10.0, collector.MUCH_GARBAGE, busy, 0)
    assert collector.may_run(10.0, 0, busy, grown)
    assert not collector.may_run(10.0, 0, busy, 0, collector.RESIDENT_GROWTH_BYTES - 1)
    assert collector.may_run(10.0, 0, busy, 0, collector.RESIDENT_GROWTH_BYTES)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.passes: list[float] = []

    def __call__(self) -> float:
        return self.now


async def _run_schedule(
    monkeypatch: pytest.MonkeyPatch,
    connections: Any,
    found: list[int],
    *,
    until_s: float,
    heap: Any = lambda now: 0,
    failing: frozenset[float] = frozenset(),
    resident: Any = lambda now: 0,
) -> list[float]:
    """The times (fake clock) at which full passes ran (or failed, at ``failing``), until
    ``until_s``."""
    clock = _Clock()
    results = iter(found)

    async def sleep(seconds: float) -> None:
        assert seconds > 0
        clock.now += seconds
        if clock.now > until_s:
            raise asyncio.CancelledError

    def collect() -> int:
        clock.passes.append(clock.now)
        if clock.now in failing:
            raise RuntimeError("a collector callback's bug")
        return next(results, 0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(gc, "collect", collect)
    with pytest.raises(asyncio.CancelledError):
        await collector.collect_periodically(
            lambda: connections(clock.now),
            clock,
            lambda: heap(clock.now),
            lambda: resident(clock.now),
        )
    return clock.passes


async def test_passes_back_off_while_quiet_and_finding_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = await _run_schedule(monkeypatch, lambda now: 0, [], until_s=700)
    assert passes == [10, 30, 70, 150, 310, 470, 630]


async def test_a_busy_server_gets_its_pass_at_the_first_quiet_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4,000 connections open from 5 s to 47.5 s: the pass due at 10 s runs at the first poll
    after they close, and the next one 20 s later."""

    def connections(now: float) -> int:
        return 4_000 if 5 <= now < 47.5 else 3

    passes = await _run_schedule(monkeypatch, connections, [], until_s=70)
    assert passes == [48, 68]


async def test_a_server_never_quiet_gets_a_pass_every_ten_minutes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = await _run_schedule(monkeypatch, lambda now: 4_000, [], until_s=1_900)
    assert passes == [600, 1_200, 1_800]


async def test_after_much_garbage_passes_do_not_wait_for_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = [collector.MUCH_GARBAGE, collector.MUCH_GARBAGE, 0]
    passes = await _run_schedule(monkeypatch, lambda now: 4_000, found, until_s=700)
    assert passes == [600, 610, 620]


async def test_a_growing_heap_gets_its_pass_while_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy throughout, the heap growing 100,000 blocks a second: a due pass runs once it has
    grown by the limit since the last pass (20 s), not ten minutes later."""
    passes = await _run_schedule(
        monkeypatch, lambda now: 4_000, [], until_s=50, heap=lambda now: int(now * 100_000)
    )
    assert passes == [20, 40]


def test_the_heap_measure_counts_garbage_waiting_for_a_pass(restore_gc: None) -> None:
    """What the schedule reads grows with garbage cycles left for a full pass, and falls back
    once one ran: the signal that keeps a busy server from piling them up."""
    collector.settle_at_start()
    before = sys.getallocatedblocks()
    kept = []
    for _ in range(50_000):  # alive through young collections, as a request's objects are
        cycle: list[Any] = []
        cycle.append(cycle)
        kept.append(cycle)
    del cycle, kept  # now garbage only a full pass finds
    grown = sys.getallocatedblocks() - before
    assert grown >= 40_000
    gc.collect()
    assert sys.getallocatedblocks() - before < grown / 10


async def test_a_failed_pass_is_logged_and_the_schedule_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing else scans the older generations: a pass that raises must not end the task (an
    unretrieved exception in a task nobody awaits is not even logged)."""
    with structlog.testing.capture_logs() as logs:
        passes = await _run_schedule(
            monkeypatch, lambda now: 0, [], until_s=100, failing=frozenset({10.0})
        )
    assert passes == [10, 30, 70]
    failed = [log["event"] for log in logs if log["log_level"] == "error"]
    assert failed == ["server.gc_full_pass_failed"]


def test_an_app_gives_the_collector_back_when_it_shuts_down(restore_gc: None) -> None:
    """An app served in-process (the test client) gives the automatic collections of the older
    generations back when it shuts down (what it froze stays frozen)."""
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    nowhere = "http://127.0.0.1:9"
    settings = Settings(
        tiers={
            "fast": TierSettings(model="m", replicas=[nowhere]),
            "precise": TierSettings(model="p", replicas=[nowhere]),
        },
        auth=AuthSettings(enabled=False),
    )
    with TestClient(app=create_app(settings)):
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 1 << 30, 1 << 30)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)


async def test_a_busy_server_collects_real_garbage_cycles_once_the_heap_grows_by_the_limit(
    monkeypatch: pytest.MonkeyPatch, restore_gc: None
) -> None:
    """The real collector and heap: a server busy throughout (4,000 connections) makes no
    garbage for 30 s, then 20,000 reference cycles a second that live through young
    collections, as request objects do. The pass due at 10 s waits for a quiet moment until the
    heap has grown by the limit (lowered here to 200,000 blocks, about 100,000 cycles), then
    frees them, long before the ten minutes a busy server may otherwise wait."""
    monkeypatch.setattr(collector, "HEAP_GROWTH_BLOCKS", 200_000)
    collector.settle_at_start()
    clock = _Clock()
    full: list[tuple[float, int]] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append((clock.now, info["collected"]))

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 45:
            raise asyncio.CancelledError
        if clock.now > 30:
            _garbage_cycles(20_000)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    gc.callbacks.append(record)
    try:
        start = sys.getallocatedblocks()
        with pytest.raises(asyncio.CancelledError):
            await collector.collect_periodically(lambda: 4_000, clock)
        after = sys.getallocatedblocks()
    finally:
        gc.callbacks.remove(record)
    assert full, "no full pass while busy"
    at, collected = full[0]
    assert 30 < at <= 42
    assert collected >= 100_000
    assert after - start < 200_000  # what the last pass left behind


def _garbage_cycles(count: int, holding: int = 0) -> None:
    kept = []
    for _ in range(count):  # alive through young collections, as a request's objects are
        cycle: list[Any] = [b"x" * holding] if holding else []
        cycle.append(cycle)
        kept.append(cycle)
    gc.collect(0)  # one while they live, whatever the count (few objects, large ones)


async def test_garbage_holding_large_buffers_is_collected_once_resident_memory_grows_by_the_limit(
    monkeypatch: pytest.MonkeyPatch, restore_gc: None
) -> None:
    """Busy throughout; from 30 s, 200 reference cycles a second that each hold a 64 KiB buffer
    (a request body, say): 12.5 MiB a second but 600 allocated blocks, which would keep the
    heap's block limit out of reach for hours. The resident memory limit (lowered here to 64
    MiB) gets the pass due at 10 s run at the first poll after the process grew by it (garbage
    may first fill memory the process freed before: the limit is on growth)."""
    limit = 64 * 1024 * 1024
    monkeypatch.setattr(collector, "RESIDENT_GROWTH_BYTES", limit)
    collector.settle_at_start()
    clock = _Clock()
    full: list[tuple[float, int]] = []
    resident: list[tuple[float, int]] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append((clock.now, info["collected"]))

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 60:
            raise asyncio.CancelledError
        if clock.now > 30:
            _garbage_cycles(200, holding=64 * 1024)
        resident.append((clock.now, collector.resident_bytes()))

    monkeypatch.setattr(asyncio, "sleep", sleep)
    gc.callbacks.append(record)
    try:
        start = collector.resident_bytes()
        with pytest.raises(asyncio.CancelledError):
            await collector.collect_periodically(lambda: 4_000, clock)
    finally:
        gc.callbacks.remove(record)
    assert full, "no full pass while busy"
    at, collected = full[0]
    grown_at = next(now for now, size in resident if size - start >= limit)
    assert 30 < at <= grown_at + 1
    assert collected >= 5 * 200
