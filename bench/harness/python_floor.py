"""The least a Python proxy can do per request: a yardstick for TierGate's own layers.

A raw asyncio protocol on uvloop with the httptools parser, like the fixed upstream, in front
of one backend: for each POST it decodes the JSON body with msgspec, writes the backend's
model name into it, encodes it again, sends it over a kept-alive backend connection (one task
per request, as a gateway has), and writes the backend's answer back with its status and
content type. ``GET /health`` answers 200 itself. Nothing else: no authentication, limits,
routing, retries, timeouts, streaming, pipelining, logging or metrics. It is not a product;
``bench/overhead`` runs it as the ``python-floor`` leg so that TierGate's distance from the
upstream splits into what Python, uvloop and the sockets cost and what TierGate's own
request path costs.

Run: ``python bench/harness/python_floor.py --port 8080 --upstream 127.0.0.1:8001 --model M``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any, cast

import httptools
import msgspec
import uvloop

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness.fixed_upstream import RequestProtocol  # noqa: E402  # after the path fix

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


class Backend(asyncio.Protocol):
    """One kept-alive connection to the backend, one request at a time."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[int, bytes, bytes]] | None = None
        self._body: list[bytes] = []
        self._type = b"application/json"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)

    def connection_lost(self, exc: Exception | None) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(ConnectionError("the backend closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._type = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer, self._answer = self._answer, None
        body, self._body = b"".join(self._body), []
        if answer is not None and not answer.done():
            answer.set_result((self._parser.get_status_code(), self._type, body))

    async def send(self, request: bytes) -> tuple[int, bytes, bytes]:
        """Write one request; its status, content type and body."""
        assert self._transport is not None  # connected before use
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return await self._answer


class Floor:
    """The backend's address, its model and the idle connections to it."""

    def __init__(self, host: str, port: int, model: str) -> None:
        self.host = host
        self.port = port
        self.model = model
        self.idle: list[Backend] = []

    async def forward(self, path: bytes, body: bytes) -> bytes:
        """One POST through a kept-alive connection; the whole answer for the client."""
        request: dict[str, Any] = _decode(body)
        request["model"] = self.model
        payload = _encode(request)
        backend = self.idle.pop() if self.idle else await self._connect()
        status, content_type, answer = await backend.send(
            b"POST %b HTTP/1.1\r\nhost: backend\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (path, len(payload), payload)
        )
        self.idle.append(backend)
        return b"HTTP/1.1 %d OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (
            status,
            content_type,
            len(answer),
            answer,
        )

    async def _connect(self) -> Backend:
        loop = asyncio.get_running_loop()
        _, backend = await loop.create_connection(Backend, self.host, self.port)
        return backend


class Client(RequestProtocol):
    """One client connection: parse a request, forward it in a task, write the answer."""

    def __init__(self, floor: Floor) -> None:
        super().__init__()
        self._floor = floor
        self._body: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, self._url = self._url.split(b"?", 1)[0], b""
        body, self._body = b"".join(self._body), []
        if self._parser.get_method() != b"POST":
            if self._transport is not None:
                self._transport.write(_HEALTH)
            return
        asyncio.get_running_loop().create_task(self._answer(path, body))

    async def _answer(self, path: bytes, body: bytes) -> None:
        reply = await self._floor.forward(path, body)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(reply)


async def serve(port: int, upstream: str, model: str) -> None:
    """Listen on 127.0.0.1 until cancelled."""
    host, _, upstream_port = upstream.rpartition(":")
    floor = Floor(host, int(upstream_port), model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(floor), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="host:port of the backend")
    p.add_argument("--model", required=True)
    args = p.parse_args()
    uvloop.run(serve(args.port, args.upstream, args.model))


if __name__ == "__main__":
    main()
