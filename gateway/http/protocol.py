"""The server's own HTTP/1.1 connection protocol: asyncio and httptools' parser, bounded.

One :class:`GuardedHttpToolsProtocol` per client connection parses requests with
``httptools.HttpRequestParser`` and starts one cycle per request: the native cycle for the two
inference endpoints (:mod:`gateway.http.native`) or an ASGI cycle for everything else
(:mod:`gateway.http.asgi`, Litestar). It is built on public APIs only; uvicorn runs the process
and constructs it as the class named by ``uvicorn.Config(http=...)``.

httptools has no limit on a request head and grows a header value by concatenation. This
protocol counts the bytes fed while a head is incomplete (a chunked body's trailers with its
head) and answers 431 past ``max_head_bytes``, before feeding more. Deadlines are enforced by
:class:`gateway.connections.ConnectionGuard`'s sweeper; this class stamps the phase changes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import httptools

from gateway.http.asgi import AsgiCycle, address, http_scope
from gateway.http.connections import ConnectionGuard, Phase, Shed
from gateway.http.edge import (
    BAD_REQUEST,
    CHUNKED_OFFER_REFUSED,
    CONNECT_REFUSED,
    OVER_CAPACITY,
    OVER_CAPACITY_APP,
    UNSUPPORTED_CODING,
    ASGIApp,
    Cycle,
    FlowControl,
    TrailerWatch,
    cut_off,
    head_too_large,
    request_parser,
)
from gateway.http.native import ROUTES, Handler, NativeCycle

# Bytes read and kept unparsed behind a request waiting its turn, before reading pauses.
HOLD_LIMIT = 64 * 1024
# Body bytes buffered for the request in turn before reading pauses until it takes them.
BODY_HIGH_WATER = 64 * 1024
# Requests queued behind the one being answered. One read can hold thousands of tiny
# pipelined requests, each a cycle object once parsed: past this depth the queued ones are
# answered and the connection closes; the rest is never parsed (clients resend requests a
# closed connection left unanswered, RFC 9112 9.3.2).
MAX_PIPELINE = 32
# Served on connections accepted over the cap: a probe must still see the process alive.
OPS_PATHS = frozenset({b"/livez", b"/readyz"})


class GuardedHttpToolsProtocol(TrailerWatch, asyncio.Protocol):
    """One client connection, within the guard's limits.

    Constructed as uvicorn constructs the class of ``uvicorn.Config(http=...)``: the config
    (its public ``loaded_app`` and ``root_path``), the server state (its ``connections`` and
    ``tasks``, which graceful shutdown waits for) and the lifespan state.
    """

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        guard: ConnectionGuard,
        native: Handler | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app: ASGIApp = config.loaded_app
        self.root_path: str = config.root_path
        self.loop = _loop or asyncio.get_event_loop()
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.app_state = app_state
        self.parser = request_parser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.flow: FlowControl = None  # type: ignore[assignment]  # connection_made
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.pipeline: deque[tuple[Cycle, ASGIApp]] = deque()
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100_continue = False
        self.cycle: Cycle | None = None  # the newest request's
        self.guard = guard
        self.native = native
        self.phase = Phase.HEAD
        self.since = 0.0
        self.body_started = 0.0
        self.body_bytes = 0
        self._head_fed = 0
        self._head_size = 0
        self._reading_head = True  # from a message's first byte to its headers' end
        self._refusal: tuple[str, bytes] | None = None  # (shed reason, response) to send
        self._ops_only = False
        self._serving: Cycle | None = None  # the cycle being answered
        self._held: list[bytes] | None = None  # read behind a waiting request, not yet parsed
        self._held_size = 0
        # A request whose head offered a protocol upgrade: its body's length (None: chunked),
        # then the body bytes still to hand over (see ``_past_upgrade``).
        self._upgrade_body: int | None = -1
        self._raw_left = 0
        self._discarding = False
        # After a refusal or a pipeline past MAX_PIPELINE: no later request is served (the
        # parser's callbacks do nothing); ``_final`` is the refusal, written once the answers
        # owed to the requests before it are out.
        self._ignoring = False
        self._final: bytes | None = None
        self._bad_coding = False  # a transfer coding other than chunked in this head
        self.write_paused_at = 0.0
        self._next_waits = False  # a queued request waits for the client to read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Admit the connection, or shed it when the server is past its reserve."""
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = address(transport.get_extra_info("sockname"))
        self.client = address(transport.get_extra_info("peername"))
        now = self.loop.time()
        self.since = now
        guard = self.guard
        guard.start_sweeping(self.loop)
        admitted = guard.admit(self, now)
        if admitted is None:
            transport.write(OVER_CAPACITY)
            transport.close()
        elif not admitted:
            self._ops_only = True

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; the cycle being answered, and the newest, learn the client is
        gone (a request pipelined behind the one being answered would otherwise go on, and its
        backend keep generating, for nobody)."""
        self.guard.release(self)
        self.connections.discard(self)
        for cycle in (self._serving, self.cycle):
            if cycle is not None:
                if not cycle.response_complete:
                    cycle.disconnected = True
                cycle.message_event.set()
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
        # The parser holds this protocol (its callbacks) and any partial head: break the cycle
        # now, so both are freed by reference counting, not at the next full collection.
        self.parser = None  # type: ignore[assignment]  # no bytes come after connection_lost

    def shutdown(self) -> None:
        """Graceful shutdown (uvicorn calls it on every connection): close when idle, else
        after the answer in progress."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    def _start_asgi_task(self, cycle: Cycle, app: ASGIApp) -> None:
        """Start answering ``cycle`` (the next in line), remembered until the next starts; its
        task is the server's to wait for at shutdown."""
        self._serving = cycle
        task = self.loop.create_task(cycle.run(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def shed(self, reason: str) -> None:
        """Close for ``reason``; a request cut off mid-way is told 408 first."""
        transport = self.transport
        if reason == Shed.WRITE_TIMEOUT:
            transport.abort()  # close() would wait for the bytes the client does not read
            return
        if transport.is_closing():
            return
        if self._owes_timeout(reason):
            cut_off(self.cycle, transport)  # 408, and the request ends 408, not 499
        self._close()

    def _close(self) -> None:
        """Close a connection the guard no longer counts: at once (``abort``) when bytes the
        client has not read are still buffered, since ``close`` would wait for them, and an
        uncounted socket would hold its descriptor and buffer past every deadline."""
        transport = self.transport
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    def _owes_timeout(self, reason: str) -> bool:
        """Whether closing for ``reason`` cuts off a request that should hear 408 first."""
        serving = self._serving
        if serving is not None and serving.response_started and not serving.response_complete:
            return False  # an answer is on the wire: a 408 now would land inside it
        if reason == Shed.HEAD_TIMEOUT:
            return self._reading_head and self._head_fed > 0
        cycle = self.cycle
        return reason == Shed.BODY_TIMEOUT and (cycle is None or not cycle.response_started)

    def _answering(self) -> bool:
        """Whether answers are still owed to requests that came before."""
        serving = self._serving
        return bool(self.pipeline) or (serving is not None and not serving.response_complete)

    def _refuse(self, reason: str, response: bytes) -> None:
        """Answer ``response`` and close; nothing after the refused request is served.

        Requests before it still get their answers first, in order (a refusal written at once
        would land inside an answer being streamed, or before answers a pipelining client
        waits for), unless the newest request's own body is cut off by it.
        """
        guard = self.guard
        guard.note_shed(reason, self.loop.time())
        self._serve_no_more()
        self.phase = Phase.BUSY
        serving = self._serving
        cycle = self.cycle
        pipeline = self.pipeline
        queued = cycle is not None and cycle is not serving and pipeline and pipeline[0][0] is cycle
        if queued and pipeline[0][0].more_body:  # its body is cut off: refused with what follows
            pipeline.popleft()
        cut_short = serving is not None and serving is cycle and serving.more_body
        if self._answering() and not cut_short:
            self._final = response
            return
        guard.release(self)
        # Nothing is owed, or the request being answered has its own body cut off: it hears
        # the refusal unless its answer has begun (an early answer whose body still came).
        if serving is None or not serving.response_started or not serving.more_body:
            self.transport.write(response)
        self._close()

    def _overflow(self) -> None:
        """Too many pipelined requests: answer the queued ones, then close (see MAX_PIPELINE)."""
        self.guard.note_shed(Shed.PIPELINE_TOO_DEEP, self.loop.time())
        self._serve_no_more()
        self.pipeline[0][0].keep_alive = False

    def _serve_no_more(self) -> None:
        """Parse and serve nothing after this point: what is read is dropped, what is held
        is forgotten, and the parser's callbacks do nothing until the connection closes."""
        self._ignoring = True
        self._discarding = True
        self._held = None

    def pause_writing(self) -> None:
        """The client is not reading: the guard cuts it after ``write_timeout_s``."""
        self.flow.pause_writing()
        self.write_paused_at = self.loop.time()

    def resume_writing(self) -> None:
        """The client reads again; a queued request held back for it is started."""
        self.flow.resume_writing()
        self.write_paused_at = 0.0
        if self._next_waits and not self.transport.is_closing():
            self._next_waits = False
            self._start_next()

    def data_received(self, data: bytes) -> None:
        """Feed the parser; refuse a head that grew past the limit without feeding more."""
        if self._discarding:  # behind a refusal or a pipeline too deep, until the close
            return
        held = self._held
        if held is not None:  # parsed once the requests before it are answered
            held.append(data)
            self._held_size += len(data)
            if self._held_size > HOLD_LIMIT:
                self.flow.pause_reading()
            return
        if self._raw_left:  # the body of a request that offered an upgrade
            rest = self._raw_body(data)
            if not rest:
                self._after_feed()
                return
            data = bytes(rest)
        counted, trailing = self._reading_head, self.trailing
        if counted:  # every byte up to the head's end is the head's
            self._head_fed += len(data)
        self._feed(data)
        if trailing and self.trailing:  # a read of trailers only: counted with the head
            self._head_size += len(data)
        if not counted and self._reading_head:
            # A head began inside this read, after other requests' bytes: count what the
            # callbacks saw of it (at least its first byte), never the bytes before it; a
            # header still incomplete is counted with the next read.
            self._head_fed = max(1, self._head_size)
        self._after_feed()

    def _feed(self, data: bytes) -> None:
        """Feed the parser; a request offering a protocol upgrade is served.

        httptools stops at the end of a head that offers an upgrade (``Upgrade: h2c``, as
        ``curl --http2`` sends on http:// URLs) and takes what follows for the new protocol,
        so the request's body was lost (400 "body is empty") and the connection parsed nothing
        more. The gateway speaks no other protocol, and a server may ignore the offer (RFC 9110,
        7.8): the request is served as HTTP/1.1. llhttp itself says where the head ended; the
        body is then counted off by its Content-Length and what follows goes to a new parser.
        """
        chunk: bytes | memoryview = data
        while chunk:
            try:
                self.parser.feed_data(chunk)
            except httptools.HttpParserError:  # OpenAI-shaped 400; logged at most every 10 s
                if not self._ignoring:  # bytes after a refused head are never judged
                    self._refuse(Shed.MALFORMED, BAD_REQUEST)
                return
            except httptools.HttpParserUpgrade as upgrade:  # a view: offers in a row copy nothing
                chunk = self._past_upgrade(memoryview(chunk)[upgrade.args[0] :])
            else:
                return

    def _past_upgrade(self, rest: memoryview) -> memoryview | bytes:
        """Serve the request whose head just ended as HTTP/1.1; ``rest`` follows its head.
        Returns the bytes after its body, for the next request (none while the body is still
        arriving)."""
        self.parser = request_parser(self)
        length, self._upgrade_body = self._upgrade_body, -1
        if length is None:  # refused in its turn: nothing after this head is ever parsed
            self._discarding = True
            return b""
        if self._refusal is not None or length < 0 or self.transport.is_closing():
            self._reading_head = False
            return b""  # a refused head
        self._raw_left = length
        return self._raw_body(rest)

    def _raw_body(self, data: bytes | memoryview) -> bytes | memoryview:
        """Hand the body bytes of a request that offered an upgrade to the request, counted
        off its Content-Length; complete it when they are all in. Returns what follows."""
        take = min(len(data), self._raw_left)
        if take:
            self._raw_left -= take
            self.on_body(bytes(data[:take]))
        if self._raw_left:
            return b""
        self.on_message_complete()
        return data[take:]

    def _after_feed(self) -> None:
        """Refuse what the parser callbacks flagged, or a head still growing past the limit."""
        refusal = self._refusal
        if refusal is not None:
            self._refusal = None
            self._refuse(*refusal)
            return
        if self._ignoring:
            return
        limit = self.guard.limits.max_head_bytes  # a head (also one behind a request) or trailers
        size = self._head_fed if self._reading_head else self._head_size
        if size > limit and not self.transport.is_closing():
            self._refuse(Shed.HEAD_TOO_LARGE, head_too_large(limit))

    def on_message_begin(self) -> None:
        """A new request's first byte: its head clock starts (the first one's at accept).

        The ASGI scope is built (``_start_asgi``) only for a request the ASGI app serves, not for
        every inference request served natively.
        """
        if self._ignoring:
            return
        self._bad_coding = False
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._head_size = 0
        if not self._reading_head:
            self._reading_head = True
            self._head_fed = 0
        if self.phase is Phase.IDLE:
            self.phase = Phase.HEAD
            self.since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        """Collect the request target and count it into the head size."""
        if self._ignoring:
            return
        self.url += url
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Collect one header (name in lower case) into the head size; a trailer: counted only."""
        if self._ignoring:
            return
        self._head_size += len(name) + len(value) + 4
        if not self._reading_head:
            return
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = self.parser.get_http_version() != "1.0"  # no 1xx to 1.0
        elif name == b"transfer-encoding" and value.strip().lower() != b"chunked":
            self._bad_coding = True  # llhttp frames it as chunked; the coding is not undone
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        """Refuse an over-long head (arrived in one piece); start the body clock."""
        if self._ignoring:
            return
        self._reading_head = False
        limit = self.guard.limits.max_head_bytes
        if self._head_size > limit:
            self._refusal = (Shed.HEAD_TOO_LARGE, head_too_large(limit))
            self._ignoring = True  # nothing after it in this read is served either
            return
        if self._bad_coding:
            self._refusal = (Shed.MALFORMED, UNSUPPORTED_CODING)
            self._ignoring = True
            return
        if len(self.pipeline) >= MAX_PIPELINE:
            self._overflow()
            return
        refusing = self._offered_upgrade() if self.parser.should_upgrade() else None
        if refusing is not None:  # answered in its turn, then the connection closes
            self.guard.note_shed(Shed.UPGRADE_REFUSED, self.loop.time())
            if refusing is CONNECT_REFUSED:
                self.url = b"/"  # its authority-form target is no path for the ASGI scope
            self._start_asgi(refusing)
            self.phase = Phase.BUSY  # no body is read: no body deadline
            return
        if self._ops_only:
            allowed = self.url.partition(b"?")[0] in OPS_PATHS
            if not allowed:
                self.guard.note_shed(Shed.OVER_CAPACITY, self.loop.time())
            self._start_asgi(self.app if allowed else OVER_CAPACITY_APP)
        elif not self._start_native():
            self._start_asgi(self.app)
        if self.pipeline and self.pipeline[0][0] is self.cycle:
            return  # queued: its body is read, and timed, in its turn (``_start_next``)
        self._start_body_clock()

    def _start_body_clock(self) -> None:
        """The body of the request in turn is being read from now: its deadlines start."""
        now = self.loop.time()
        self.phase = Phase.BODY
        self.since = now
        self.body_started = now
        self.body_bytes = 0

    def _offered_upgrade(self) -> ASGIApp | None:
        """Note the body length of a request whose head offers an upgrade (``_past_upgrade``
        hands the body over); or, for CONNECT and for a chunked body, the app that refuses it
        (its body is never read: the connection closes after the answer)."""
        refusing = CONNECT_REFUSED if self.parser.get_method() == b"CONNECT" else None
        length = 0
        for name, value in self.headers:
            if name == b"transfer-encoding":
                refusing = refusing or CHUNKED_OFFER_REFUSED
            elif name == b"content-length":
                length = int(value)  # llhttp has checked it: digits, one value
        self._upgrade_body = None if refusing is not None else length
        return refusing

    def _start_asgi(self, app: ASGIApp) -> None:
        """Hand the request whose head just ended to ``app`` as an ASGI ``http`` scope."""
        parser = self.parser
        version = parser.get_http_version()
        scope = http_scope(
            parser.get_method(),
            self.url,
            version,
            self.headers,
            root_path=self.root_path,
            server=self.server,
            client=self.client,
            state=self.app_state.copy(),
        )
        cycle = AsgiCycle(
            scope,
            self.transport,
            self.flow,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
            expect_continue=self.expect_100_continue,
            on_response=self.on_response_complete,
        )
        self._queue_or_start(cycle, app)

    def _queue_or_start(self, cycle: Cycle, app: ASGIApp) -> None:
        """Start ``cycle`` now, or queue it behind the request still being answered."""
        existing, self.cycle = self.cycle, cycle
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:  # pipelined: reading pauses until its turn
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def _start_native(self) -> bool:
        """Serve an inference request natively (:mod:`gateway.http.native`); False if not one."""
        native = self.native
        if native is None:
            return False
        route = ROUTES.get(self.url.partition(b"?")[0])
        parser = self.parser
        if route is None or parser.get_method() != b"POST":
            return False
        http10 = parser.get_http_version() == "1.0"
        keep_alive = not http10 and parser.should_keep_alive()
        cycle = NativeCycle(
            native,
            route,
            self.headers,
            self.transport,
            self.flow,
            keep_alive=keep_alive,
            expect_continue=self.expect_100_continue,
            on_response=self.on_response_complete,
            chunked=not http10,
        )
        self._queue_or_start(cycle, self.app)
        return True

    def on_body(self, body: bytes) -> None:
        """Count body bytes for the minimum-rate check."""
        self.trailing = False
        if self._ignoring:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # else answered early: dropped
            cycle.body += body
            if len(cycle.body) > BODY_HIGH_WATER:
                self.flow.pause_reading()
            cycle.message_event.set()
        self.body_bytes += len(body)
        if self.phase is Phase.BODY:  # not the rest of a body answered early: idle rules
            self.since = self.loop.time()

    def on_message_complete(self) -> None:
        """The request is in; the app answers without a server deadline."""
        self.trailing = False
        if self._ignoring or self._upgrade_body != -1:
            return  # refused, or an upgrade head: its body is still to come (``_past_upgrade``)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()
        if isinstance(cycle, NativeCycle) and cycle.lingering:  # a refused body has ended
            self.transport.close()
            return
        if self.phase is Phase.BODY:
            self.phase = Phase.BUSY
        self._keep_reading()

    def _keep_reading(self) -> None:
        """Read on while the request is answered, so a client that leaves is noticed at once.

        Reading pauses above BODY_HIGH_WATER of body, and behind a pipelined request, until
        the next request is served: a paused socket never reports the client's close, and the
        backend would generate for nobody. Once a message is whole, reading resumes; what
        arrives behind a request that waits its turn is kept unparsed (up to HOLD_LIMIT).
        """
        if self.pipeline and self._held is None:
            self._held = []
            self._held_size = 0
        self.flow.resume_reading()

    def on_response_complete(self) -> None:
        """Back to keep-alive (or on to a pipelined request, and what was held behind it).

        No keep-alive timer is armed per response: the guard's sweeper closes a connection idle
        past ``idle_timeout_s``.
        """
        pipelined = bool(self.pipeline)
        held, self._held = self._held, None
        closing = self.transport.is_closing()
        if not pipelined and self._final is not None:  # a refusal behind the answered ones
            final, self._final = self._final, None
            self.guard.release(self)
            if not closing:
                self.transport.write(final)
                self._close()
            return
        self.since = self.loop.time()
        if pipelined:
            self.phase = Phase.BUSY
            if closing:
                return
            if self.flow.write_paused:  # the client reads nothing: its next answer waits
                self._next_waits = True
                self._held = held
                return
            self._start_next()
        else:  # a head that began behind the last request gets its head deadline from now
            self.phase = Phase.HEAD if self._reading_head else Phase.IDLE
            if not closing:
                self.flow.resume_reading()
        if held and not closing:
            self.data_received(b"".join(held))

    def _start_next(self) -> None:
        """Start the oldest queued request; its body, if still to come, is timed from now."""
        cycle, app = self.pipeline.pop()
        self.flow.resume_reading()
        self._start_asgi_task(cycle, app)
        if cycle.more_body:
            self._start_body_clock()
