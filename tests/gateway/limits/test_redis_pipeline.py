"""The limiter's pipelined Redis connection, against a real redis-server (and a mute one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from gateway.limits.limiter_redis import RedisRateLimiter
from gateway.limits.redis import LuaScript, ScriptPipeline, pack, script_runner
from policies.ratelimit import LimitSpec
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]

ECHO = LuaScript("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}", keys=1, args=2)


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A gateway-configured redis-py client (its pool is what the pipeline reads settings of)."""
    client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
    yield client
    await client.aclose()


@pytest.fixture
async def pipe(client: Redis) -> AsyncIterator[ScriptPipeline]:
    """A pipeline on the test server."""
    assert ScriptPipeline.supports(client)
    pipeline = ScriptPipeline(client, linger_s=0.005)
    yield pipeline
    await pipeline.aclose()


async def test_every_reply_type(pipe: ScriptPipeline, client: Redis) -> None:
    """Integers, bulk strings (large ones across reads), nil, arrays, status and errors."""
    big = b"x" * 1_000_000
    assert await pipe.command("SET", "p:big", big) == b"OK"
    assert await pipe.command("GET", "p:big") == big
    assert await pipe.command("GET", "p:missing") is None
    assert await pipe.command("RPUSH", "p:list", "a", 2, 1.5) == 3
    assert await pipe.command("LRANGE", "p:list", 0, -1) == [b"a", b"2", b"1.5"]
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await pipe.command("INCR", "p:list")
    assert await pipe.run(ECHO, ["p:k"], ["é", 41]) == [b"p:k", "é".encode(), 42]
    await client.delete("p:big", "p:list")


async def test_many_callers_share_one_connection_in_order(pipe: ScriptPipeline) -> None:
    """Concurrent commands are pipelined and each caller gets its own reply."""
    replies = await asyncio.gather(*(pipe.command("INCR", "p:n") for _ in range(200)))
    assert sorted(replies) == list(range(1, 201))
    assert await pipe.command("CLIENT", "ID") == await pipe.command("CLIENT", "ID")
    await pipe.command("DEL", "p:n")


async def test_commands_of_one_loop_pass_go_out_together_in_order(pipe: ScriptPipeline) -> None:
    """The first command of a pass is written at once; the rest follow at its end, in order."""
    calls = [pipe.command("SET", "p:pass", 1), pipe.command("INCR", "p:pass")]
    calls += [pipe.command("INCR", "p:pass"), pipe.command("GET", "p:pass")]
    assert await asyncio.gather(*calls) == [b"OK", 2, 3, b"3"]
    await pipe.command("DEL", "p:pass")


async def test_lazy_command_goes_before_the_next_one(pipe: ScriptPipeline) -> None:
    """A lazy command is held back, then written with (and before) the next eager command."""
    held = asyncio.ensure_future(pipe.command("SET", "p:lazy", "1", lazy=True))
    await asyncio.sleep(0)
    assert not held.done()
    assert await pipe.command("GET", "p:lazy") == b"1"
    assert held.done()
    assert held.result() == b"OK"
    await pipe.command("DEL", "p:lazy")


async def test_lazy_command_alone_goes_after_its_linger(pipe: ScriptPipeline) -> None:
    """With no eager command to ride on, a lazy one is sent after ``linger_s``."""
    started = time.monotonic()
    assert await pipe.command("SET", "p:alone", "1", lazy=True) == b"OK"
    assert 0.004 <= time.monotonic() - started < 0.5
    await pipe.command("DEL", "p:alone")


async def test_close_sends_what_is_held_back(client: Redis) -> None:
    """Shutdown writes the lazy commands still waiting and waits for their replies."""
    pipeline = ScriptPipeline(client, linger_s=60.0)
    held = asyncio.ensure_future(pipeline.command("SET", "p:closing", "1", lazy=True))
    await asyncio.sleep(0)
    await pipeline.aclose()
    assert held.result() == b"OK"
    assert await client.get("p:closing") == b"1"
    await client.delete("p:closing")


async def test_forgotten_script_is_sent_again(pipe: ScriptPipeline, client: Redis) -> None:
    """After SCRIPT FLUSH (or a restart) the script runs anyway and is cached again."""
    assert (await pipe.run(ECHO, ["k"], ["a", 1]))[2] == 2
    await client.script_flush()
    assert (await pipe.run(ECHO, ["k"], ["a", 2]))[2] == 3
    assert await client.script_exists(ECHO.sha) == [True]


async def test_restarted_server_is_reconnected(redis_server: RedisServer) -> None:
    """A connection that died with its server is replaced by the next call."""
    client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
    pipeline = ScriptPipeline(client)
    try:
        assert (await pipeline.run(ECHO, ["k"], ["a", 1]))[2] == 2
        redis_server.restart()
        assert await pipeline.command("SCRIPT", "EXISTS", ECHO.sha) == [1]  # loaded on connect
        assert (await pipeline.run(ECHO, ["k"], ["a", 2]))[2] == 3
        redis_server.kill()
        with pytest.raises(RedisConnectionError):
            await pipeline.command("PING")
        redis_server.start()
        assert await pipeline.command("PING") == b"PONG"
    finally:
        await pipeline.aclose()
        await client.aclose()


async def test_password_and_database_come_from_the_url() -> None:
    """``redis://:password@host/db``: the connection authenticates and selects the database."""
    with RedisServer() as server:
        admin = Redis.from_url(server.url)
        await admin.config_set("requirepass", "s3cret")
        await admin.aclose()
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        client = open_redis(RedisSettings(url=url, socket_timeout_s=0.5))
        pipeline = ScriptPipeline(client)
        try:
            assert await pipeline.command("SET", "p:db", "3") == b"OK"
            assert await client.get("p:db") == b"3"  # redis-py, same URL: database 3
            wrong = open_redis(RedisSettings(url=f"redis://:nope@127.0.0.1:{server.port}/0"))
            with pytest.raises(ResponseError):
                await ScriptPipeline(wrong).command("PING")
            await wrong.aclose()
        finally:
            await pipeline.aclose()
            await client.aclose()


async def test_a_mute_server_times_out_fast() -> None:
    """A server that accepts but never answers costs the caller ``socket_timeout_s``, no more."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = open_redis(RedisSettings(url=f"redis://127.0.0.1:{port}/0", socket_timeout_s=0.2))
    pipeline = ScriptPipeline(client)
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(pipeline.command("PING") for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, RedisTimeoutError) for r in results)
        assert time.monotonic() - started < 1.0
    finally:
        await pipeline.aclose()
        await client.aclose()
        server.close()


async def test_clients_it_cannot_speak_for_use_redis_py(redis_server: RedisServer) -> None:
    """TLS (or a credential provider) goes through redis-py, with the same interface."""
    tls = Redis.from_url(f"rediss://127.0.0.1:{redis_server.port}/0")
    assert not ScriptPipeline.supports(tls)
    assert not isinstance(script_runner(tls), ScriptPipeline)
    await tls.aclose()
    plain = Redis.from_url(redis_server.url)
    runner = script_runner(plain)
    assert isinstance(runner, ScriptPipeline)
    await runner.aclose()
    fallback = type(script_runner(tls))(plain)  # type: ignore[call-arg]  # the redis-py runner
    assert await fallback.run(ECHO, ["k"], ["v", 1]) == [b"k", b"v", 2]
    assert await fallback.command("PING") is True
    await plain.aclose()


def test_commands_are_packed_as_resp() -> None:
    """The wire format: an array of bulk strings, numbers in decimal."""
    assert pack("SET", "k", 7) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n7\r\n"
    assert ECHO.head(by_sha=True).startswith(b"*6\r\n$7\r\nEVALSHA\r\n$40\r\n")


async def test_settlement_reaches_another_replica_within_the_linger(
    redis_server: RedisServer,
) -> None:
    """A lazy release is visible to a second limiter (another replica) soon, and exactly."""
    one, two = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    a = RedisRateLimiter(one, prefix="lag:")
    b = RedisRateLimiter(two, prefix="lag:")
    spec = LimitSpec(tpm=1000, concurrency=1)
    try:
        assert (await a.acquire("k", spec, 1000, "s1")).allowed
        assert not (await b.acquire("k", spec, 1, "s2")).allowed
        await a.release("k", spec, -1000, "s1", lazy=True)  # returns once Redis applied it
        verdict = await b.acquire("k", spec, 1000, "s2")
        assert verdict.allowed
    finally:
        await a.aclose()
        await b.aclose()
        await one.aclose()
        await two.aclose()
