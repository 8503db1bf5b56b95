"""A pipelined Redis connection for the limiter's hot path: Lua scripts by SHA, few allocations.

redis-py spends ~190 µs of Python per command on the request path (command packing with an
encoder call per argument, a pool checkout and check-in, ``asyncio.wait_for`` around each send
and read, a stream reader per reply line). ``ScriptPipeline`` keeps **one** connection per
client and writes commands already packed as RESP, many in flight at once; replies are parsed
in ``data_received`` and resolve the callers' futures in order. A command may also be *lazy*
(``call(..., lazy=True)``): it is not written at once but goes out with the next eager command
(one write, one round trip for both) or, when none comes, after ``linger_s``. The limiter uses
that for settlements, which nobody waits for on the response path.

Connection settings (host, port or unix socket, username, password, db, timeouts) are the Redis
client's own. A client this module cannot speak for (TLS, a credential provider) is served by
redis-py itself (``_ClientScripts``), with the same interface. Errors are redis-py's
(``ConnectionError``, ``TimeoutError``, ``ResponseError``: all ``RedisError``), so callers
handle both the same way. A script the server has forgotten (restart, ``SCRIPT FLUSH``) is
sent again in full (``EVAL``) and cached for the next call.

A command whose connection died before its reply is sent once more on a new connection
(a restarted server), unless the caller says ``retry=False``: the server may have run it
already, so a command that must not run twice (a refund) fails instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Arg = int | str | bytes | float
_CRLF = b"\r\n"
_INCOMPLETE = -1
_MAX_PACKED_KEYS = 10_000
_KNOWN = frozenset({"host", "port", "path", "db", "username", "password", "socket_timeout"})
# Connection settings that change nothing on the wire this module writes.
_HARMLESS = frozenset(
    {"decode_responses", "encoding", "encoding_errors", "client_name", "lib_name", "lib_version"}
)
_IGNORED = frozenset(
    {
        "socket_connect_timeout",
        "retry",
        "health_check_interval",
        "himport_registry",
        "maint_notifications_pool_handler",
        "maint_notifications_config",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    }
)


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def encode(value: Arg) -> bytes:
    """An argument as Redis reads it (ints and floats in decimal, text in UTF-8)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int):
        return b"%d" % value
    return repr(float(value)).encode()


def _bulk_args(args: Sequence[Arg]) -> bytes:
    """Arguments as bulk strings (ints and strs, the common cases, without a call each)."""
    out = []
    for arg in args:
        if isinstance(arg, int):
            value = b"%d" % arg
        elif isinstance(arg, str):
            value = arg.encode()
        else:
            value = encode(arg)
        out.append(b"$%d\r\n%s\r\n" % (len(value), value))
    return b"".join(out)


def pack(*parts: Arg) -> bytes:
    """A whole command, packed as a RESP array of bulk strings."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(encode(p)) for p in parts)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script, its SHA, and the packed heads of its ``EVALSHA``/``EVAL`` commands."""

    source: str
    keys: int
    args: int
    sha: str = field(init=False, compare=False)
    _heads: tuple[bytes, bytes] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 (Redis' own id)
        count = b"*%d\r\n" % (3 + self.keys + self.args)
        numkeys = bulk(b"%d" % self.keys)
        by_sha = count + bulk(b"EVALSHA") + bulk(sha.encode()) + numkeys
        in_full = count + bulk(b"EVAL") + bulk(self.source.encode()) + numkeys
        object.__setattr__(self, "sha", sha)
        object.__setattr__(self, "_heads", (by_sha, in_full))

    def head(self, *, by_sha: bool) -> bytes:
        """``*N EVALSHA sha numkeys`` (or ``EVAL source numkeys``), packed."""
        return self._heads[0] if by_sha else self._heads[1]


class ScriptRunner(Protocol):
    """Runs registered scripts and plain commands (``ScriptPipeline`` or ``_ClientScripts``)."""

    @property
    def connections(self) -> int | None:
        """The most connections its commands may use at once (None: one, pipelined: no cap
        on the commands in flight)."""
        ...

    async def run(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        *,
        lazy: bool = False,
        retry: bool = True,
    ) -> Any:
        """``EVALSHA`` the script with ``keys`` and ``args``; the reply.

        ``retry=False``: never sent twice (a lost connection fails the call).
        """
        ...

    async def command(self, *parts: Arg, lazy: bool = False, retry: bool = True) -> Any:
        """Any other command; the reply."""
        ...

    async def aclose(self) -> None:
        """Send what is pending, then close."""
        ...


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from ``buf[pos:]``: ``(value, next position)``, or ``(None, -1)``."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        return None, _INCOMPLETE
    kind, line, nxt = buf[pos], buf[pos + 1 : end], end + 2
    if kind == 58:  # ':'
        return int(line), nxt
    if kind == 36:  # '$'
        return _bulk_reply(buf, int(line), nxt)
    if kind == 42:  # '*'
        return _array_reply(buf, int(line), nxt)
    if kind == 43:  # '+'
        return bytes(line), nxt
    if kind == 45:  # '-'
        return ResponseError(line.decode(errors="replace")), nxt
    raise RedisConnectionError(f"unexpected RESP reply type {chr(kind)!r}")


def _bulk_reply(buf: bytearray, size: int, pos: int) -> tuple[bytes | None, int]:
    if size < 0:
        return None, pos
    if len(buf) < pos + size + 2:
        return None, _INCOMPLETE
    return bytes(buf[pos : pos + size]), pos + size + 2


def _array_reply(buf: bytearray, count: int, pos: int) -> tuple[list[Any] | None, int]:
    items: list[Any] = []
    for _ in range(max(count, 0)):
        item, pos = _parse(buf, pos)
        if pos == _INCOMPLETE:
            return None, _INCOMPLETE
        items.append(item)
    return (items if count >= 0 else None), pos


class _Wire(asyncio.Protocol):
    """One connection: writes packed commands, parses replies, resolves futures in order.

    Every command must be answered within ``timeout_s`` of being written; otherwise the
    connection is aborted and every waiting caller gets ``TimeoutError`` (one timer per
    connection, re-armed from the oldest command's deadline, not one per command).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.lost = False
        self._buf = bytearray()
        self._timeout = timeout_s
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def send(self, data: bytes, futures: Sequence[asyncio.Future[Any]]) -> None:
        """Write ``data`` (one packed command per future) and wait for the replies."""
        if self.lost or self.transport is None:
            for future in futures:
                _fail(future, RedisConnectionError("Redis connection closed"))
            return
        deadline = self.loop.time() + self._timeout
        self.waiting.extend((future, deadline) for future in futures)
        self.transport.write(data)
        if self._watch is None:
            self._watch = self.loop.call_at(deadline, self._check)

    def data_received(self, data: bytes) -> None:
        """Resolve the oldest waiting futures with every complete reply."""
        buf, waiting = self._buf, self.waiting
        buf += data
        pos = 0
        try:
            while waiting:
                value, nxt = _parse(buf, pos)
                if nxt == _INCOMPLETE:
                    break
                pos = nxt
                future = waiting.popleft()[0]
                if future.done():
                    continue  # its caller gave up (cancelled); the reply is dropped
                if isinstance(value, ResponseError):
                    future.set_exception(value)
                else:
                    future.set_result(value)
        except (ValueError, RedisConnectionError) as exc:
            self.close(RedisConnectionError(f"unreadable Redis reply: {exc}"))
            return
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        """Every waiting caller gets ``ConnectionError``."""
        self._fail_all(RedisConnectionError(f"Redis connection lost ({exc or 'closed'})"))

    def close(self, error: Exception | None = None) -> None:
        """Abort the connection; waiting callers get ``error`` (default ``ConnectionError``)."""
        self._fail_all(error or RedisConnectionError("Redis connection closed"))
        if self.transport is not None:
            self.transport.abort()

    def _check(self) -> None:
        self._watch = None
        if not self.waiting:
            return
        deadline = self.waiting[0][1]
        if self.loop.time() >= deadline:
            self.close(RedisTimeoutError("Redis did not answer in time"))
            return
        self._watch = self.loop.call_at(deadline, self._check)

    def _fail_all(self, error: Exception) -> None:
        self.lost = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        while self.waiting:
            _fail(self.waiting.popleft()[0], error)


def _fail(future: asyncio.Future[Any], error: Exception) -> None:
    """Fail ``future`` with a fresh copy of ``error`` (no traceback shared between callers)."""
    if not future.done():
        future.set_exception(type(error)(*error.args))


def _hello(kwargs: dict[str, Any]) -> list[bytes]:
    """The commands a new connection sends first: ``AUTH`` and ``SELECT`` as configured.

    (``ScriptPipeline`` adds a ``SCRIPT LOAD`` of every script it has run.)
    """
    commands: list[bytes] = []
    password, username = kwargs.get("password"), kwargs.get("username")
    if password is not None:
        commands.append(pack("AUTH", username, password) if username else pack("AUTH", password))
    if kwargs.get("db"):
        commands.append(pack("SELECT", int(kwargs["db"])))
    return commands


class ScriptPipeline:
    """Commands of every caller on one pipelined connection (see the module docstring)."""

    def __init__(self, client: Redis, *, linger_s: float = 0.005) -> None:
        kwargs = client.connection_pool.connection_kwargs
        self._kwargs = kwargs
        self._timeout = float(kwargs.get("socket_timeout") or 30.0)
        self._connect_timeout = float(kwargs.get("socket_connect_timeout") or self._timeout)
        self._linger = linger_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wire: _Wire | None = None
        self._connecting: asyncio.Task[_Wire] | None = None
        self._pending: list[bytes] = []
        self._pending_futures: list[asyncio.Future[Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._scripts: dict[str, LuaScript] = {}
        self._keys: dict[tuple[str, ...], bytes] = {}
        self._burst = False  # a command was written in this pass of the event loop
        self._burst_due = False  # and others queued behind it

    @property
    def connections(self) -> int | None:
        """None: every command shares one pipelined connection."""
        return None

    @staticmethod
    def supports(client: Redis) -> bool:
        """True when the client's connections are plain TCP or a unix socket, RESP2."""
        pool = client.connection_pool
        if pool.connection_class not in (Connection, UnixDomainSocketConnection):
            return False
        extra = set(pool.connection_kwargs) - _KNOWN - _IGNORED
        return not any(pool.connection_kwargs[k] for k in extra if k not in _HARMLESS)

    async def run(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        *,
        lazy: bool = False,
        retry: bool = True,
    ) -> Any:
        """``EVALSHA``; a script the server lost is sent again in full (``EVAL``)."""
        tail = self._packed_keys(keys) + _bulk_args(args)
        if script.sha not in self._scripts:
            # First use: sent in full, so it keeps its place in the order of commands (a
            # NOSCRIPT retry would run after the commands written behind it); every new
            # connection loads the scripts used so far before anything else.
            self._scripts[script.sha] = script
            return await self._call(script.head(by_sha=False) + tail, lazy, retry)
        try:
            return await self._call(script.head(by_sha=True) + tail, lazy, retry)
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        # NOSCRIPT: the server ran nothing, so sending it again is safe whatever ``retry``.
        return await self._call(script.head(by_sha=False) + tail, False, retry)

    async def command(self, *parts: Arg, lazy: bool = False, retry: bool = True) -> Any:
        """Any command; the reply."""
        return await self._call(pack(*parts), lazy, retry)

    def _packed_keys(self, keys: Sequence[str]) -> bytes:
        """Key names packed once (a limiter sends the same few keys over and over)."""
        names = tuple(keys)
        packed = self._keys.get(names)
        if packed is None:
            if len(self._keys) >= _MAX_PACKED_KEYS:
                self._keys.clear()
            packed = self._keys[names] = b"".join(bulk(k.encode()) for k in names)
        return packed

    async def aclose(self) -> None:
        """Write what is pending, wait for its replies and those of every command in flight
        (bounded by the timeout), then close the connection."""
        wire = self._wire
        in_flight = [f for f, _ in wire.waiting] if wire is not None and not wire.lost else []
        if (self._pending or in_flight) and self._loop is asyncio.get_running_loop():
            waiting = [*in_flight, *self._pending_futures]
            self._flush()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout):
                    await asyncio.gather(*waiting, *self._tasks, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    async def _call(self, data: bytes, lazy: bool, retry: bool) -> Any:
        """Send once; a connection found dead (a restarted server) is replaced once.

        Without ``retry`` the failure is the caller's: the command may have run already.
        """
        try:
            return await self._send(data, lazy)
        except RedisConnectionError:
            if not retry:
                raise
            return await self._send(data, False)

    async def _send(self, data: bytes, lazy: bool) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        future: asyncio.Future[Any] = loop.create_future()
        if lazy:
            self._pending.append(data)
            self._pending_futures.append(future)
            if self._timer is None:
                self._timer = loop.call_later(self._linger, self._flush)
            return await future
        if self._burst:
            # A command already went out in this pass of the event loop: this one waits for
            # the end of the pass and goes out in one write with the others (busy gateways
            # admit many requests per pass; the first of each pass is never delayed).
            self._pending.append(data)
            self._pending_futures.append(future)
            self._burst_due = True
            return await future
        wire = self._wire
        if wire is None or wire.lost:
            wire = await self._connect()
        if self._pending:
            data = b"".join([*self._pending, data])
            wire.send(data, [*self._take_pending(), future])
        else:
            wire.send(data, (future,))
        self._burst = True
        loop.call_soon(self._end_burst)
        return await future

    def _end_burst(self) -> None:
        """The event loop's pass is over: write what queued behind its first command."""
        self._burst = False
        if self._burst_due:
            self._burst_due = False
            self._flush()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or a new event loop (tests): forget the old loop's connection."""
        if self._wire is not None and self._wire.transport is not None:
            with contextlib.suppress(RuntimeError):  # that loop may be closed already
                self._wire.transport.abort()
        self._loop, self._wire, self._connecting, self._timer = loop, None, None, None
        self._pending, self._pending_futures = [], []
        self._burst = self._burst_due = False

    def _take_pending(self) -> list[asyncio.Future[Any]]:
        futures = self._pending_futures
        self._pending, self._pending_futures = [], []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return futures

    def _flush(self) -> None:
        """Write the lazy commands (their linger is over, or the pipeline closes)."""
        self._timer = None
        if not self._pending:
            return
        wire = self._wire
        if wire is not None and not wire.lost:
            data = b"".join(self._pending)
            wire.send(data, self._take_pending())
            return
        task = asyncio.get_running_loop().create_task(self._connect_then_flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_then_flush(self) -> None:
        try:
            await self._connect()
        except Exception as exc:  # noqa: BLE001 -- every lazy caller gets the failure
            for future in self._take_pending():
                _fail(future, exc)
            return
        self._flush()

    async def _connect(self) -> _Wire:
        """The live connection, opening one (shared by every caller waiting meanwhile)."""
        if self._connecting is None:
            task = asyncio.get_running_loop().create_task(self._open())
            self._connecting = task
            task.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, task: asyncio.Task[_Wire]) -> None:
        self._connecting = None
        if not task.cancelled() and task.exception() is None:
            self._wire = task.result()

    async def _open(self) -> _Wire:
        loop = asyncio.get_running_loop()
        kwargs = self._kwargs

        def factory() -> _Wire:
            return _Wire(loop, self._timeout)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if kwargs.get("path"):
                    _, wire = await loop.create_unix_connection(factory, kwargs["path"])
                else:
                    host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
                    _, wire = await loop.create_connection(factory, host, port)
        except TimeoutError as exc:
            raise RedisTimeoutError("Timeout connecting to Redis") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to Redis: {exc}") from exc
        hello = _hello(kwargs) + [pack("SCRIPT", "LOAD", s.source) for s in self._scripts.values()]
        if hello:
            futures = [loop.create_future() for _ in hello]
            wire.send(b"".join(hello), futures)
            try:
                await asyncio.gather(*futures)
            except BaseException:
                wire.close()
                raise
        return wire


class _ClientScripts:
    """The same interface over redis-py itself, for clients the pipeline cannot speak for."""

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._scripts: dict[LuaScript, Any] = {}

    @property
    def connections(self) -> int | None:
        """The pool's cap (``max_connections`` in the URL): a command over it fails."""
        cap = self._client.connection_pool.max_connections
        return cap if isinstance(cap, int) else None

    async def run(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        *,
        lazy: bool = False,
        retry: bool = True,
    ) -> Any:
        """redis-py's ``Script`` (``EVALSHA``, loading the script when the server lost it).

        ``retry`` is the client's own (``open_redis``: one retry on a dead connection).
        """
        registered = self._scripts.get(script)
        if registered is None:
            registered = self._scripts[script] = self._client.register_script(script.source)
        return await registered(keys=list(keys), args=list(args))

    async def command(self, *parts: Arg, lazy: bool = False, retry: bool = True) -> Any:
        """``execute_command``."""
        return await self._client.execute_command(*parts)  # type: ignore[no-untyped-call]

    async def aclose(self) -> None:
        """Nothing of its own: the client's pool is closed by its owner."""


def script_runner(client: Redis, *, linger_s: float = 0.005) -> ScriptRunner:
    """A ``ScriptPipeline`` on ``client``'s server, or redis-py itself where it must be."""
    if ScriptPipeline.supports(client):
        return ScriptPipeline(client, linger_s=linger_s)
    return _ClientScripts(client)
