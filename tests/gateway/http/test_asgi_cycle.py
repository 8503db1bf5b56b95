"""The server's own ASGI cycle (gateway/http/asgi.py) on a real socket, run as ``tiergate serve``
runs it: the protocol class given to ``uvicorn.Config(http=...)``, under ``uvicorn.Server``."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from gateway.config.settings import ServerSettings
from gateway.http.connections import ConnectionGuard
from gateway.http.protocol import GuardedHttpToolsProtocol
from gateway.http.server import connection_limits

App = Any


@asynccontextmanager
async def serving(app: App) -> AsyncIterator[int]:
    """Serve ``app`` on a free port with the server's protocol; yields the port."""
    guard = ConnectionGuard(connection_limits(ServerSettings()))
    protocol = functools.partial(GuardedHttpToolsProtocol, guard=guard, native=None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=protocol,  # type: ignore[arg-type]  # a protocol factory, as tiergate serve passes
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # noqa: ASYNC110  # uvicorn sets a flag, not an event
            await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request``; everything the server wrote until it closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_an_app_that_fails_before_answering_gets_an_openai_shaped_500() -> None:
    """A bug in an app: 500 with the OpenAI error envelope, then the connection closes."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async with serving(app) as port:
        data = await exchange(port, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ")
    assert b"content-type: application/json" in head
    assert b"connection: close" in head
    assert json.loads(body)["error"]["type"] == "server_error"


async def test_a_body_without_a_length_is_chunked_and_head_gets_no_body() -> None:
    """Two body messages and no Content-Length: chunked on the wire; HEAD: headers only."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await send({"type": "http.response.body", "body": b"cd", "more_body": False})

    async with serving(app) as port:
        data = await exchange(port, b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        head_only = await exchange(
            port, b"HEAD /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n"
    assert head_only.endswith(b"\r\n\r\n")
    assert head_only.startswith(b"HTTP/1.1 200 ")


async def test_the_app_hears_the_client_leave() -> None:
    """After the body, ``receive`` waits; when the client closes it returns http.disconnect."""
    heard: asyncio.Queue[str] = asyncio.Queue()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        first = await receive()
        assert first == {"type": "http.request", "body": b"hi", "more_body": False}
        heard.put_nowait((await receive())["type"])

    async with serving(app) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi")
        await writer.drain()
        await asyncio.sleep(0.05)
        assert heard.empty()  # still connected: nothing to hear yet
        writer.close()
        assert await asyncio.wait_for(heard.get(), 10) == "http.disconnect"
