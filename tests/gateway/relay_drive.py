"""Both ways a stream relay reaches the client, for tests that check what the client gets.

The Litestar path iterates a :class:`StreamRelay`; the native path runs it through a
:class:`Pump` from the backend connection's callback. ``DRIVES`` names both; :func:`drive`
relays one stream either way into what the client would have received.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gateway.config.tier_settings import Timeouts
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.forwarding import Forwarder, TierRoute
from gateway.upstream.pump import Pump
from gateway.upstream.relay import StreamRelay
from gateway.upstream.replicas import ReplicaPool
from gateway.upstream.retry import RetryPolicy
from policies.selection import RoundRobin
from tests.gateway.raw_upstream import RawUpstream, Respond
from tests.processes import patience

DRIVES = ("iterate", "pump")
PATH = "/v1/chat/completions"


async def open_relay(
    upstream: UpstreamClient, respond: Respond, *, idle_s: float = 0.2
) -> tuple[StreamRelay, ReplicaPool, RawUpstream]:
    """A relay over ``respond``'s stream, opened through the forwarder (its first event read)."""
    server = await RawUpstream(respond).start()
    pool = ReplicaPool("fast", [server.url], 8, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(), "m")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    forwarded = await forwarder.forward(PATH, body, ["fast"])
    relay = StreamRelay(forwarded.exchange, strip_usage=False, idle_s=idle_s,
                        on_close=lambda _outcome, _usage: None)  # fmt: skip
    return relay, pool, server


class Recorder:
    """A client for a pump: keeps what it is sent; ``pause()`` makes it stop reading."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.paused = False
        self.gone = False
        self.stalled = False  # drained() answers False at once: the writer cut it
        self.on_stall: Callable[[], None] | None = None  # called before such a cut
        self._reading = asyncio.Event()
        self._reading.set()
        self.on_write: Callable[[Recorder], None] | None = None

    def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        if self.on_write is not None:
            self.on_write(self)

    def pause(self) -> None:
        self.paused = True
        self._reading.clear()

    def resume(self) -> None:
        self.paused = False
        self._reading.set()

    async def drained(self) -> bool:
        if self.stalled:
            if self.on_stall is not None:
                self.on_stall()
            return False
        await self._reading.wait()
        return True

    @property
    def text(self) -> bytes:
        return b"".join(self.chunks)


async def drive(
    relay: StreamRelay,
    how: str,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> bytes:
    """Relay the whole stream ``how`` (one of ``DRIVES``); what the client received."""
    if how == "iterate":
        return b"".join([chunk async for chunk in relay])
    out = Recorder()
    assert await Pump(relay, settle=settle)(out)
    return out.text


class Flood:
    """A backend script: ``start``, then ``writes`` chunked writes of ``piece`` as fast as the
    gateway takes them (about 17 MB by default: more than every buffer on the way), then
    ``end``; ``sent`` counts the writes made."""

    def __init__(self, start: bytes, piece: bytes, end: bytes, writes: int = 20_000) -> None:
        self.start, self.piece, self.end, self.writes = start, piece, end, writes
        self.sent = 0

    async def __call__(self, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(self.start)
        try:
            for _ in range(self.writes):
                w.write(b"%x\r\n%s\r\n" % (len(self.piece), self.piece))
                self.sent += 1
                await w.drain()
        except ConnectionError:
            return False
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.end), self.end))
        return True

    async def held(self) -> int:
        """Wait until the backend's writes stop (0.3 s without one); the count then."""
        before, deadline = -1, time.monotonic() + patience(5.0)
        while self.sent != before and time.monotonic() < deadline:
            before = self.sent
            await asyncio.sleep(0.3)
        return self.sent
