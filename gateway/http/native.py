"""The two inference endpoints served straight from the connection, without the ASGI framework.

Profiled, the framework's request and response objects, routing and ASGI messages cost about
as much CPU as the whole request path of our own (bench/results/profile-plain.md). For
``POST /v1/chat/completions`` and ``POST /v1/completions`` the connection protocol
(:class:`gateway.http.protocol.GuardedHttpToolsProtocol`, which parses, bounds and times
every request) starts a :class:`NativeCycle` instead of an ASGI cycle: it hands the body to
:meth:`gateway.proxy.ProxyService.handle` and writes the :class:`~gateway.replies.Reply` to the
socket itself. Every other path, and any other method on these two, goes through Litestar as
before. The service, its errors and its telemetry are the same code either way.

A cycle offers what the protocol reads and writes of any cycle (:class:`gateway.http.edge.Cycle`:
``body``, ``more_body``, ``message_event``, ``disconnected``, ``keep_alive``,
``response_started``, ``response_complete``) and ``run``, which the protocol calls to start it,
pipelined requests included. The edge rules (header view, body limit, a client that leaves,
after-work) are :mod:`gateway.http.edge`'s, as on the Litestar path. While the client does not
read, writing awaits the connection's ``flow.drain()`` (:class:`gateway.http.edge.FlowControl`).
"""

from __future__ import annotations

import asyncio
import http
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from gateway.http.edge import (
    FlowControl,
    client_gone,
    gone_or_timed_out,
    header_view,
    refuse_declared_length,
    refuse_read_length,
    run_after_work,
)
from gateway.pipeline.deadline import deadline
from gateway.pipeline.replies import Inbound, Reply
from policies.errors import PayloadTooLarge
from policies.requests import RequestKind

T = TypeVar("T")
_log = structlog.get_logger("tiergate.native")

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
# How long the rest of a refused body is read and dropped before the connection closes.
LINGER_S = 5.0
# A stream's kernel send buffer (Linux doubles it): left to autotuning it grows to 4 MiB
# (tcp_wmem), a whole answer a client that stopped reading never sees the flow control of.
STREAM_SNDBUF = 64 * 1024


def _status_line(status: int) -> str:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n"


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


@dataclass(frozen=True, slots=True)
class Route:
    """An inference endpoint: the request kind and the path it is known by."""

    kind: RequestKind
    path: str


# Request targets (before any query) served natively; Litestar also matches a trailing slash.
ROUTES: Mapping[bytes, Route] = {
    b"/v1/chat/completions": Route("chat", CHAT_PATH),
    b"/v1/chat/completions/": Route("chat", CHAT_PATH),
    b"/v1/completions": Route("completion", COMPLETIONS_PATH),
    b"/v1/completions/": Route("completion", COMPLETIONS_PATH),
}


class Handler:
    """What a cycle calls: the proxy service's ``handle``, and the body size limit."""

    __slots__ = ("handle", "max_body_bytes", "stall_s")

    def __init__(
        self,
        handle: Callable[[Inbound, RequestKind, str], Awaitable[Reply]],
        max_body_bytes: int,
        stall_s: float | None = None,
    ) -> None:
        self.handle = handle
        self.max_body_bytes = max_body_bytes
        self.stall_s = stall_s  # server.stream_stall_s (None: only the guard's write timeout)


def reply_head(
    reply: Reply, *, keep_alive: bool, length: int | None, chunked: bool = True
) -> bytes:
    """Status line and headers; ``length`` ``None`` means a chunked body, or, for an HTTP/1.0
    client (``chunked`` false), a body that ends when the connection closes."""
    headers = reply.headers
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
        # A value a backend chose (an error code) holds a line break: no split.
        lines = "".join(
            [
                f"{name}: {value.replace(chr(13), ' ').replace(chr(10), ' ')}\r\n"
                for name, value in headers.items()
            ]
        )
    parts = [_STATUS_LINES.get(reply.status) or _status_line(reply.status), lines]
    parts.append(f"content-type: {reply.media_type}\r\n")
    if length is None:
        if chunked:
            parts.append("transfer-encoding: chunked\r\n")
    else:
        parts.append(f"content-length: {length}\r\n")
    if not keep_alive:
        parts.append("connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1", "replace")


class NativeCycle:
    """One inference request on a connection, from its complete head to its last byte."""

    __slots__ = (
        "_gone",
        "_guarding",
        "_headers",
        "_task",
        "body",
        "chunked",
        "expect_continue",
        "flow",
        "handler",
        "keep_alive",
        "lingering",
        "message_event",
        "more_body",
        "on_response",
        "raw_headers",
        "response_complete",
        "response_started",
        "route",
        "timed_out",
        "transport",
        "was_disconnected",
    )

    def __init__(
        self,
        handler: Handler,
        route: Route,
        raw_headers: list[tuple[bytes, bytes]],
        transport: asyncio.Transport,
        flow: FlowControl,
        *,
        keep_alive: bool,
        expect_continue: bool,
        on_response: Callable[[], None],
        chunked: bool = True,
    ) -> None:
        self.handler = handler
        self.route = route
        self.raw_headers = raw_headers
        self.transport = transport
        self.flow = flow
        self.keep_alive = keep_alive
        self.chunked = chunked  # False for HTTP/1.0: RFC 9112 7.1 forbids chunked to it
        self.expect_continue = expect_continue
        self.on_response = on_response
        self.message_event = asyncio.Event()
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.was_disconnected = False
        self.timed_out = False
        self.lingering = False
        self._headers: dict[str, str] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._guarding = False
        self._gone = False

    @property
    def disconnected(self) -> bool:
        """Whether the client went away before the response was complete."""
        return self.was_disconnected

    @disconnected.setter
    def disconnected(self, value: bool) -> None:
        # The protocol sets this when the connection is lost: while the request is with a
        # backend (or streaming from one), stop that work now so the engine frees its slot.
        self.was_disconnected = value
        task = self._task
        if value and self._guarding and task is not None and not self._gone:
            self._gone = True
            task.cancel()

    @property
    def headers(self) -> Mapping[str, str]:
        """The edge's header view (:func:`gateway.http.edge.header_view`)."""
        headers = self._headers
        if headers is None:
            headers = self._headers = header_view(self.raw_headers)
        return headers

    @property
    def client_host(self) -> str | None:
        """The client's address (asked only when a refusal is logged)."""
        peer = self.transport.get_extra_info("peername")
        return str(peer[0]) if isinstance(peer, tuple | list) and peer else None

    async def read_body(self) -> bytes:
        """The whole body, read up to the limit (413 past it; the connection then closes)."""
        limit = self.handler.max_body_bytes
        try:
            refuse_declared_length(self.headers, limit)
            if self.more_body and self.expect_continue and not self.transport.is_closing():
                self.transport.write(_CONTINUE)
            while self.more_body and not self.was_disconnected:
                refuse_read_length(len(self.body), limit)
                self.flow.resume_reading()
                await self.message_event.wait()
                self.message_event.clear()
            if self.was_disconnected:
                raise gone_or_timed_out(self)
            refuse_read_length(len(self.body), limit)
        except PayloadTooLarge:
            self.keep_alive = False  # the rest of the body is never read
            raise
        return bytes(self.body)

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the client leaves first, cancel it and raise ``ClientGone``."""
        with self._guard():
            try:
                return await work
            except asyncio.CancelledError:
                self._reraise_gone()
                raise

    def _guard(self) -> _Guarded:
        return _Guarded(self)

    def _reraise_gone(self) -> None:
        task = self._task
        if self._gone and task is not None:
            task.uncancel()
            raise client_gone() from None

    async def run(self, _app: object) -> None:
        """Serve the request (the protocol starts every cycle this way)."""
        self._task = asyncio.current_task()
        reply: Reply | None = None
        try:
            reply = await self.handler.handle(self, self.route.kind, self.route.path)
            if reply.stream is not None:
                await self._send_stream(reply)
            else:
                await self._send(reply)
        except Exception:  # noqa: BLE001  # a bug in writing the answer: log it, drop the connection
            _log.exception("request.unhandled_error")
            self.transport.close()
        finally:
            self.on_response = _nothing
            if reply is not None and (reply.finish is not None or reply.after is not None):
                await run_after_work(reply.finish, reply.after)

    async def _send(self, reply: Reply) -> None:
        if self.was_disconnected:
            return
        body = reply.body
        if self.expect_continue and self.more_body:
            self.keep_alive = False  # refused from its head: the client may skip its body
        head = reply_head(reply, keep_alive=self.keep_alive, length=len(body))
        self.response_started = True
        self.transport.write(head + body)
        if self.flow.write_paused:
            # The client is not reading: the next request on this connection waits until it
            # does (or the guard cuts it after write_timeout_s), not its answers in memory.
            await self.flow.drain()
        self._complete()

    async def drain(self) -> None:
        """Wait while the client reads nothing (the transport's writes are paused); return at
        once otherwise. A writer awaits it after each write so that it produces no faster
        than the client reads. A lost connection ends the wait too (the protocol resumes
        writing in ``connection_lost``), as does the guard's abort past ``write_timeout_s``."""
        if self.flow.write_paused:
            await self.flow.drain()

    async def _send_stream(self, reply: Reply) -> None:
        stream = reply.stream
        assert stream is not None  # noqa: S101  # only called for streams
        transport = self.transport
        chunked = self.chunked
        try:
            if self.was_disconnected:  # before the guard: no cancellation left pending
                return
            with self._guard():
                self.response_started = True
                _bound_send_buffer(transport)
                # the head goes out with the first event, in one write
                head = reply_head(reply, keep_alive=self.keep_alive, length=None, chunked=chunked)
                out = _StreamOut(self, reply, head)
                pump = reply.pump
                assert pump is not None  # noqa: S101  # the proxy relays every stream with a pump
                if not await pump(out):
                    return
                transport.write(out.head + _LAST_CHUNK if chunked else out.head)
                self._complete()  # HTTP/1.0: never keep-alive, so the close ends the body
        except asyncio.CancelledError:
            task = self._task
            if not self._gone or task is None:
                raise
            task.uncancel()  # the client left mid-stream: the relay has closed the upstream
        finally:
            await stream.aclose()  # type: ignore[attr-defined]  # an async generator

    async def _drained(self, reply: Reply) -> bool:
        """Wait until a stream's client reads again; if it reads nothing for ``stall_s``,
        cut it (the reply hears why first) and say so."""
        try:
            with deadline(self.handler.stall_s):
                await self.flow.drain()
        except TimeoutError:
            if reply.on_stall is not None:
                reply.on_stall()
            self.keep_alive = False
            self.transport.abort()  # close() would wait for the bytes it does not read
            return False
        return True

    def _complete(self) -> None:
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            if self.more_body:
                # Refused before its body was all in (413): closing now, with bytes unread,
                # makes the kernel reset the connection, and a client still sending would see
                # the reset instead of this answer. Read and drop the rest for a bounded
                # time; the protocol closes once the body ends (``lingering``).
                self.lingering = True
                self.flow.resume_reading()
                asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()
        self.on_response()


class _Guarded:
    """While inside, losing the client cancels the cycle's task (see ``disconnected``)."""

    __slots__ = ("cycle",)

    def __init__(self, cycle: NativeCycle) -> None:
        self.cycle = cycle

    def __enter__(self) -> None:
        cycle = self.cycle
        cycle._guarding = True  # the cycle's own helper
        if cycle.was_disconnected:
            cycle.disconnected = True  # left before the guard: cancel at the first await

    def __exit__(self, *_: object) -> None:
        self.cycle._guarding = False  # the cycle's own helper


class _StreamOut:
    """A stream's client as its chunks are written to it (:class:`Downstream` for a pump)."""

    __slots__ = ("_chunked", "_cycle", "_flow", "_reply", "_transport", "head")

    def __init__(self, cycle: NativeCycle, reply: Reply, head: bytes) -> None:
        self._cycle = cycle
        self._reply = reply
        self._transport = cycle.transport
        self._chunked = cycle.chunked
        self._flow = cycle.flow
        self.head = head  # the response's head, sent with the first write

    def write(self, chunk: bytes) -> None:
        """Send ``chunk``, as one HTTP/1.1 chunk (HTTP/1.0: as it is)."""
        data = _framed(chunk) if self._chunked else chunk
        if self.head:
            data, self.head = self.head + data, b""
        self._transport.write(data)

    @property
    def paused(self) -> bool:
        """The client's buffer is full."""
        return self._flow.write_paused

    @property
    def gone(self) -> bool:
        """The client has left."""
        return self._cycle.was_disconnected

    async def drained(self) -> bool:
        """Wait for the client to read; cut it past ``stall_s`` (``False``)."""
        return await self._cycle._drained(self._reply)  # the cycle's own helper


def _framed(chunk: bytes) -> bytes:
    """``chunk`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(chunk), chunk)


def _bound_send_buffer(transport: asyncio.Transport) -> None:
    """Fix the socket's send buffer at :data:`STREAM_SNDBUF` (no-op without a socket)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
        except OSError:
            return


def _nothing() -> None:
    return None
