"""One request served by an ASGI app (Litestar: admin, ops, metrics, every non-native route).

The connection protocol (:mod:`gateway.http.protocol`) parses and bounds the request; an
:class:`AsgiCycle` hands it to the app as an ASGI ``http`` scope, gives the body through
``receive`` (``http.disconnect`` once the client is gone or the answer is complete) and writes
what ``send`` gets: a ``Content-Length`` body as is, anything else chunked, paused while the
client does not read (the edge's ``drain``). It offers the same attributes as the native cycle
(``body``, ``more_body``, ``message_event``, ``disconnected``, ``keep_alive``,
``response_started``, ``response_complete``, ``run``), which is all the protocol reads.
"""

from __future__ import annotations

import asyncio
import http
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
import structlog

from gateway.http.edge import ASGIApp, FlowControl, Message, raw_error

_log = structlog.get_logger("tiergate.asgi")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Bytes never allowed in a header name or value an app sends (no response splitting).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_INTERNAL_ERROR = raw_error(
    500, "Internal Server Error", "The server had an error.", "internal_error"
)


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %b\r\n" % (status, phrase)


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


def address(info: object) -> tuple[str, int] | None:
    """A socket address as ASGI's ``(host, port)``."""
    if isinstance(info, tuple | list) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def http_scope(
    method: bytes,
    target: bytes,
    http_version: str,
    headers: list[tuple[bytes, bytes]],
    *,
    root_path: str,
    server: tuple[str, int] | None,
    client: tuple[str, int] | None,
    state: dict[str, Any],
) -> dict[str, Any]:
    """The ASGI ``http`` scope of a parsed request head (ASGI 3.0, spec 2.3)."""
    url = httptools.parse_url(target)
    raw_path = url.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": http_version,
        "server": server,
        "client": client,
        "scheme": "http",
        "root_path": root_path,
        "headers": headers,
        "state": state,
        "method": method.decode("ascii"),
        "path": root_path + path,
        "raw_path": root_path.encode("ascii") + raw_path,
        "query_string": url.query or b"",
    }


class AsgiCycle:
    """One request handed to an ASGI app, from its complete head to its answer's last byte."""

    __slots__ = (
        "body",
        "chunked",
        "disconnected",
        "flow",
        "keep_alive",
        "length_left",
        "message_event",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "timed_out",
        "transport",
        "waiting_for_continue",
    )

    def __init__(
        self,
        scope: dict[str, Any],
        transport: asyncio.Transport,
        flow: FlowControl,
        *,
        keep_alive: bool,
        expect_continue: bool,
        on_response: Callable[[], None],
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.keep_alive = keep_alive
        self.waiting_for_continue = expect_continue
        self.on_response = on_response
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.timed_out = False
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked: bool | None = None
        self.length_left = 0

    async def run(self, app: ASGIApp) -> None:
        """Call the app; an app that fails before answering gets an OpenAI-shaped 500."""
        try:
            await app(self.scope, self.receive, self.send)
        except Exception:  # noqa: BLE001  # an app's bug: logged, answered 500 if still possible
            _log.exception("request.unhandled_error")
            if not self.response_started:
                self._fail()
            else:
                self.transport.close()
        else:
            if not self.response_started and not self.disconnected:
                _log.error("request.no_response")
                self._fail()
            elif not self.response_complete and not self.disconnected:
                _log.error("request.incomplete_response")
                self.transport.close()
        finally:
            self.on_response = _nothing

    def _fail(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(_INTERNAL_ERROR)
            self.transport.close()

    async def receive(self) -> Message:
        """The next body chunk; ``http.disconnect`` once the client left or the answer is out."""
        if self.waiting_for_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def send(self, message: Message) -> None:
        """Write the answer's head or a piece of its body (waiting while the client is slow)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind!r}")
            self._start(message)
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {kind!r}")
            self._body(message.get("body", b""), more=message.get("more_body", False))
        else:
            raise RuntimeError(f"{kind!r} sent after the response was complete")

    def _start(self, message: Message) -> None:
        headers = message.get("headers", ())
        if any(_BAD_NAME.search(name) or _BAD_VALUE.search(value) for name, value in headers):
            raise RuntimeError("invalid HTTP header in the response")  # the app may answer 500
        self.response_started = True
        if self.waiting_for_continue and self.more_body:
            self.keep_alive = False  # its body was never asked for: the client may skip it
        self.waiting_for_continue = False
        status = message["status"]
        content = [_STATUS_LINES.get(status) or _status_line(status)]
        closing = False
        for raw_name, value in headers:
            name = raw_name.lower()
            if name == b"content-length" and self.chunked is None:
                self.length_left = int(value)
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.length_left = 0
                self.chunked = True
            elif name == b"connection" and b"close" in [
                token.strip().lower() for token in value.split(b",")
            ]:
                self.keep_alive = False
                closing = True
            content.append(b"%b: %b\r\n" % (name, value))
        if not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        bodiless = self.scope["method"] == "HEAD" or status in (204, 304)
        if self.chunked is None and not bodiless:
            self.chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

    def _body(self, body: bytes, *, more: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.length_left = 0
        elif self.chunked:
            chunk = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            self.transport.write(chunk if more else chunk + b"0\r\n\r\n")
        else:
            if len(body) > self.length_left:
                raise RuntimeError("response body longer than its Content-Length")
            self.length_left -= len(body)
            self.transport.write(body)
        if more:
            return
        if self.length_left:
            raise RuntimeError("response body shorter than its Content-Length")
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


def _nothing() -> None:
    return None
