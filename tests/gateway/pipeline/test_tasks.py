"""gateway/pipeline/tasks.py: background tasks stop for certain, even when a cancellation is lost.

The real case: a loop polling a real Redis through redis-py with a socket timeout (redis-py
then wraps each send in ``asyncio.wait_for``, which on Python 3.11 can drop a cancellation),
cancelled at many points of its work, and once just after a command started (lost every time).
A loop that absorbs one cancellation stands in for it where the outcome must not depend on
timing.
"""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from redis.asyncio import Redis

from gateway.limits.census import ReplicaCensus
from gateway.limits.usage import FIELDS, RedisUsageStore
from gateway.pipeline.tasks import stop_tasks
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


async def _absorbs_one_cancel(ticks: list[int]) -> None:
    """A polling loop that loses the first cancellation it gets, as wait_for can."""
    lost = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lost:
                raise
            lost = True
        ticks.append(1)


def test_a_lost_cancellation_is_asked_again() -> None:
    """One cancel and an await would wait forever here; ``stop_tasks`` ends the loop."""

    async def run() -> None:
        ticks: list[int] = []
        task = asyncio.create_task(_absorbs_one_cancel(ticks))
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done, "the stand-in lost its first cancellation"
        assert await stop_tasks(task, within_s=2.0)
        assert task.cancelled()

    asyncio.run(run())


def test_a_task_that_will_not_stop_is_given_up_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that absorbs every cancellation: ``stop_tasks`` returns ``False`` at its bound
    and says which task, so a shutdown still finishes."""

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    async def run() -> None:
        task = asyncio.create_task(stubborn(), name="stubborn")
        await asyncio.sleep(0.02)  # running: a task cancelled before its first step just ends
        loop = asyncio.get_running_loop()
        started = loop.time()
        with caplog.at_level(logging.WARNING):
            assert not await stop_tasks(task, within_s=0.3)
        assert 0.3 <= loop.time() - started < 1.0
        assert "task.stop_timed_out" in caplog.text
        assert "stubborn" in caplog.text
        task.get_coro().close()  # end it for the test's loop

    asyncio.run(run())


def test_a_task_that_failed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A background task that already died of an error: stopping it logs the error's type
    and returns, and ``None`` entries and finished tasks are fine."""

    async def dies() -> None:
        raise RuntimeError("boom")

    async def run() -> None:
        task = asyncio.create_task(dies(), name="dies")
        await asyncio.sleep(0)
        with caplog.at_level(logging.WARNING):
            assert await stop_tasks(None, task)
        assert "task.failed" in caplog.text
        assert "RuntimeError" in caplog.text

    asyncio.run(run())


def test_redis_py_loses_a_cancellation_that_comes_as_a_command_starts(
    redis_server: RedisServer,
) -> None:
    """The hazard itself, with no stand-in: a loop of commands on a pooled connection,
    cancelled in the pass its first command was sent in. redis-py's ``wait_for`` around the
    send usually returns the send's result instead of the cancellation (Python 3.11; 20 of 20
    idle tries), and the loop runs on; one cancel and an await would then wait forever. Lost or
    not (it is a race, and a loaded machine delivered it once in CI), ``stop_tasks`` ends it."""

    async def run() -> None:
        client = Redis.from_url(redis_server.url, socket_timeout=5)

        async def poll() -> None:
            while True:  # as the gateway's loops: a command, then a pause
                await client.get("a")
                await asyncio.sleep(0.001)

        try:
            await client.ping()  # pooled: the next command's first wait is its send
            task = asyncio.create_task(poll())
            await asyncio.sleep(0)  # the task sent its command in this pass
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)  # on 3.11 it usually runs on (a race)
            assert await stop_tasks(task, within_s=2.0)
            assert task.cancelled()
        finally:
            await client.aclose()

    asyncio.run(run())


def test_redis_polling_loops_stop_every_time(redis_server: RedisServer) -> None:
    """A real redis-py client with a socket timeout, polled by a loop and stopped 100 times at
    random points of its commands: every stop ends the loop within a second. (With one
    cancel and an await, this loop ran on past its cancellation within a few tries on
    Python 3.11.7.)"""

    async def poll(client: Redis) -> None:
        while True:
            await asyncio.sleep(0)
            await client.mget("a", "b")
            async with client.pipeline(transaction=True) as pipe:
                pipe.sadd("s", "x")
                pipe.smembers("s")
                await pipe.execute()

    async def run() -> None:
        client = Redis.from_url(redis_server.url, socket_timeout=5)
        rng = random.Random(7)
        loop = asyncio.get_running_loop()
        try:
            for _ in range(100):
                task = asyncio.create_task(poll(client))
                await asyncio.sleep(rng.random() * 0.002)
                started = loop.time()
                assert await stop_tasks(task, within_s=5.0)
                assert loop.time() - started < 1.0
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_census_stops_and_leaves_the_set(redis_server: RedisServer) -> None:
    """The census beats quickly, is stopped mid-beat many times, and always leaves."""

    async def run() -> None:
        client = Redis.from_url(redis_server.url, socket_timeout=5)
        rng = random.Random(11)
        try:
            for index in range(50):
                census = ReplicaCensus(client, f"t{index}:", interval_s=0.001, ttl_s=5)
                await census.start()
                await asyncio.sleep(rng.random() * 0.01)
                async with asyncio.timeout(5):
                    await census.stop()
                assert await client.zscore(census.key, census.member) is None
                assert asyncio.all_tasks() == {asyncio.current_task()}
        finally:
            await client.aclose()

    asyncio.run(run())


def test_usage_totals_survive_a_stop_during_a_flush(redis_server: RedisServer) -> None:
    """Totals added while the flusher runs every millisecond, then a stop at a random point:
    Redis holds every total (the flush in progress is finished, not cancelled)."""

    async def run() -> None:
        client = Redis.from_url(redis_server.url, socket_timeout=5)
        rng = random.Random(3)
        try:
            for round_ in range(30):
                store = RedisUsageStore(client, f"u{round_}:", flush_s=0.001)
                store.start()
                added = 0
                for _ in range(rng.randrange(20, 200)):
                    store.add(5, ("fast", "acme", "k1"), (1.0,) * len(FIELDS))
                    added += 1
                    if rng.random() < 0.2:
                        await asyncio.sleep(0)
                async with asyncio.timeout(15):
                    await store.stop()
                got = await client.hget(f"u{round_}:usage:5", "fast|acme|k1|requests")
                assert float(got or 0) == added
        finally:
            await client.aclose()

    asyncio.run(run())


def test_usage_flushes_again_after_a_restart(redis_server: RedisServer) -> None:
    """Stopped, then started again (an app started twice on one gateway, in one loop or a
    new one): the flusher sends totals on its interval again, not only at the next stop."""
    stores: list[RedisUsageStore] = []

    async def runs(count: int, expect: float) -> None:
        client = Redis.from_url(redis_server.url)
        if not stores:
            stores.append(RedisUsageStore(client, "r:", flush_s=0.01))
        store = stores[0]
        store.client = client
        try:
            for _ in range(count):
                store.start()
                store.add(5, ("fast", "acme", "k1"), (1.0,) * len(FIELDS))
                await asyncio.sleep(0.2)  # many intervals
                got = await client.hget("r:usage:5", "fast|acme|k1|requests")
                await store.stop()
                expect += 1
                assert float(got or 0) == expect
        finally:
            await client.aclose()

    asyncio.run(runs(2, 0.0))  # twice in one loop
    asyncio.run(runs(1, 2.0))  # once more in a new one


async def _absorbs(cancels: int, ticks: list[int]) -> None:
    """A polling loop that loses its first ``cancels`` cancellations."""
    lost = 0
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lost == cancels:
                raise
            lost += 1
        ticks.append(1)


def test_a_cancelled_caller_still_leaves_the_tasks_stopping() -> None:
    """The caller of ``stop_tasks`` is itself cancelled after the first ask (a shutdown cut
    short): the caller ends cancelled at once, and the task that lost the first asks still
    ends, asked again without the caller (the first version left it running for good)."""

    async def run() -> None:
        ticks: list[int] = []
        task = asyncio.create_task(_absorbs(3, ticks))
        await asyncio.sleep(0.03)
        caller = asyncio.create_task(stop_tasks(task, within_s=5.0))
        await asyncio.sleep(0.02)  # the first ask is made and lost
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert not task.done()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert done == {task}
        assert task.cancelled()

    asyncio.run(run())
