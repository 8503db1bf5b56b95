"""The edge rules, once for every way a request comes in.

Two inbound paths serve requests: the native cycle (:mod:`gateway.http.native`, the two
inference endpoints straight from the connection) and Litestar (:mod:`gateway.http.app`, every
other route, and the in-process test client), itself served by the project's own ASGI cycle
(:mod:`gateway.http.asgi`). Both take from here what a client sees at the edge: the header view
(one Authorization, merged), the body limit (413), the error bytes the server writes itself,
what a client that leaves turns into, the after-work policy, and the connection's flow control
(``drain``). ``tests/gateway/http/test_edge_contract.py`` runs the same rules against every path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import httptools
import structlog

from gateway.pipeline.errors import BodyTimedOut, ClientGone, error_body
from policies.errors import PayloadTooLarge

_log = structlog.get_logger("tiergate.edge")

# ASGI's callables, spelled out here (the ASGI spec's shapes; no framework's private types).
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


class Cycle(Protocol):
    """What the protocol reads and writes of a request's cycle (ASGI or native)."""

    body: bytearray
    more_body: bool
    message_event: asyncio.Event
    disconnected: bool
    # The body was cut off by ``server.body_timeout_s`` (the client was sent 408).
    timed_out: bool
    keep_alive: bool
    response_started: bool
    response_complete: bool

    async def run(self, app: ASGIApp) -> None:
        """Serve the request."""


GONE_MESSAGE = "The client closed the connection."
TOO_LARGE_MESSAGE = "The request body is too large."


def header_view(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers, names in lower case, the first of a repeated name; a repeated
    Authorization is its values joined with ", " (RFC 9110 5.3), which no key matches."""
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key in headers:
            if key == "authorization":
                headers[key] += ", " + value.decode("latin-1")
            continue
        headers[key] = value.decode("latin-1")
    return headers


def refuse_declared_length(headers: Mapping[str, str], limit: int) -> None:
    """413 before reading: a declared ``Content-Length`` over ``limit``."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(TOO_LARGE_MESSAGE)


def refuse_read_length(size: int, limit: int) -> None:
    """413 while reading: more body bytes than ``limit`` have arrived."""
    if size > limit:
        raise PayloadTooLarge(TOO_LARGE_MESSAGE)


def client_gone() -> ClientGone:
    """What a request whose client left is ended with (499 in its metrics and spans)."""
    return ClientGone(GONE_MESSAGE)


def gone_or_timed_out(cycle: Cycle) -> ClientGone | BodyTimedOut:
    """What a request whose connection closed while its body was read is ended with: 408
    when the edge cut it off for a stalled body (what the client was sent), else 499."""
    if cycle.timed_out:
        return BodyTimedOut(TIMED_OUT_MESSAGE, code="request_timeout")
    return client_gone()


def cut_off(cycle: Cycle | None, transport: asyncio.Transport) -> None:
    """Write the 408 of a request cut off by a timeout, and tell ``cycle`` when it is the
    request whose body was still awaited (its access line and metrics then say 408)."""
    if cycle is not None and cycle.more_body:
        cycle.timed_out = True
    transport.write(TIMED_OUT)


async def run_after_work(
    finish: Callable[[], None] | None, after: Callable[[], Awaitable[None]] | None
) -> None:
    """A reply's after-work, once the answer is out: ``finish`` (never waits), then ``after``.
    A failure of either is logged (``request.after_failed``), never raised into the
    connection: nothing is left to answer, and the other step still runs."""
    if finish is not None:
        try:
            finish()
        except Exception:  # noqa: BLE001  # nothing is left to answer: log and carry on serving
            _log.exception("request.after_failed")
    if after is not None:
        try:
            await after()
        except Exception:  # noqa: BLE001  # nothing is left to answer: log and carry on serving
            _log.exception("request.after_failed")


def raw_error(
    status: int, reason: str, message: str, code: str, extra: tuple[bytes, ...] = ()
) -> bytes:
    """A complete HTTP/1.1 error response with an OpenAI-shaped body that closes the connection."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = error_body(message, kind, None, code)
    head = [
        f"HTTP/1.1 {status} {reason}".encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def refusing_app(
    status: int, message: str, code: str, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> ASGIApp:
    """An ASGI app answering ``status`` with an OpenAI-shaped error (the body ``raw_error``
    writes), then closing the connection: served in the request's turn, so requests pipelined
    before it get their answers first."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = error_body(message, kind, None, code)
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *extra,
            (b"connection", b"close"),
        ],
    }

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


_OVER_CAPACITY_MESSAGE = "The gateway is at its connection limit; retry shortly."
# What the protocol writes itself, then closes (each counted as a shed reason).
OVER_CAPACITY = raw_error(
    503, "Service Unavailable", _OVER_CAPACITY_MESSAGE, "server_overloaded", (b"retry-after: 1",)
)
TIMED_OUT_MESSAGE = "The request was not received in time."
TIMED_OUT = raw_error(408, "Request Timeout", TIMED_OUT_MESSAGE, "request_timeout")
BAD_REQUEST = raw_error(
    400, "Bad Request", "The request is not valid HTTP/1.1.", "invalid_http_request"
)
UNSUPPORTED_CODING = raw_error(
    501,
    "Not Implemented",
    "Only the chunked transfer coding is supported in requests.",
    "unsupported_transfer_encoding",
)
# Answered in the request's turn, then the connection closes: a request on a connection
# accepted over the cap (not an ops path); CONNECT (what follows is a tunnel's bytes); a
# chunked body behind an upgrade offer (it cannot be framed past the parser's stop there).
OVER_CAPACITY_APP = refusing_app(
    503, _OVER_CAPACITY_MESSAGE, "server_overloaded", ((b"retry-after", b"1"),)
)
CONNECT_REFUSED = refusing_app(405, "CONNECT is not supported.", "method_not_allowed")
CHUNKED_OFFER_REFUSED = refusing_app(
    400,
    "A request that offers a protocol upgrade must send its body with Content-Length, not "
    "chunked; or send it without the Upgrade header (curl: --http1.1).",
    "unsupported_upgrade",
)


def head_too_large(limit: int) -> bytes:
    """The 431 for a request line and headers over ``limit`` bytes."""
    return raw_error(
        431,
        "Request Header Fields Too Large",
        f"The request line and headers exceed {limit} bytes.",
        "request_header_fields_too_large",
    )


def request_parser(protocol: object) -> httptools.HttpRequestParser:
    """A request parser calling back ``protocol``; bytes after a ``Connection: close`` request
    are not an error (the requests before it still get their answers)."""
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


class TrailerWatch:
    """A parser callback for the protocol: after a chunk's size line and before its data, what
    is fed may be the last chunk's trailers (llhttp hands a chunk's data on as it arrives)."""

    trailing = False

    def on_chunk_header(self) -> None:
        """A chunk's size line (httptools calls it when the protocol has it)."""
        self.trailing = True


class FlowControl:
    """A connection's reading and writing, paused and resumed; ``drain`` waits for the client.

    The transport calls the protocol's ``pause_writing`` when its buffer passes the high-water
    mark (the client is not reading) and ``resume_writing`` once it drained; a writer awaits
    :meth:`drain` after a write to stop producing meanwhile. Reading is paused to stop taking
    a body (or pipelined requests) faster than the request in turn consumes it.
    """

    __slots__ = ("_transport", "_writable", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    async def drain(self) -> None:
        """Return once the client reads again (at once when writes are not paused)."""
        await self._writable.wait()

    def pause_reading(self) -> None:
        """Stop reading the socket."""
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the socket again."""
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        """The transport's buffer is full: writers wait in :meth:`drain`."""
        if not self.write_paused:
            self.write_paused = True
            self._writable.clear()

    def resume_writing(self) -> None:
        """The buffer drained (or the connection is gone): writers go on."""
        if self.write_paused:
            self.write_paused = False
            self._writable.set()
