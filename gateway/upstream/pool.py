"""The gateway's own HTTP/1.1 client to the backends: pooled keep-alive connections per origin.

The gateway's one HTTP client: ``POST`` with a ``Content-Length`` body (the request path),
``GET`` with a bounded body (health probes, detection, ``/metrics``, ops), the caller's
headers plus ``Host`` (no User-Agent, no compression, no redirects, no proxy from the
environment), answers read as they arrive (:class:`~gateway.upstream.connection.Response`).
It exists for CPU per request: aiohttp's general client was a quarter of the gateway's CPU
(bench/results/profile-plain.md) and this one is faster on every concurrency measured
(bench/results/client.md). Its failures are one vocabulary: ``TimeoutError`` from the
caller's deadline, else an :class:`~gateway.upstream.connection.UpstreamConnectionError`.

Idle connections are reused last-in first-out and closed once idle longer than
``keepalive_s``, when the backend said ``Connection: close``, or as soon as the backend closes
them. A request written on a reused connection that breaks before one byte of the answer came
back met a connection the server had closed while idle: it is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from functools import partial
from urllib.parse import urlsplit

from gateway.upstream.connection import (
    ConnectFailed,
    Connection,
    ConnectionLost,
    ConnectTimedOut,
    Response,
)

_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_TARGETS = 4096  # URLs come from configuration: a few per replica


class Origin:
    """One (scheme, host, port): its idle connections, how many are open, who waits for one."""

    __slots__ = ("host", "idle", "open", "port", "ssl", "waiters")

    def __init__(self, host: str, port: int, context: ssl.SSLContext | None) -> None:
        self.host = host
        self.port = port
        self.ssl = context
        self.idle: list[Connection] = []  # oldest first; reused from the end
        self.open: set[Connection] = set()  # open or opening: what the limit counts
        self.waiters: deque[asyncio.Future[None]] = deque()

    def wake_one(self) -> None:
        """Let one caller waiting for a connection try again."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _host_line(host: str, port: int, scheme: str) -> bytes:
    name = f"[{host}]" if ":" in host else host
    if port != _DEFAULT_PORTS[scheme]:
        name = f"{name}:{port}"
    return f"Host: {name}\r\n".encode("ascii")


def header_block(headers: Mapping[str, str]) -> bytes:
    """``headers`` as request header lines (ValueError for a line break in a name or value)."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise ValueError("a request header contains a line break")
    return text.encode("latin-1")


class UpstreamPool:
    """Keep-alive connections to every backend origin; one per gateway process."""

    def __init__(self, *, limit_per_host: int = 0, keepalive_s: float = 30.0) -> None:
        self.limit_per_host = limit_per_host  # 0: unlimited
        self.keepalive_s = keepalive_s
        self._loop = asyncio.get_running_loop()
        self._origins: dict[tuple[str, str, int], Origin] = {}
        self._targets: dict[str, tuple[Origin, bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, connect_s: float | None = None
    ) -> Response:
        """POST ``body`` to ``url``; return once the answer's head is there.

        ``connect_s`` bounds opening a connection. Errors: ConnectFailed, ConnectTimedOut,
        ConnectionLost (all ``ConnectionError``); cancelling closes the connection.
        """
        target = self._targets.get(url)
        if target is None:
            target = self._target(url)
        origin, line = target
        request = b"POST %s%sContent-Length: %d\r\n\r\n%s" % (
            line,
            header_block(headers),
            len(body),
            body,
        )
        return await self._send(origin, request, connect_s)

    async def get(
        self, url: str, headers: Mapping[str, str] | None = None, *, limit: int
    ) -> tuple[int, bytes]:
        """GET ``url``: the answer's status and at most ``limit`` bytes of its body.

        The caller bounds the time (``asyncio.timeout``); errors as :meth:`post`. A body
        longer than ``limit`` closes the connection instead of reading the rest.
        """
        origin, line = self._targets.get(url) or self._target(url)
        request = b"GET %s%s\r\n" % (line, header_block(headers or {}))
        response = await self._send(origin, request, None)
        try:
            body = await response.read_at_most(limit)
        except BaseException:
            response.close()
            raise
        response.release()
        return response.status, body

    async def _send(self, origin: Origin, request: bytes, connect_s: float | None) -> Response:
        """Write ``request`` on an idle connection (once more on a new one if it was stale)."""
        conn = await self._acquire(origin, connect_s, fresh=False)
        reused = conn.used > 0
        try:
            return await conn.exchange(request)
        except ConnectionLost as exc:
            if not (reused and exc.stale):
                raise
        conn = await self._acquire(origin, connect_s, fresh=True)  # the idle one was stale
        return await conn.exchange(request)

    async def close(self) -> None:
        """Close every connection; later requests fail as refused."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for origin in self._origins.values():
            origin.idle.clear()
            for conn in list(origin.open):
                conn.abort()
            while origin.waiters:
                origin.wake_one()
        await asyncio.sleep(0)  # let the transports report their close

    def _target(self, url: str) -> tuple[Origin, bytes]:
        """The origin of ``url`` and its request line (after the method) with the Host header."""
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ConnectFailed(f"Not an http(s) URL: {url!r}.")
        host = parts.hostname
        port = parts.port or _DEFAULT_PORTS[scheme]
        origin = self._origins.get((scheme, host, port))
        if origin is None:
            context = self._context() if scheme == "https" else None
            origin = self._origins[(scheme, host, port)] = Origin(host, port, context)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        line = f"{path} HTTP/1.1\r\n".encode("ascii") + _host_line(host, port, scheme)
        target = (origin, line)
        if len(self._targets) < _MAX_TARGETS:
            self._targets[url] = target
        return target

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _acquire(self, origin: Origin, connect_s: float | None, *, fresh: bool) -> Connection:
        """An idle connection (unless ``fresh``) or a new one, within the per-host limit."""
        while True:
            if self._closed:
                raise ConnectFailed("The upstream client is closed.")
            if not fresh:
                conn = self._pop_idle(origin)
                if conn is not None:
                    return conn
            if not self.limit_per_host or len(origin.open) < self.limit_per_host:
                return await self._connect(origin, connect_s)
            waiter = self._loop.create_future()
            origin.waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    origin.wake_one()  # the turn it was given goes to the next
                raise

    def _pop_idle(self, origin: Origin) -> Connection | None:
        idle = origin.idle
        oldest_usable = self._loop.time() - self.keepalive_s
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if conn.idle_since < oldest_usable:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, origin: Origin, connect_s: float | None) -> Connection:
        conn = Connection(
            self._loop, partial(self._put_idle, origin), partial(self._forget, origin)
        )
        origin.open.add(conn)  # counts against the limit while it opens
        try:
            async with asyncio.timeout(connect_s):
                await self._loop.create_connection(
                    lambda: conn, origin.host, origin.port, ssl=origin.ssl
                )
        except TimeoutError as exc:
            self._forget(origin, conn)
            raise ConnectTimedOut("The backend did not accept in time.") from exc
        except OSError as exc:
            self._forget(origin, conn)
            raise ConnectFailed(f"The backend refused the connection: {exc}") from exc
        except BaseException:
            self._forget(origin, conn)
            raise
        if self._closed:
            conn.abort()
            raise ConnectFailed("The upstream client is closed.")
        return conn

    def _put_idle(self, origin: Origin, conn: Connection) -> None:
        """A connection whose answer was read to its end: idle, for the next request."""
        if self._closed or conn not in origin.open:
            conn.abort()
            return
        conn.idle_since = self._loop.time()
        origin.idle.append(conn)
        origin.wake_one()
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self.keepalive_s / 2, self._sweep)

    def _forget(self, origin: Origin, conn: Connection) -> None:
        """A connection closed (or never opened): it no longer counts nor waits idle."""
        if conn not in origin.open:
            return
        origin.open.discard(conn)
        if conn in origin.idle:
            origin.idle.remove(conn)
        origin.wake_one()

    def _sweep(self) -> None:
        """Close connections idle longer than ``keepalive_s``."""
        self._sweeper = None
        oldest_usable = self._loop.time() - self.keepalive_s
        waiting = False
        for origin in self._origins.values():
            idle = origin.idle
            while idle and idle[0].idle_since < oldest_usable:
                idle.pop(0).abort()
            waiting = waiting or bool(idle)
        if waiting:
            self._sweeper = self._loop.call_later(self.keepalive_s / 2, self._sweep)
