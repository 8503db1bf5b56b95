"""What the inference endpoints answer, as plain values any HTTP server layer can write.

The endpoints run behind two server layers: the Litestar app (every path, and the only one the
in-process test client sees) and the gateway's own HTTP path in :mod:`gateway.http.native`, which
serves the two inference endpoints straight from the connection without the framework. Both
hand the service an :class:`Inbound` and write back the :class:`Reply` it returns, so the
request path, its errors and its telemetry are one piece of code whichever layer serves it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.pipeline.errors import error_body
from policies.errors import TierGateError

T = TypeVar("T")

JSON = "application/json"
EVENT_STREAM = "text/event-stream; charset=utf-8"


class Inbound(Protocol):
    """One inference request as the server layer received it."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Request headers, names in lower case (the first of repeated names; a repeated
        Authorization is its values joined with ", ", so two keys authenticate as neither)."""
        ...

    @property
    def client_host(self) -> str | None:
        """The client's address (read only when a refusal is logged)."""
        ...

    async def read_body(self) -> bytes:
        """The whole request body (:class:`policies.errors.PayloadTooLarge` past the limit)."""
        ...

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the client leaves first, cancel it and raise ``ClientGone``."""
        ...


class Downstream(Protocol):
    """A stream's client, as a server layer offers it to a reply's ``pump``."""

    def write(self, chunk: bytes) -> None:
        """Send ``chunk`` (framed as the response needs)."""
        ...

    @property
    def paused(self) -> bool:
        """The client's buffer is full: write nothing more until :meth:`drained`."""
        ...

    @property
    def gone(self) -> bool:
        """The client has left."""
        ...

    async def drained(self) -> bool:
        """Wait until the client reads again; ``False``: it stalled and was cut."""
        ...


@dataclass(slots=True)
class Reply:
    """A response: a whole ``body`` or a ``stream`` of chunks, then ``after`` (off the path)."""

    status: int
    headers: dict[str, str]
    media_type: str = JSON
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    after: Callable[[], Awaitable[None]] | None = None
    # After-work that never waits (recording the request), run before ``after``.
    finish: Callable[[], None] | None = None
    # A stream's writer calls this before it cuts a client that stopped reading.
    on_stall: Callable[[], None] | None = None
    # The same stream, written by the reply itself to a server layer that offers it a
    # :class:`Downstream` (then ``stream`` is never iterated): ``False`` if the client stalled
    # or left before its end. The native server relays streams only this way; the Litestar
    # app iterates ``stream``.
    pump: Callable[[Downstream], Awaitable[bool]] | None = None


def error_reply(exc: TierGateError, headers: dict[str, str]) -> Reply:
    """The OpenAI-shaped answer to a domain error, with the request's own headers."""
    headers.update(exc.headers)
    body = error_body(exc.message, exc.error_type, exc.param, exc.code)
    return Reply(exc.status, headers, body=body)


def internal_error_reply(headers: Mapping[str, str]) -> Reply:
    """The answer to a bug: never a traceback or anything of the request."""
    body = error_body("Internal gateway error.", "server_error", None, "internal_error")
    return Reply(500, dict(headers), body=body)
