"""Relaying a stream from the backend connection's own callback: no task wake-up per event.

:class:`~gateway.upstream.relay.StreamRelay` read as an async iterator costs a future, a task
step and two generator resumptions for every read from the backend, for one write to the
client; at thousands of open streams that is most of the gateway's Python time per event
(bench/results/streams-pump-ab.md). A :class:`Pump` diverts the backend connection's body to
the relay as the parser hands it over (:meth:`Connection.divert`), and writes what the relay
lets through to the client in the same callback. The request's task sleeps until there is
something only it can do: the client's buffer is full (it waits for the client to read, and
cuts a client that stalls), the answer ended (it writes the ending, settles, and finishes),
the connection broke, or the request is cancelled because the client left.

The relay's contract is unchanged (:mod:`gateway.upstream.relay`): the same events, the same
ending, the same outcome and cut, ``on_close`` exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gateway.pipeline.events import Outcome
from gateway.pipeline.replies import Downstream
from gateway.upstream.connection import Connection
from gateway.upstream.relay import DATA_LINE, StreamRelay


class Pump:
    """Relays one stream from the backend connection's callback (see the module)."""

    __slots__ = ("_conn", "_held", "_out", "_pending", "_relay", "_settle_first", "_settled")

    def __init__(
        self,
        relay: StreamRelay,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._relay = relay
        self._settle_first = settle
        self._out: Downstream | None = None
        self._conn: Connection | None = None
        self._held = b""  # the chunk with [DONE], held until the request is settled
        self._settled = False
        self._pending: list[bytes] = []  # what one read from the backend lets through

    async def __call__(self, out: Downstream) -> bool:
        """Relay the whole stream to ``out``; ``False`` if the client stalled and was cut
        (or left) before its end. With ``settle``, the request is settled before the chunk
        that carries ``[DONE]`` is written (the relay still open: a client that leaves
        meanwhile never got ``[DONE]`` and the stream is not complete), or after the relay
        closed when the stream ends without one."""
        relay = self._relay
        response = relay.exchange.opened.response
        assert response is not None  # noqa: S101  # streams keep their response
        conn = self._conn = response.connection
        self._out = out
        relay.start_timers()
        try:
            if not await self._relay_all(conn, out):
                return False
            if self._held:  # the chunk with [DONE]: settle first, then the client gets it
                await self._release_held(out)
                if self._held:
                    return False
            if out.paused and not await out.drained():
                return False  # the end is not the client's until it reads it: a stall still cuts
        finally:
            conn.divert(None)
            if self._held and relay.outcome == Outcome.COMPLETE:
                relay.outcome = Outcome.CLIENT_DISCONNECT  # it never got the [DONE]
            relay.finish()
            self._out = self._conn = None
        if self._settle_first is not None and not self._settled:
            await self._settle_first()
        return True

    async def _relay_all(self, conn: Connection, out: Downstream) -> bool:
        """The first event, the body and the stream's ending; ``False`` if the client stalled
        or left first."""
        relay = self._relay
        try:
            self._send(relay.feed(relay.exchange.first_event, framed=True))
            if not await self._relay_body(conn, out):
                return False
            self._send(relay.ending())
        except OSError:
            self._send(relay.lost())
        except Exception:  # noqa: BLE001  # a bug on an odd event: end the stream readably, not cut
            self._send(relay.internal_error())
        return True

    async def _release_held(self, out: Downstream) -> None:
        """Settle, then write the held chunk (left held if the client is gone by then)."""
        settle = self._settle_first
        assert settle is not None  # noqa: S101  # only settling first holds a chunk
        self._settled = True
        await settle()
        if not out.gone:
            out.write(self._held)
            self._held = b""

    async def _relay_body(self, conn: Connection, out: Downstream) -> bool:
        """Relay until the backend's body ends or the relay stops reading it."""
        relay = self._relay
        while not relay.stopped:
            if out.paused:
                relay.reading_since = 0.0  # waiting for the client, not the backend
                if not await out.drained():
                    return False
            if out.gone:
                return False
            if data := conn.take():  # what arrived while the client was not reading
                self._send(relay.feed(data))
                continue
            if conn.complete:
                break
            conn.check_lost()
            relay.reading_since = time.monotonic()
            conn.divert(self._received, self._flush)
            try:
                await conn.wait()
            finally:
                conn.divert(None)
        return True

    def _received(self, data: bytes) -> None:
        """A piece of the body, in the connection's callback: relay it (what goes to the
        client waits for the end of the read, :meth:`_flush`)."""
        relay, out, conn = self._relay, self._out, self._conn
        if out is None or conn is None:
            return
        if out.gone:
            conn.divert(None)  # buffered from here; the task is being cancelled
            return
        try:
            chunk = relay.feed(data)
            if DATA_LINE in chunk:  # an event with data (not a keep-alive comment, not a piece of
                relay.reading_since = time.monotonic()  # an event): the idle clock restarts
        except Exception:  # noqa: BLE001  # a bug on an odd event: end the stream readably
            chunk = relay.internal_error()
        if chunk:
            if self._settle_first is not None and relay.done:
                self._held += chunk
            else:
                self._pending.append(chunk)
        if relay.stopped:
            conn.divert(None)  # the rest of the read waits in the connection's buffer

    def _flush(self) -> None:
        """The end of one read from the backend: write what it let through in one piece;
        wake the task when it has something to do."""
        pending, out, conn = self._pending, self._out, self._conn
        if out is None or conn is None:
            return
        if pending:
            out.write(pending[0] if len(pending) == 1 else b"".join(pending))
            pending.clear()
        if self._relay.stopped or out.paused or out.gone:
            conn.divert(None)
            conn.wake()

    def _send(self, chunk: bytes) -> None:
        """Write ``chunk`` to the client; hold the one with ``[DONE]`` if settling first."""
        if not chunk:
            return
        if self._settle_first is not None and self._relay.done:
            self._held += chunk
            return
        out = self._out
        if out is not None:
            out.write(chunk)
