"""The server's own protocol builds the ASGI scope only for requests the ASGI app serves: that
scope must be exactly the one stock uvicorn (``http="httptools"``) builds, for any request line
and headers, so Litestar sees the same requests either way."""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any

import pytest
import uvicorn

from gateway.config.settings import ServerSettings
from gateway.http.connections import ConnectionGuard
from gateway.http.protocol import GuardedHttpToolsProtocol
from gateway.http.server import connection_limits

REQUESTS = [
    b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /v1/models?x=1&y=%20z HTTP/1.1\r\nHost: a\r\nX-Thing: One\r\nx-thing: two\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\nhi",
    b"GET /a%2Fb/c HTTP/1.0\r\nHost: a\r\n\r\n",
]


async def _scopes(protocol: Any, request: bytes) -> list[dict[str, Any]]:
    """Serve ``request`` with ``protocol``; the scopes the app was called with."""
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append(dict(scope))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, http=protocol, ws="none", lifespan="off", log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # noqa: ASYNC110  # uvicorn sets a flag, not an event
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b" 204 " in head.split(b"\r\n")[0]
        writer.close()
    finally:
        server.should_exit = True
        await task
        sock.close()
    return seen


@pytest.mark.parametrize("request_bytes", REQUESTS)
async def test_the_asgi_scope_is_uvicorns(request_bytes: bytes) -> None:
    """Same request, stock uvicorn and the guarded protocol: the same scope (client port aside)."""
    guard = ConnectionGuard(connection_limits(ServerSettings()))
    ours = functools.partial(GuardedHttpToolsProtocol, guard=guard, native=None)
    stock = await _scopes("httptools", request_bytes)
    guarded = await _scopes(ours, request_bytes)
    assert len(stock) == len(guarded) == 1
    for scope in (stock[0], guarded[0]):
        scope.pop("client")  # another connection, another port
        scope.pop("server")  # another listener, another port
    assert guarded[0] == stock[0]
    assert guarded[0]["headers"]  # read into the scope, not lost
