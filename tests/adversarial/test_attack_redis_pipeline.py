"""Hostile tests of the limiter's pipelined Redis connection, against real redis-servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from gateway.limits.budget_stores import RedisBudgetStore, Windows
from gateway.limits.limiter_redis import RateLimitBackendUnavailable, RedisRateLimiter
from gateway.limits.redis import ScriptPipeline
from policies.ratelimit import Limit, LimitSpec
from tests.processes import patience
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """SIGSTOP the server for the block (a stalled Redis: it accepts, reads nothing)."""
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def limiter_on(url: str, timeout_s: float = 2.0) -> AsyncIterator[RedisRateLimiter]:
    client = open_redis(RedisSettings(url=url, socket_timeout_s=timeout_s))
    limiter = RedisRateLimiter(client, lease_s=600)
    try:
        yield limiter
    finally:
        await limiter.aclose()
        await client.aclose()


async def test_cancelled_admission_does_not_keep_its_slot() -> None:
    """A caller that gives up on an admission in flight must not hold the key's slot."""
    spec = LimitSpec(concurrency=1)
    with RedisServer() as server:
        async with limiter_on(server.url) as limiter:
            assert (await limiter.acquire("k", spec, 0, "warm")).exceeded is None
            await limiter.release("k", spec, 0, "warm")
            with stopped(server), pytest.raises(TimeoutError):
                await asyncio.wait_for(limiter.acquire("k", spec, 0, "gone"), 0.2)
            await asyncio.sleep(0.1)
            verdict = await limiter.acquire("k", spec, 0, "next")
            assert verdict.exceeded is None


async def test_a_slot_whose_release_failed_is_freed_once_redis_answers() -> None:
    """A settlement Redis did not answer frees its slot once Redis is back, not after the lease."""
    spec = LimitSpec(concurrency=1)
    with RedisServer() as server:
        async with ReplyDropper(server.port) as proxy, limiter_on(proxy.url, 0.3) as limiter:
            assert (await limiter.acquire("k", spec, 0, "held")).exceeded is None
            proxy.swallowing = True  # Redis unreachable: the release never arrives
            with pytest.raises(RateLimitBackendUnavailable):
                await limiter.release("k", spec, 0, "held")
            await asyncio.sleep(0.6)  # a background retry fails too
            proxy.swallowing = False
            await asyncio.sleep(1.5)  # retried every 0.5 s: answered within about a second
            verdict = await limiter.acquire("k", spec, 0, "next")
            assert verdict.exceeded is None, "the slot stays held for its whole lease (600 s)"


class ReplyDropper:
    """A TCP proxy to Redis that, when armed, lets the next command through but cuts the
    connection instead of passing its reply on (the server ran it; the client cannot know).

    While ``swallowing``, commands are read and dropped: they never reach the server.
    """

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.armed = False
        self.swallowing = False
        self.server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._done: set[asyncio.Event] = set()

    async def __aenter__(self) -> ReplyDropper:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self._open:
            writer.transport.abort()
        for done in self._done:
            await done.wait()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.Event()
        self._done.add(done)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        self._open.update((writer, up_writer))

        async def upstream() -> None:
            while data := await reader.read(65536):
                if not self.swallowing:
                    up_writer.write(data)
            up_writer.transport.abort()

        pump = asyncio.ensure_future(upstream())
        try:
            while data := await up_reader.read(65536):
                if self.armed:
                    self.armed = False
                    writer.transport.abort()
                    break
                writer.write(data)
        except ConnectionError:
            pass
        finally:
            up_writer.transport.abort()
            writer.transport.abort()
            with contextlib.suppress(ConnectionError):
                await pump
            done.set()


async def test_a_refund_whose_reply_was_lost_is_not_given_twice() -> None:
    """A settlement the server applied but whose reply never came must not be re-sent."""
    spec = LimitSpec(tpm=1000)
    with RedisServer() as server:
        async with ReplyDropper(server.port) as proxy, limiter_on(proxy.url) as limiter:
            assert (await limiter.acquire("k", spec, 400, "")).exceeded is None
            assert (await limiter.acquire("k", spec, 400, "")).exceeded is None
            proxy.armed = True
            with contextlib.suppress(RateLimitBackendUnavailable):
                await limiter.release("k", spec, -400, "")
            verdict = await limiter.acquire("k", spec, 700, "")
            assert verdict.exceeded is Limit.TOKENS  # 400 still charged: 400 + 700 > 1000


async def test_cancelled_budget_reservation_is_given_back() -> None:
    """A reservation whose caller gave up must not stay charged for the rest of the day."""
    with RedisServer() as server:
        client = open_redis(RedisSettings(url=server.url, socket_timeout_s=2.0))
        store = RedisBudgetStore(client, "t:")
        windows = Windows.at(time.time())
        try:
            assert (await store.reserve("k", windows, 10.0, None, 1.0))[0] is None
            with stopped(server), pytest.raises(TimeoutError):
                await asyncio.wait_for(store.reserve("k", windows, 10.0, None, 8.0), 0.2)
            await asyncio.sleep(0.1)
            refused, spent = await store.reserve("k", windows, 10.0, None, 8.0)
            assert refused is None, spent  # 1 + 8 <= 10: the cancelled 8 was given back
        finally:
            await store.aclose()
            await client.aclose()


async def test_shutdown_waits_for_settlements_already_written() -> None:
    """Closing while a settlement is in flight (Redis slow) waits for its reply, bounded."""
    spec = LimitSpec(concurrency=1)
    with RedisServer() as server:
        client = open_redis(RedisSettings(url=server.url, socket_timeout_s=2.0))
        limiter = RedisRateLimiter(client, lease_s=600)
        try:
            assert (await limiter.acquire("k", spec, 0, "a")).exceeded is None
            with stopped(server):
                settling = asyncio.ensure_future(limiter.release("k", spec, 0, "a", lazy=True))
                await asyncio.sleep(0.05)  # its linger is over: written, not answered
                resume = threading.Timer(0.3, os.kill, (server.pid, signal.SIGCONT))
                resume.start()
                started = time.monotonic()
                await limiter.aclose()
                closed_s = time.monotonic() - started
                resume.join()
            assert 0.2 < closed_s < 2.0
            assert settling.done()
            assert settling.exception() is None  # answered, not cut off by the close
        finally:
            await client.aclose()


async def test_cancelled_callers_do_not_shift_the_replies_of_others() -> None:
    """Hundreds in flight on one connection, a third of them given up: each reply still
    reaches its own caller."""
    with RedisServer() as server:
        client = open_redis(RedisSettings(url=server.url, socket_timeout_s=2.0))
        pipe = ScriptPipeline(client)
        try:
            assert await pipe.command("PING") == b"PONG"
            with stopped(server):
                calls = [asyncio.ensure_future(pipe.command("ECHO", i)) for i in range(300)]
                await asyncio.sleep(0.05)
                for call in calls[::3]:
                    call.cancel()
            results = await asyncio.gather(*calls, return_exceptions=True)
            for i, result in enumerate(results):
                if i % 3:
                    assert result == str(i).encode()
                else:
                    assert isinstance(result, asyncio.CancelledError)
            assert await pipe.command("ECHO", "after") == b"after"
        finally:
            await pipe.aclose()
            await client.aclose()


async def test_two_replicas_never_admit_more_than_the_limits() -> None:
    """Two pipelined connections (two replicas), 200 concurrent admissions each."""
    spec = LimitSpec(rpm=50, concurrency=7)
    with RedisServer() as server:
        async with limiter_on(server.url) as one, limiter_on(server.url) as two:
            calls = [
                limiter.acquire("k", spec, 0, f"{n}-{i}")
                for i in range(200)
                for n, limiter in enumerate((one, two))
            ]
            verdicts = await asyncio.gather(*calls)
            assert sum(v.exceeded is None for v in verdicts) == 7
            # Everything settles, lazily, on both replicas; the frees reach the other one.
            await asyncio.gather(
                *(
                    limiter.release("k", spec, 0, f"{n}-{i}", lazy=True)
                    for i in range(200)
                    for n, limiter in enumerate((one, two))
                )
            )
            more = await asyncio.gather(*(two.acquire("k", spec, 0, f"x{i}") for i in range(60)))
            assert sum(v.exceeded is None for v in more) == 7  # slots free, rpm 50-7 left


async def test_admission_that_timed_out_does_not_keep_its_slot() -> None:
    """Redis stalls longer than the timeout, then runs the admission it had not read: the
    slot must not stay taken for the lease (a key of concurrency 1 would be shut out)."""
    spec = LimitSpec(concurrency=1)
    with RedisServer() as server:
        async with limiter_on(server.url, timeout_s=0.2) as limiter:
            assert (await limiter.acquire("k", spec, 0, "warm")).exceeded is None
            await limiter.release("k", spec, 0, "warm")
            with stopped(server), pytest.raises(RateLimitBackendUnavailable):
                await limiter.acquire("k", spec, 0, "late")
            deadline = time.monotonic() + patience(5.0)
            while (await limiter.acquire("k", spec, 0, "probe")).exceeded is not None:
                assert time.monotonic() < deadline, "the late admission kept the slot"
                await asyncio.sleep(0.1)
            await limiter.release("k", spec, 0, "probe")
            await asyncio.sleep(1.5)  # every retry of the freeing is over: still free
            assert (await limiter.acquire("k", spec, 0, "next")).exceeded is None
