"""One keep-alive HTTP/1.1 connection to a backend, and the answer read from it.

A :class:`Connection` is an asyncio protocol whose bytes go straight into httptools' response
parser; the body is buffered in the chunks the parser hands over, and reading is paused while
more than :data:`HIGH_WATER` bytes wait unread (resumed below :data:`LOW_WATER`), so a fast
backend cannot fill the gateway's memory behind a slow client. A :class:`Response` is the
caller's view of one answer on it. Connections are pooled by :mod:`gateway.upstream.pool`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import cast

import httptools

HIGH_WATER = 256 * 1024  # unread bytes above which reading from the backend pauses
LOW_WATER = 64 * 1024  # ... and below which it resumes
# An answer's status line and headers (1xx heads included) past this: a broken backend. httptools
# has no bound and grows a header value by concatenation (memory, and CPU with the length).
MAX_HEAD_BYTES = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
# What a lost connection keeps instead of its parser: one bound to no protocol (no callbacks).
_CLOSED = httptools.HttpResponseParser(object())
# A separator given as a pattern matches at most this many bytes (looked for again across reads).
PATTERN_OVERLAP = 8


class UpstreamConnectionError(ConnectionError):
    """The backend could not be reached or the connection to it broke."""


class ConnectFailed(UpstreamConnectionError):
    """The backend refused the connection or could not be reached."""


class ConnectTimedOut(UpstreamConnectionError):
    """The backend did not accept the connection in time."""


class ConnectionLost(UpstreamConnectionError):
    """The connection closed before the answer was complete.

    ``stale``: not one byte of the answer had arrived (a reused keep-alive connection the
    server had already closed looks like this).
    """

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class Connection(asyncio.Protocol):
    """One connection: writes requests, parses answers, buffers their bodies."""

    __slots__ = (
        "_buffer",
        "_complete",
        "_flush",
        "_head_done",
        "_head_fed",
        "_headers",
        "_keep_alive",
        "_lost",
        "_on_idle",
        "_on_lost",
        "_parser",
        "_paused",
        "_received",
        "_sink",
        "_size",
        "_until_eof",
        "_waiter",
        "busy",
        "closed",
        "idle_since",
        "loop",
        "status",
        "transport",
        "used",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_idle: Callable[[Connection], None],
        on_lost: Callable[[Connection], None],
    ) -> None:
        self.loop = loop
        self._on_idle = on_idle
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False
        self.used = 0  # requests written on it
        self.idle_since = 0.0
        self.status = 0
        self._headers: dict[bytes, bytes] = {}
        self._buffer: list[bytes] = []
        self._size = 0
        self._head_fed = 0
        self._head_done = self._complete = self._received = False
        self._keep_alive = self._until_eof = self._paused = False
        self._lost: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._flush: Callable[[], None] | None = None

    # -- the caller's side --------------------------------------------------------------------

    async def exchange(self, request: bytes) -> Response:
        """Write ``request`` and wait for the answer's head; any failure closes the connection."""
        self._headers = {}
        self._buffer = []
        self._size = self._head_fed = 0
        self._head_done = self._complete = self._received = False
        self._lost = None
        self._sink = self._flush = None
        self.busy = True
        self.used += 1
        transport = self.transport
        if transport is None or self.closed:
            raise ConnectionLost("The connection to the backend was closed.", stale=True)
        transport.write(request)
        try:
            while not self._head_done:
                self._check_lost()
                await self._wait()
        except BaseException:
            self.abort()  # cancelled or broken: closing makes the backend stop the work
            raise
        return Response(self)

    @property
    def buffered(self) -> int:
        """Body bytes received and not read yet."""
        return self._size

    def header(self, name: bytes) -> str | None:
        """A header of the current answer (``name`` in lower case), if present."""
        value = self._headers.get(name)
        return None if value is None else value.decode("latin-1")

    async def readany(self) -> bytes:
        """The next bytes of the body; ``b""`` once it is complete."""
        while True:
            if self._size:
                return self._take()
            if self._complete:
                return b""
            self._check_lost()
            await self._wait()

    async def readuntil(self, separator: bytes | re.Pattern[bytes], max_size: int) -> bytes:
        """The body up to and including ``separator`` (or what is left at its end).

        ``separator`` may be a pattern (several separators, the first found wins) whose
        matches are at most :data:`PATTERN_OVERLAP` bytes long.

        ValueError if more than ``max_size`` bytes come before the separator. Reading goes on
        past the high-water mark while the separator is looked for (up to ``max_size``): a
        paused connection would never bring it.
        """
        searched = 0
        overlap = len(separator) - 1 if isinstance(separator, bytes) else PATTERN_OVERLAP
        while True:
            if self._size:
                data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
                self._buffer = [data]
                end = _end_of(separator, data, searched)
                if end >= 0:
                    if end > max_size:
                        raise ValueError("an event above the size limit")
                    return self._keep(data, end)
                if len(data) > max_size:
                    raise ValueError("an event above the size limit")
                searched = max(0, len(data) - overlap)
                if self._paused:
                    self._resume()
            if self._complete:
                return self._take() if self._size else b""
            self._check_lost()
            await self._wait()

    def divert(
        self,
        sink: Callable[[bytes], None] | None,
        flush: Callable[[], None] | None = None,
    ) -> None:
        """Hand each piece of the body to ``sink`` as it is parsed, inside the protocol's
        callback, instead of buffering it for a read (``None``: buffer again); ``flush`` is
        called once after each read from the socket that was parsed while diverted (the
        pieces of one read go out together). Nothing wakes a waiting reader while diverted
        but the answer's end, its failure, or :meth:`wake`: the sink decides when its caller
        has something to do. Take what is buffered first; a diverted connection with bytes
        buffered keeps buffering, so the order holds."""
        self._sink = sink
        self._flush = flush if sink is not None else None

    async def wait(self) -> None:
        """Wait for the next wake-up: bytes buffered, the answer's end or failure, or
        :meth:`wake` (a diverted body's sink calls it)."""
        await self._wait()

    def wake(self) -> None:
        """Wake the reader waiting in :meth:`wait` (none: nothing happens)."""
        self._wake()

    def take(self) -> bytes:
        """The body bytes buffered and not read yet, now (``b""``: none)."""
        return self._take() if self._size else b""

    @property
    def complete(self) -> bool:
        """The whole body has arrived (what is buffered is the rest of it)."""
        return self._complete

    def check_lost(self) -> None:
        """ConnectionLost if the answer can no longer be read to its end."""
        self._check_lost()

    def release(self) -> None:
        """Done with the answer: back to the pool if it was read to its end, else closed."""
        if not self.busy:
            return
        self.busy = False
        if self._complete and self._keep_alive and not self._size and not self.closed:
            self._on_idle(self)
        else:
            self.abort()

    def abort(self) -> None:
        """Close the connection now (an unfinished answer: the backend stops generating)."""
        self.busy = False
        transport = self.transport
        if transport is not None and not self.closed:
            transport.abort()

    # -- buffering ----------------------------------------------------------------------------

    def _take(self) -> bytes:
        buffer = self._buffer
        data = buffer[0] if len(buffer) == 1 else b"".join(buffer)
        self._buffer = []
        self._size = 0
        if self._paused:
            self._resume()
        return data

    def _keep(self, data: bytes, end: int) -> bytes:
        rest = data[end:]
        self._buffer = [rest] if rest else []
        self._size = len(rest)
        if self._paused and self._size <= LOW_WATER:
            self._resume()
        return data[:end]

    def _resume(self) -> None:
        self._paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _check_lost(self) -> None:
        if self._lost is not None:
            raise ConnectionLost(self._lost, stale=not self._received)
        if self.closed:
            raise ConnectionLost("The connection to the backend was closed.")

    async def _wait(self) -> None:
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- asyncio protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; bytes while idle or a malformed answer close the connection."""
        if not self.busy:
            self.abort()  # an idle connection has nothing to say: never trust it again
            return
        self._received = True
        flush = self._flush  # the sink may stop the diversion in the middle of the read
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if flush is not None:
                flush()
            self._fail("The backend sent a malformed answer.")
            return
        if flush is not None:
            flush()
        if not self._head_done:
            self._head_fed += len(data)  # one read at most past the bound: recv-sized
            if self._head_fed > MAX_HEAD_BYTES:
                self._fail("The backend's answer head is too large.")

    def _fail(self, reason: str) -> None:
        """The answer cannot be read: fail it and close the connection."""
        self._lost = reason
        self._wake()
        self.abort()

    def eof_received(self) -> bool | None:
        """The backend closed its side: close ours too (an EOF-delimited body ends here)."""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """End the answer (read-until-EOF bodies) or fail it; tell the pool."""
        self.closed = True
        if self.busy and not self._complete and self._lost is None:
            if self._head_done and self._until_eof and exc is None:
                self._complete = True
            else:
                self._lost = "The connection to the backend was lost."
        self._wake()
        self._on_lost(self)
        # The parser holds this protocol's callbacks and the transport holds this protocol: both
        # cycles, left for a full garbage collection (which a busy server defers) otherwise.
        self.transport = None
        self._parser = _CLOSED
        self._sink = self._flush = None

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A second answer to one request is never read (nor appended to the first's body)."""
        if self._complete:
            raise ValueError("an answer nobody asked for")  # httptools: HttpParserError

    def on_header(self, name: bytes, value: bytes) -> None:
        """Keep a header, by its lower-case name."""
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        """The head is there (an informational 1xx head is skipped)."""
        parser = self._parser
        status = parser.get_status_code()
        if status < 200:
            self._headers = {}
            return
        self.status = status
        self._keep_alive = parser.should_keep_alive()
        headers = self._headers
        self._until_eof = (
            b"content-length" not in headers
            and b"transfer-encoding" not in headers
            and status not in _NO_BODY_STATUSES
        )
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        """Buffer a piece of the body (or hand it to the sink it is diverted to); pause
        reading above the high-water mark."""
        sink = self._sink
        if sink is not None and not self._size:
            sink(body)
            return
        self._buffer.append(body)
        self._size += len(body)
        if self._size > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        """The body is complete."""
        if self._head_done:
            self._complete = True
            self._wake()


def _end_of(separator: bytes | re.Pattern[bytes], data: bytes, start: int) -> int:
    """Where the first ``separator`` in ``data`` from ``start`` ends; -1 if there is none."""
    if isinstance(separator, bytes):
        found = data.find(separator, start)
        return found + len(separator) if found >= 0 else -1
    match = separator.search(data, start)
    return match.end() if match is not None else -1


class Response:
    """One answer on a pooled connection: status, headers, the body as it arrives."""

    __slots__ = ("_conn", "_done", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._done = False  # released or closed: the connection may serve another request
        self.status = conn.status

    @property
    def buffered(self) -> int:
        """Body bytes received and not read yet (bounded by the flow control)."""
        return self._conn.buffered

    def header(self, name: str) -> str | None:
        """A header's value, by case-insensitive name."""
        return self._conn.header(name.lower().encode("latin-1"))

    async def read(self, limit: int | None = None) -> bytes:
        """The whole (rest of the) body; ValueError once it passes ``limit`` bytes."""
        conn = self._conn
        first = await conn.readany()
        if not first:
            return first
        parts = [first]
        size = len(first)
        while data := await conn.readany():
            parts.append(data)
            size += len(data)
            if limit is not None and size > limit:
                raise ValueError("an answer above the size limit")
        if limit is not None and size > limit:
            raise ValueError("an answer above the size limit")
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_at_most(self, limit: int) -> bytes:
        """The body up to ``limit`` bytes (an error answer's, for its message)."""
        parts: list[bytes] = []
        size = 0
        while size < limit and (data := await self._conn.readany()):
            parts.append(data)
            size += len(data)
        return b"".join(parts)[:limit]

    async def readany(self) -> bytes:
        """The next bytes of the body; ``b""`` at its end."""
        return await self._conn.readany()

    @property
    def connection(self) -> Connection:
        """The connection the answer arrives on (to divert its body, see
        :meth:`Connection.divert`)."""
        return self._conn

    async def readuntil(self, separator: bytes | re.Pattern[bytes], max_size: int) -> bytes:
        """The body up to and including ``separator`` (ValueError past ``max_size``)."""
        return await self._conn.readuntil(separator, max_size)

    def release(self) -> None:
        """Done: the connection goes back to the pool if the body was read, else it closes."""
        if not self._done:
            self._done = True
            self._conn.release()

    def close(self) -> None:
        """Abort: close the connection so the backend stops generating."""
        if not self._done:
            self._done = True
            self._conn.abort()
