"""A stream whose first event is the backend's error is an HTTP error, not a 200 (issue 18)."""

from __future__ import annotations

import pytest
from aiohttp import web

from gateway.config.tier_settings import Timeouts
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from gateway.upstream.sse import stream_error
from policies.errors import UpstreamRejected
from policies.selection import RoundRobin

ERROR_400 = (
    b'data: {"error":{"message":"Request id chatcmpl-x already running.",'
    b'"type":"BadRequestError","param":null,"code":400}}\n\ndata: [DONE]\n\n'
)
ERROR_503 = b'data: {"error":{"message":"engine busy","code":503}}\n\ndata: [DONE]\n\n'
GOOD = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\ndata: [DONE]\n\n'


async def _sse(request: web.Request, payload: bytes) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_type = "text/event-stream"
    await response.prepare(request)
    await response.write(payload)
    await response.write_eof()
    return response


async def _server(payload: bytes, seen: list[str]) -> web.AppRunner:
    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers["x-request-id"])
        return await _sse(request, payload)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


def _forwarder(upstream: UpstreamClient, urls: list[str]) -> tuple[Forwarder, ReplicaPool]:
    pool = ReplicaPool("fast", urls, 8, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(), "m")
    return Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0)), pool


def _body() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_first_event_4xx_error_is_answered_with_its_status(
    upstream: UpstreamClient,
) -> None:
    """vLLM 0.11's duplicate-id error as a stream's first event becomes a 400, not a 200."""
    seen: list[str] = []
    runner = await _server(ERROR_400, seen)
    try:
        forwarder, pool = _forwarder(upstream, [_url(runner)])
        with pytest.raises(UpstreamRejected) as info:
            await forwarder.forward("/v1/chat/completions", _body(), ["fast"])
        assert info.value.status == 400
        assert "already running" in str(info.value)
        assert len(seen) == 1  # 4xx: not retried
        assert pool.replicas[0].in_flight == 0
    finally:
        await runner.cleanup()


async def test_first_event_5xx_error_is_retried_elsewhere_with_a_new_id(
    upstream: UpstreamClient,
) -> None:
    """A 5xx error as the first event is retried on another replica, with a fresh upstream id."""
    bad_seen: list[str] = []
    good_seen: list[str] = []
    bad = await _server(ERROR_503, bad_seen)
    good = await _server(GOOD, good_seen)
    try:
        forwarder, pool = _forwarder(upstream, [_url(bad), _url(good)])
        forwarded = await forwarder.forward("/v1/chat/completions", _body(), ["fast"])
        exchange = forwarded.exchange
        assert exchange.first_event.startswith(b'data: {"id"')
        exchange.finish()
        assert len(bad_seen) == 1
        assert len(good_seen) == 1
        assert bad_seen[0] != good_seen[0]
        assert "caller-id" not in (bad_seen[0], good_seen[0])
        assert pool.replicas[0].outcomes["status_503"] == 1
    finally:
        await bad.cleanup()
        await good.cleanup()


@pytest.mark.parametrize(
    ("event", "status", "message"),
    [
        (b'data: {"error":{"message":"m","code":422}}', 422, "m"),
        (b'data: {"error":{"message":"m","code":"x"}}', 500, "m"),
        (b'data: {"error": not json', 500, "The backend failed."),
        (b'data: {"error":"a string"}', 500, "a string"),  # TGI's shape
        (b'data: {"object":"error","message":"m","code":503}', 503, "m"),  # SGLang's flat one
        (b'data: { "error" : { "message": "m", "code": 400 } }', 400, "m"),
        (b'data: {"error":{"message":"m","code":401}}\n\n', 401, "m"),  # as read, blank line
    ],
)
def test_stream_error_parsing(event: bytes, status: int, message: str) -> None:
    """The status comes from the event's integer code (else 500); the message is kept, from
    every shape a backend writes its error in."""
    failure = stream_error(event)
    assert failure.status == status
    assert failure.message == message
