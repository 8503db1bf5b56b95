"""A scripted HTTP/1.1 server on a real loopback port, for the upstream client's edge cases.

Each request's head and body are read and kept; ``respond`` writes whatever answer the test
wants (or none) and says whether the connection stays open for the next request.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

# (request number from 1, reader, writer) -> keep the connection open?
Respond = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def answer(body: bytes, *, status: int = 200, extra: bytes = b"") -> bytes:
    """A complete Content-Length answer."""
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a TCP reset (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request: its head (blank line included) and its ``Content-Length`` body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


@dataclass
class RawUpstream:
    """The server: how many connections it accepted, what it was sent, who hung up."""

    respond: Respond
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    url: str = ""  # the base URL it listens on, once started
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context

    async def start(self) -> RawUpstream:
        """Listen on a free loopback port."""
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self.server is not None:
            self.server.close()
            for writer in self.writers:
                writer.transport.abort()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                head, body = await read_request(reader)
                self.requests.append(head + body)
                if not await self.respond(len(self.requests), reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.peer_closed.set()
        finally:
            writer.close()

    async def wait_peer_closed(self, reader: asyncio.StreamReader) -> None:
        """Wait until the client closes the connection (EOF or reset)."""
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.peer_closed.set()
