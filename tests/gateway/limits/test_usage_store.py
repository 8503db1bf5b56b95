"""gateway/limits/usage.py's Redis store: totals reach Redis once, whatever Redis does.

A real redis-server. To lose an answer after Redis has applied a batch, a proxy passes the
commands on and swallows the answers; to keep a batch in flight, another client runs a script
that keeps the server busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
import structlog.testing
from redis.asyncio import Redis

from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from gateway.limits.usage import FIELDS, RedisUsageStore
from tests.processes import free_port
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

ROW = ("fast", "acme", "k1")
BUSY = """
local start = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > tonumber(ARGV[1])
return 1
"""


async def _requests(store: RedisUsageStore, hour: int = 5) -> float:
    rows = await store.rows(range(hour, hour + 1))
    return rows.get(ROW, [0.0] * len(FIELDS))[0]


class _Proxy:
    """A TCP proxy to Redis; subclasses decide, per connection, what passes and when."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def pass_up(self, data: bytes, seen: set[str]) -> bool:
        """Whether ``data`` (client to Redis) passes; ``seen`` is the connection's state."""
        return True

    async def pass_down(self, data: bytes, seen: set[str]) -> bool:
        """Whether ``data`` (Redis to client) passes."""
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        seen: set[str] = set()

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, up: bool) -> None:
            while data := await source.read(65536):
                if await (self.pass_up(data, seen) if up else self.pass_down(data, seen)):
                    sink.write(data)

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        except OSError:
            pass
        finally:
            writer.close()
            up_writer.close()


class _ReplyEater(_Proxy):
    """While ``eating``, swallows Redis' answers on a connection from the moment usage totals
    are sent on it (the batch still reaches Redis and runs; the connection's handshake before
    it is answered): an answer lost on the way back."""

    eating = True

    async def pass_up(self, data: bytes, seen: set[str]) -> bool:
        if self.eating and b"u:usage:" in data:
            seen.add("batch")
        return True

    async def pass_down(self, data: bytes, seen: set[str]) -> bool:
        return "batch" not in seen


async def _counted(admin: Redis) -> float:
    """The requests Redis holds for ``ROW`` in hour 5."""
    return float(await admin.hget("u:usage:5", "fast|acme|k1|requests") or 0)


@contextlib.asynccontextmanager
async def _behind_eater(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[_ReplyEater, RedisUsageStore, Redis]]:
    """A store whose client talks through a :class:`_ReplyEater` (answers swallowed from its
    first totals on), and a client straight to Redis; all closed afterwards."""
    eater = _ReplyEater(redis_server.port)
    client = open_redis(RedisSettings(url=await eater.start(), socket_timeout_s=0.2))
    admin = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
    try:
        yield eater, RedisUsageStore(client, "u:"), admin
    finally:
        await client.aclose()
        await admin.aclose()
        await eater.stop()


def test_a_batch_whose_answer_was_lost_is_counted_once(redis_server: RedisServer) -> None:
    """Redis applies a batch and its answer is lost on the way back (and so are the answers to
    redis-py's own retries of it); the store sends it again, since it cannot know, and Redis
    counts it once. New totals go in a batch of their own."""

    async def run() -> None:
        async with _behind_eater(redis_server) as (eater, store, admin):
            store.add(5, ROW, (3.0,) * len(FIELDS))
            await store.flush()  # applied (perhaps more than once by redis-py), not answered
            assert await _counted(admin) == 3.0
            eater.eating = False
            store.add(5, ROW, (1.0,) * len(FIELDS))
            await store.flush()  # the unsure batch again (a no-op), then the new one
            assert await _counted(admin) == 4.0
            assert await _requests(store) == 4.0

    asyncio.run(run())


def test_totals_wait_out_an_outage_and_arrive_once(redis_server: RedisServer) -> None:
    """Redis down for a few flushes: nothing is lost, nothing counted twice, and the report
    read during the outage's end includes what is still on its way."""

    async def run() -> None:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.2))
        store = RedisUsageStore(client, "u:")
        try:
            store.add(5, ROW, (1.0,) * len(FIELDS))
            redis_server.kill()
            for _ in range(3):
                store.add(5, ROW, (1.0,) * len(FIELDS))
                await store.flush()
            redis_server.restart()
            assert await _requests(store) == 4.0  # pending and unsure, nothing in Redis yet
            await store.flush()
            await store.flush()
            assert await _requests(store) == 4.0
            admin = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
            try:
                assert await _counted(admin) == 4.0
                assert await admin.ttl("u:usage:5") > 31 * 86400
            finally:
                await admin.aclose()
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_batch_cancelled_in_flight_is_sent_again_once(redis_server: RedisServer) -> None:
    """The flusher cancelled while its batch is out (a shutdown past its wait): the batch is
    kept as unsure and the next flush settles it, counted once."""

    async def run() -> None:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        admin = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        store = RedisUsageStore(client, "u:")
        try:
            store.add(5, ROW, (2.0,) * len(FIELDS))
            busy = asyncio.ensure_future(admin.eval(BUSY, 0, 300_000))
            await asyncio.sleep(0.05)
            flushing = asyncio.create_task(store.flush())
            await asyncio.sleep(0.1)
            flushing.cancel()
            await asyncio.gather(flushing, return_exceptions=True)
            await busy
            await asyncio.sleep(0.1)
            await store.flush()
            assert await _counted(admin) == 2.0
        finally:
            await client.aclose()
            await admin.aclose()

    asyncio.run(run())


def test_the_record_of_a_counted_batch_lasts_as_long_as_its_totals(
    redis_server: RedisServer,
) -> None:
    """A batch whose answer was lost waits as long as Redis stays out of reach (a partition,
    or a Redis with persistence down for hours): whatever tells Redis that it counted the
    batch must outlive the totals it guards, or the batch sent again is counted twice."""

    async def run() -> None:
        async with _behind_eater(redis_server) as (_, store, admin):
            store.add(5, ROW, (3.0,) * len(FIELDS))
            await store.flush()  # applied, not answered
            marks = [key async for key in admin.scan_iter("u:*") if key != b"u:usage:5"]
            assert marks
            hour_ttl = await admin.ttl("u:usage:5")
            for mark in marks:
                assert await admin.ttl(mark) >= hour_ttl

    asyncio.run(run())


def test_a_total_that_is_not_a_number_costs_no_other_total(redis_server: RedisServer) -> None:
    """A NaN or infinite value (a price of inf times zero tokens) makes Redis refuse its
    increment halfway through a batch; the other rows of the batch still arrive, once."""

    async def run() -> None:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        store = RedisUsageStore(client, "u:")
        try:
            store.add(5, ("fast", "acme", "k0"), (1.0, 1.0, 1.0, float("nan"), float("inf")))
            store.add(5, ROW, (1.0,) * len(FIELDS))
            for _ in range(3):
                await store.flush()
            row = await client.hgetall("u:usage:5")
            assert float(row[b"fast|acme|k1|cost"]) == 1.0
            assert float(row[b"fast|acme|k0|requests"]) == 1.0
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("spoil", ["field", "key"])
def test_an_increment_redis_refuses_costs_no_other_total_and_is_logged(
    redis_server: RedisServer, spoil: str
) -> None:
    """A total Redis cannot add to (its field holds text, or its hour's key is a string that
    someone else wrote): the batch's other totals still arrive, once, and an error line names
    what was refused. It used to stop the batch's script at that increment, leaving the rest
    of the batch uncounted, and the batch, already marked as counted, was never sent again."""

    async def run() -> None:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        store = RedisUsageStore(client, "u:")
        try:
            if spoil == "field":
                await client.hset("u:usage:5", "fast|acme|k0|requests", "text")
            else:
                await client.set("u:usage:4", "not a hash")
            store.add(4, ("fast", "acme", "k0"), (1.0,) * len(FIELDS))
            store.add(5, ("fast", "acme", "k0"), (1.0,) * len(FIELDS))
            store.add(5, ROW, (2.0,) * len(FIELDS))
            with structlog.testing.capture_logs() as logs:
                for _ in range(3):
                    await store.flush()
            row = await client.hgetall("u:usage:5")
            assert float(row[b"fast|acme|k1|requests"]) == 2.0
            assert float(row[b"fast|acme|k1|baseline_cost"]) == 2.0
            assert float(row[b"fast|acme|k0|output_tokens"]) == 1.0
            refused = [e for e in logs if e["event"] == "usage.increments_refused"]
            assert len(refused) == 1
            assert refused[0]["log_level"] == "error"
            expected = 1 if spoil == "field" else len(FIELDS)
            assert refused[0]["count"] == expected
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.slow  # 10 s: make test-all and CI
def test_a_large_backlog_does_not_block_redis(redis_server: RedisServer) -> None:
    """Hours of totals kept through an outage go out in pieces: no script holds Redis (and
    with it every gateway's rate limiter) past the request path's Redis timeout of 0.25 s."""

    async def run() -> None:
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=30))
        store = RedisUsageStore(client, "u:")
        try:
            await client.config_set("slowlog-log-slower-than", 250_000)
            await client.slowlog_reset()
            for index in range(60_000):
                store.add(5 + index % 24, ("fast", f"t{index}", "k"), (1.0,) * len(FIELDS))
            await store.flush()
            slow = await client.slowlog_get(10)
            assert [entry["duration"] for entry in slow] == []
            rows = await store.rows(range(5, 5 + 24))
            assert len(rows) == 60_000
            assert store.pending.hours == {}
        finally:
            await client.config_set("slowlog-log-slower-than", 10_000)
            await client.aclose()

    asyncio.run(run())


def test_the_report_counts_an_unanswered_batch_once(redis_server: RedisServer) -> None:
    """While a batch's answer is missing, the report adds the batch only if Redis has not
    counted it: a batch applied but unanswered is not reported twice."""

    async def run() -> None:
        async with _behind_eater(redis_server) as (_, store, admin):
            store.add(5, ROW, (3.0,) * len(FIELDS))
            await store.flush()  # applied, not answered
            store.client = admin  # read straight from Redis
            assert await _requests(store) == 3.0

    asyncio.run(run())


class _ReadDelayer(_Proxy):
    """Holds back, until :attr:`release` is set (at most ``hold_s``), the report's read (a
    write that opens a transaction; ``hold="request"``) or the answers on a connection once it
    has sent one (``hold="answer"``), and passes everything else on at once: the flusher's
    batch then reaches Redis before the read, or its answer comes back before the read's.
    :attr:`read_sent` is set once the read has reached the proxy."""

    def __init__(self, redis_port: int, hold: str = "request", hold_s: float = 30.0) -> None:
        super().__init__(redis_port)
        self.hold = hold
        self.hold_s = hold_s
        self.release = asyncio.Event()
        self.read_sent = asyncio.Event()

    async def _held(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), self.hold_s)

    async def pass_up(self, data: bytes, seen: set[str]) -> bool:
        if b"MULTI" in data:
            seen.add("read")
            self.read_sent.set()
            if self.hold == "request":
                await self._held()
        return True

    async def pass_down(self, data: bytes, seen: set[str]) -> bool:
        if "read" in seen and self.hold == "answer":
            await self._held()
        return True


@pytest.mark.parametrize("hold", ["request", "answer"])
def test_a_flush_during_a_report_is_counted_once(redis_server: RedisServer, hold: str) -> None:
    """A report begins and the flusher sends, while the report is out, the totals it would
    have read from memory. ``request``: Redis counts the batch before the report's read
    arrives (the first version summed memory before the read and reported 6). ``answer``: the
    read reaches Redis first and its answer comes back after the batch is confirmed (summing
    memory after the read without the batches confirmed meanwhile would report 0). Once
    either way."""

    async def run() -> None:
        delayer = _ReadDelayer(redis_server.port, hold=hold)
        client = open_redis(RedisSettings(url=await delayer.start(), socket_timeout_s=60))
        admin = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=5))
        try:
            store = RedisUsageStore(client, "u:")
            store.add(5, ROW, (3.0,) * len(FIELDS))
            report = asyncio.create_task(_requests(store))
            await asyncio.wait_for(delayer.read_sent.wait(), 30)  # the read (or its answer) held
            await store.flush()
            assert await _counted(admin) == 3.0
            assert not report.done()
            delayer.release.set()
            assert await report == 3.0
            assert await _requests(store) == 3.0
        finally:
            await client.aclose()
            await admin.aclose()
            await delayer.stop()

    asyncio.run(run())


def test_totals_redis_never_took_are_named_at_stop() -> None:
    """Redis out of reach when the gateway stops: the totals it never confirmed are not
    dropped in silence; one error sums them (distinct rows and every field) for the
    operator, the batch that found Redis gone and what came after it alike (the same row in
    both counts once: the first version said 3 rows here)."""

    async def run() -> list[MutableMapping[str, Any]]:
        client = open_redis(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0"))
        store = RedisUsageStore(client, "u:", flush_s=0.05)
        store.add(5, ROW, (0.5, 5.0, 10.0, 0.25, 0.75))
        await store.flush()  # Redis is not there: the batch waits, unconfirmed
        store.start()
        store.add(5, ROW, (0.5, 5.0, 10.0, 0.25, 0.75))
        store.add(6, ("precise", "acme", "k2"), (2.0, 30.0, 40.0, 2.0, 2.0))
        with structlog.testing.capture_logs() as logs:
            await store.stop()
        await client.aclose()
        return logs

    logs = asyncio.run(run())
    lost = [entry for entry in logs if entry["event"] == "usage.unsent_at_stop"]
    assert lost == [
        {
            "event": "usage.unsent_at_stop",
            "log_level": "error",
            "rows": 2,
            "requests": 3.0,
            "input_tokens": 40.0,
            "output_tokens": 60.0,
            "cost": 2.5,
            "baseline_cost": 3.5,
        }
    ]


def test_totals_are_named_when_the_stop_itself_is_cut_short() -> None:
    """Redis accepts the connection and never answers; the stop waiting on it is cancelled
    (a shutdown with its own deadline): the unsent totals are still summed in the error line
    (the first version logged nothing then)."""

    async def run() -> list[MutableMapping[str, Any]]:
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes connections; nothing ever answers
        port = silent.getsockname()[1]
        client = open_redis(RedisSettings(url=f"redis://127.0.0.1:{port}/0", socket_timeout_s=5))
        store = RedisUsageStore(client, "u:", flush_s=0.05)
        store.add(5, ROW, (1.0, 10.0, 20.0, 0.5, 1.5))
        try:
            with structlog.testing.capture_logs() as logs:
                stopping = asyncio.create_task(store.stop())
                await asyncio.sleep(0.3)  # the final flush waits on the silent server
                assert not stopping.done()
                stopping.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await stopping
        finally:
            await client.aclose()
            silent.close()
        return logs

    logs = asyncio.run(run())
    lost = [entry for entry in logs if entry["event"] == "usage.unsent_at_stop"]
    assert [(entry["rows"], entry["requests"], entry["cost"]) for entry in lost] == [(1, 1.0, 0.5)]
