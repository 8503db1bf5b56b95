"""Serving the listening socket: every queued connection is accepted as soon as it is seen.

uvloop's own server accepts one connection per event-loop iteration. With thousands of open
streams an iteration takes milliseconds, so a burst of new connections waited in the kernel's
accept queue for seconds while the gateway's own time to first token looked fine (issue 37:
`make bench-streams`, the accept queue column). Here a reader on the listening socket takes
every waiting connection (up to :data:`ACCEPT_BATCH` per wake-up) and hands each to the server's
protocol through ``loop.connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import signal
import socket
from collections.abc import Callable, Generator
from types import FrameType

import structlog
import uvicorn

from gateway.telemetry.lifecycle import ServerEvents

_log = structlog.get_logger("tiergate.server")
# Connections taken per wake-up of the listening socket; the loop then serves everything else
# once before the next batch, so a flood of connections cannot starve open streams.
ACCEPT_BATCH = 1024
# Out of file descriptors: stop accepting this long (the kernel keeps queueing), then retry.
ACCEPT_RETRY_S = 0.5
_OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the listening sockets served by :class:`Acceptor`; ``events``
    (if given) logs when it starts serving, and what its graceful shutdown drained.

    ``sigint=False`` (a worker of a group) ignores SIGINT: a terminal's Ctrl-C reaches every
    process of the group, the supervisor passes SIGTERM on, and uvicorn would take a SIGINT
    arriving after that SIGTERM as "quit now" and cut the streams it drains."""

    acceptors: list[Acceptor]

    def __init__(
        self,
        config: uvicorn.Config,
        events: ServerEvents | None = None,
        before_exit: Callable[[], object] | None = None,
        *,
        sigint: bool = True,
    ) -> None:
        super().__init__(config)
        self.events = events
        self.before_exit = before_exit
        self.sigint = sigint

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's: the first SIGINT or SIGTERM drains, a SIGINT after it forces the exit;
        SIGINT is ignored where ``sigint`` is False."""
        if sig == signal.SIGINT and not self.sigint:
            return
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's signal capture; ``before_exit`` runs once serving is over and before
        uvicorn raises the captured SIGTERM again, which ends the process at once (the log
        lines of the shutdown would otherwise die in the writer's queue)."""
        with super().capture_signals():
            try:
                yield
            finally:
                if self.before_exit is not None:
                    self.before_exit()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up without its listeners; then one acceptor per socket."""
        self.acceptors = []
        if sockets is None:  # host/port given to uvicorn itself: keep its own listener
            await super().startup(sockets=None)
            return
        await super().startup(sockets=[])
        if self.should_exit or not self.started:
            return
        factory: Callable[[], asyncio.Protocol] = functools.partial(
            self.config.http_protocol_class,
            config=self.config,  # type: ignore[call-arg]  # as uvicorn builds Config(http=...)
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        loop = asyncio.get_running_loop()
        for sock in sockets:
            # As loop.create_server does: a bound socket starts listening here (again, with
            # the same backlog, for a worker's inherited socket that already listens).
            sock.listen(self.config.backlog)
        self.acceptors = [Acceptor(loop, sock, factory) for sock in sockets]
        if self.events is not None and sockets:
            self.events.started(sockets[0].getsockname()[1])

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting first, then uvicorn's graceful shutdown."""
        for acceptor in getattr(self, "acceptors", []):
            acceptor.close()
        events = self.events
        if events is not None:
            events.draining(self.server_state.tasks, len(self.server_state.connections))
        await super().shutdown(sockets=sockets)
        if events is not None:
            events.stopped()


class Acceptor:
    """Accepts every connection queued on ``sock`` whenever the loop sees it readable."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self.accept_all)

    def accept_all(self) -> None:
        """Take up to :data:`ACCEPT_BATCH` waiting connections and start serving each."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    self.pause(exc)
                elif exc.errno == errno.EINVAL:  # no longer listening (a group's supervisor
                    self.close()  # shut it down to drain): it stays readable, so stop reading
                return  # a connection reset before it was taken: nothing to serve
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self.loop.create_task(self.serve(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def serve(self, conn: socket.socket) -> None:
        """Attach the server's protocol to one accepted connection."""
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except OSError:
            conn.close()

    def pause(self, exc: OSError) -> None:
        """Out of descriptors: stop reading the listening socket for a moment."""
        _log.warning("server.accept_paused", error=exc.strerror, retry_s=ACCEPT_RETRY_S)
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(ACCEPT_RETRY_S, self.resume)

    def resume(self) -> None:
        """Read the listening socket again (unless closed meanwhile)."""
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self.accept_all)

    def close(self) -> None:
        """Stop accepting; connections already served are left to uvicorn's shutdown."""
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
