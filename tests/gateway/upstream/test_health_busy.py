"""Busy is not gone, and gone is not busy: probe timeouts while requests are in flight.

A scripted raw server on loopback holds the gateway's requests (a stream that keeps sending
tokens, or nothing at all) while its health route never answers; the monitor's probes run
beside real requests forwarded by the request path's own client. Against a one-at-a-time
simulator (llama-cpp-python's ``--serial interrupt``), neither the monitor's first round nor a
shadow evaluation may send a request that would make the server cut the caller's stream.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import Outcome, Usage
from gateway.routing.shadow import UNDER, ShadowConfig, ShadowRunner
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.health import HealthConfig, HealthMonitor
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.errors import TierGateError
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, answer
from tests.simulator.procs import SimulatorFactory, start_simulator

__all__ = ["start_simulator"]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
CHAT = "/v1/chat/completions"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _server(*, streams: bool) -> RawUpstream:
    """GETs (the probes) never answered; a POST answered with tokens every 20 ms until the
    client leaves (``streams``), or never answered either (a hung server)."""

    async def respond(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if streams and server.requests[n - 1].startswith(b"POST"):
            writer.write(HEAD)
            with contextlib.suppress(ConnectionError):
                while not writer.is_closing():
                    writer.write(_chunk(TOKEN))
                    await writer.drain()
                    await asyncio.sleep(0.02)
            return False
        while await reader.read(65536):  # silent until the client hangs up
            pass
        return False

    server = RawUpstream(respond)
    return server


async def _in_flight(upstream: UpstreamClient, pool: ReplicaPool, *, stream: bool) -> None:
    """One request on the pool's replica, held until cancelled (a stream is read along)."""
    route = TierRoute(pool, RoundRobin(), Timeouts(first_byte_s=60.0, idle_s=60.0), "m")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    forwarded = await forwarder.forward(CHAT, body, ["fast"])
    relay = StreamRelay(
        forwarded.exchange, strip_usage=False, idle_s=60.0, on_close=lambda _o, _u: None
    )
    async for _ in relay:
        pass


async def _rounds(
    monitor: HealthMonitor,
    pool: ReplicaPool,
    upstream: UpstreamClient,
    *,
    stream: bool,
    seconds: float,
) -> None:
    """Probe rounds for ``seconds`` while one request is in flight on the replica."""
    task = asyncio.create_task(_in_flight(upstream, pool, stream=stream))
    try:
        async with asyncio.timeout(5):
            while pool.replicas[0].in_flight == 0:  # noqa: ASYNC110  # a counter, not an event
                await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            await monitor.check_once()
        assert pool.replicas[0].in_flight == 1  # the request is still running
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_probe_timeout_while_the_replica_streams_is_busy(
    upstream: UpstreamClient, client: UpstreamPool
) -> None:
    """Tokens keep coming on the gateway's stream while /health times out: busy, healthy."""
    server = await _server(streams=True).start()
    pool = ReplicaPool("fast", [server.url], 4, 0.1, health_path="/health", kind="vllm")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.1, unhealthy_after=2))
    monitor.client = client
    try:
        await _rounds(monitor, pool, upstream, stream=True, seconds=1.0)
    finally:
        await server.stop()
    replica = pool.replicas[0]
    assert replica.healthy
    assert "busy: not counted" in replica.last_probe_error


async def test_a_hung_replica_with_a_request_in_flight_is_still_marked_down(
    upstream: UpstreamClient, client: UpstreamPool
) -> None:
    """A replica that answers nothing, neither probes nor the request it holds, is not
    "busy" forever: once it was silent past the tier's own timeouts its probes count."""
    server = await _server(streams=False).start()
    pool = ReplicaPool("fast", [server.url], 4, 0.1, health_path="/health", kind="vllm")
    pool.replicas[0].busy_s = 0.3  # the tier's first_byte_s / idle_s, shortened
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.1, unhealthy_after=2))
    monitor.client = client
    try:
        await _rounds(monitor, pool, upstream, stream=False, seconds=1.0)
    finally:
        await server.stop()
    assert not pool.replicas[0].healthy


async def test_a_hung_one_at_a_time_server_is_probed_again_and_marked_down(
    upstream: UpstreamClient, client: UpstreamPool
) -> None:
    """llama-cpp-python with health_path /v1/models gets no probe while it serves the
    gateway's requests, but only while it answers them: hung past its tier's timeouts, it is
    probed again, and its silence counts."""
    server = await _server(streams=False).start()
    pool = ReplicaPool("fast", [server.url], 4, 0.1, health_path="/v1/models", kind="llamacpp")
    pool.replicas[0].busy_s = 0.3  # the tier's first_byte_s / idle_s, shortened
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.1, unhealthy_after=2))
    monitor.client = client
    try:
        await _rounds(monitor, pool, upstream, stream=False, seconds=4.5)  # 2 s probes
    finally:
        await server.stop()
    assert not pool.replicas[0].healthy


async def test_the_first_round_never_sends_a_queueing_probe_beside_a_running_stream(
    start_simulator: SimulatorFactory,
    upstream: UpstreamClient,
    client: UpstreamPool,
) -> None:
    """A stream already runs on llama-cpp-python (``--serial interrupt``) when the monitor's
    first round detects it (health_path /v1/models): no /v1/models probe then, so the stream
    ends whole, and the replica counts as checked (else /readyz would probe /v1/models)."""
    sim = start_simulator(
        "--flavor",
        "llamacpp-python",
        "--serial",
        "interrupt",
        "--profile",
        "precise",
        "--latency-scale",
        "4",
        "--jitter",
        "0",
    )
    pool = ReplicaPool("precise", [sim.url], 4, 0.1, health_path="/v1/models")
    monitor = HealthMonitor({"precise": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    route = TierRoute(pool, RoundRobin(), Timeouts(), "tiergate-precise")
    forwarder = Forwarder(upstream, {"precise": route}, RetryPolicy(backoff_base_s=0.0))
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 24,
        "min_tokens": 24,
        "stream": True,
    }
    forwarded = await forwarder.forward(CHAT, body, ["precise"])
    closed: list[tuple[str, Usage | None]] = []
    relay = StreamRelay(
        forwarded.exchange,
        strip_usage=False,
        idle_s=30.0,
        on_close=lambda outcome, usage: closed.append((outcome, usage)),
    )
    sent = asyncio.ensure_future(_read_all(relay))
    await monitor.check_once()  # the replica's first round, while the stream runs
    assert monitor.readiness() == {"precise": True}  # busy is alive: /readyz asks nobody
    await sent
    assert closed[0][0] == Outcome.COMPLETE
    assert pool.replicas[0].kind == "llamacpp"


async def _read_all(relay: StreamRelay) -> bytes:
    return b"".join([piece async for piece in relay])


async def test_a_shadow_waits_for_a_one_at_a_time_replica_to_be_idle(
    start_simulator: SimulatorFactory, upstream: UpstreamClient
) -> None:
    """Shadow evaluation sends nothing to a llama-cpp-python replica that runs the caller's
    stream (its request would wait for the model and cut the stream): skipped as busy."""
    sim = start_simulator(
        "--flavor",
        "llamacpp-python",
        "--serial",
        "interrupt",
        "--profile",
        "precise",
        "--latency-scale",
        "4",
        "--jitter",
        "0",
    )
    pools = {t: ReplicaPool(t, [sim.url], 4, 0.1, kind="llamacpp") for t in ("fast", "precise")}
    routes = {
        t: TierRoute(p, RoundRobin(), Timeouts(), "tiergate-precise") for t, p in pools.items()
    }
    shadow = ShadowRunner(
        ShadowConfig(fast_ratio=1.0),
        routes,
        fast_tier="fast",
        precise_tier="precise",
        upstream=lambda: upstream.pool,
    )
    forwarder = Forwarder(upstream, routes, RetryPolicy(backoff_base_s=0.0))
    body = {
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 24,
        "min_tokens": 24,
        "stream": True,
    }
    forwarded = await forwarder.forward(CHAT, body, ["precise"])
    closed: list[tuple[str, Usage | None]] = []
    relay = StreamRelay(
        forwarded.exchange,
        strip_usage=False,
        idle_s=30.0,
        on_close=lambda outcome, usage: closed.append((outcome, usage)),
    )
    sent = asyncio.ensure_future(_read_all(relay))
    await asyncio.sleep(0.2)  # the stream is generating
    shadow.submit(UNDER, CHAT, {**body, "stream": False}, "an answer", None)
    await sent
    await asyncio.gather(*shadow._tasks)
    assert closed[0][0] == Outcome.COMPLETE
    assert shadow.counts == {f"{UNDER}:skipped_busy": 1}


async def _retrying(upstream: UpstreamClient, pool: ReplicaPool, every_s: float) -> None:
    """A client that gives up after ``every_s`` and asks again, one request at a time."""
    while True:
        task = asyncio.create_task(_in_flight(upstream, pool, stream=False))
        await asyncio.sleep(every_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TierGateError):  # once marked down
            await task


async def test_a_hung_replica_asked_again_and_again_is_still_marked_down(
    upstream: UpstreamClient, client: UpstreamPool
) -> None:
    """A client retrying one request at a time on a hung replica (each attempt given up
    before the gateway's own timeout) never re-arms "busy": only an answer does."""
    server = await _server(streams=False).start()
    pool = ReplicaPool("fast", [server.url], 4, 0.1, health_path="/health", kind="vllm")
    pool.replicas[0].busy_s = 0.4  # the tier's first_byte_s / idle_s, shortened
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.1, unhealthy_after=2))
    monitor.client = client
    retrying = asyncio.create_task(_retrying(upstream, pool, every_s=0.15))
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        while loop.time() < end:
            await monitor.check_once()
    finally:
        retrying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await retrying
        await server.stop()
    assert not pool.replicas[0].healthy


async def test_an_error_answer_is_an_answer_for_the_busy_rule(
    upstream: UpstreamClient, client: UpstreamPool
) -> None:
    """A replica that answered a 400, then takes a second request whose first byte is slow
    (a long prompt) while its probes time out, is busy: the 400 showed it alive."""

    async def respond(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = server.requests[n - 1]
        if request.startswith(b"POST") and b'"bad"' in request:
            writer.write(answer(b'{"error":{"message":"bad"}}', status=400))
            return True
        if request.startswith(b"POST"):
            await asyncio.sleep(0.5)  # the prompt's prefill, within busy_s
            writer.write(answer(b'{"choices":[],"usage":{"prompt_tokens":1}}'))
            return True
        while await reader.read(65536):  # probes: never answered
            pass
        return False

    server = await RawUpstream(respond).start()
    pool = ReplicaPool("fast", [server.url], 4, 0.1, health_path="/health", kind="vllm")
    pool.replicas[0].busy_s = 1.0  # the tier's first_byte_s / idle_s, shortened
    route = TierRoute(pool, RoundRobin(), Timeouts(), "m")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.1, unhealthy_after=2))
    monitor.client = client
    try:
        with contextlib.suppress(TierGateError):
            await forwarder.forward(CHAT, {"messages": [], "bad": True}, ["fast"])
        await asyncio.sleep(1.2)  # longer than busy_s since the 400's request was given
        slow = asyncio.create_task(forwarder.forward(CHAT, {"messages": []}, ["fast"]))
        while not slow.done():
            await monitor.check_once()
        await slow
    finally:
        await server.stop()
    assert pool.replicas[0].healthy
