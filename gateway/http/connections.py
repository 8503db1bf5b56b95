"""Bounded client connections: what the HTTP protocol enforces, counts and logs.

One :class:`ConnectionGuard` per server process holds the limits (from ``server:``), the open
connections, the shedding counters and a rate-limited log. A sweeper on the event loop (one
timer, every ``tick_s``) closes connections whose phase ran past its deadline; the protocol in
:mod:`gateway.http.protocol` only stamps phase changes, so the hot path does no timer work.

Phases of a connection: ``HEAD`` (waiting for or reading a request head; the first head's
clock starts at accept), ``BODY`` (reading the body), ``BUSY`` (the app is answering: no
deadline here, upstream timeouts govern streams), ``IDLE`` (keep-alive between requests).
In every phase, a connection whose writes have been paused (the client reads nothing while the
gateway has answers for it) longer than ``write_timeout_s`` is aborted.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.telemetry import semconv as sc

_log = structlog.get_logger("tiergate.connections")

# File descriptors kept for everything but client sockets: upstream and Redis connections,
# log files, the listening socket; client connections get at most half of the rest, since
# each proxied request holds an upstream socket too.
_FD_RESERVE = 256
# Start-up warns when the open-file limit stays below this (a cap under ~1,900 connections).
FD_LIMIT_WARN = 4096
# The soft limit asked for when the hard limit is unlimited (Linux's default fs.nr_open).
_NOFILE_UNLIMITED_TARGET = 1_048_576
SHED_LOG_INTERVAL_S = 10.0


class Phase(IntEnum):
    """Where a connection is in its request cycle."""

    HEAD = 0
    BODY = 1
    BUSY = 2
    IDLE = 3


class Shed:
    """The reasons a connection is closed or refused by the server itself (metric labels)."""

    HEAD_TOO_LARGE = "head_too_large"
    HEAD_TIMEOUT = "head_timeout"
    BODY_TIMEOUT = "body_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    EVICTED = "evicted_for_new_connection"
    OVER_CAPACITY = "over_capacity"
    OVER_CAPACITY_CLOSED = "over_capacity_closed"
    # A CONNECT request, or a chunked body behind a protocol-upgrade offer: llhttp stops at
    # such a head, and the gateway frames only Content-Length bodies past it
    # (gateway/http/protocol.py).
    UPGRADE_REFUSED = "upgrade_refused"
    # Bytes that are not HTTP/1.1 (the parser's 400), or a transfer coding other than chunked.
    MALFORMED = "malformed_request"
    # More pipelined requests than MAX_PIPELINE waiting behind the one being answered: those
    # are answered, the rest is dropped and the connection closed (clients resend unanswered
    # requests on a new connection, RFC 9112 9.3.2).
    PIPELINE_TOO_DEEP = "pipeline_too_deep"
    # The client read nothing for write_timeout_s while answers waited for it.
    WRITE_TIMEOUT = "write_timeout"
    ALL = (
        HEAD_TOO_LARGE,
        HEAD_TIMEOUT,
        BODY_TIMEOUT,
        IDLE_TIMEOUT,
        EVICTED,
        OVER_CAPACITY,
        OVER_CAPACITY_CLOSED,
        UPGRADE_REFUSED,
        MALFORMED,
        PIPELINE_TOO_DEEP,
        WRITE_TIMEOUT,
    )


def fd_limit() -> int:
    """The process's soft limit on open files."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one, at start; return the limit in force.

    Every proxied stream holds two descriptors (client and upstream), so a soft limit of 1,024,
    the default on many systems, caps a process near 380 streams where the hard limit allows
    far more. Below :data:`FD_LIMIT_WARN` after the raise, start-up warns with the numbers.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NOFILE_UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            _log.warning("server.fd_limit_not_raised", soft=soft, hard=hard, error=str(exc))
        else:
            _log.info("server.fd_limit_raised", before=soft, after=target)
    fds = fd_limit()
    if fds < FD_LIMIT_WARN:
        _log.warning(
            "server.fd_limit_low",
            fd_limit=fds,
            connection_cap=connection_cap(None, fds),
            hint="raise the hard limit: ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=",
        )
    return fds


def connection_cap(configured: int | None, fds: int) -> int:
    """The open-connection cap: the configured one, never above what the fd limit allows."""
    ceiling = max(16, (fds - _FD_RESERVE) // 2)
    return ceiling if configured is None else min(configured, ceiling)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds every client connection lives within."""

    max_head_bytes: int = 16 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 1024
    idle_timeout_s: float = 75.0
    write_timeout_s: float = 60.0
    max_connections: int = 4096
    over_cap_reserve: int = 64

    @property
    def tick_s(self) -> float:
        """How often the sweeper looks: a quarter of the shortest deadline, 50 ms to 1 s."""
        shortest = min(
            self.head_timeout_s, self.body_timeout_s, self.idle_timeout_s, self.write_timeout_s
        )
        return min(1.0, max(0.05, shortest / 4))


class Guarded(Protocol):
    """What the guard needs of a connection."""

    phase: Phase
    since: float  # when the phase began; in BODY, when the last body bytes came
    body_started: float
    body_bytes: int
    write_paused_at: float  # when writes were paused (the client is not reading); 0: not paused

    def shed(self, reason: str) -> None:
        """Close the connection for ``reason`` (answering first where that makes sense)."""
        ...


class ShedLog:
    """At most one log line per reason every ``interval_s``, with the count since the last."""

    def __init__(self, interval_s: float = SHED_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._pending: dict[str, int] = {}

    def note(self, reason: str, now: float) -> None:
        """Count one shed connection; log when the reason's interval has passed."""
        pending = self._pending.get(reason, 0) + 1
        if now - self._last.get(reason, -self.interval_s) >= self.interval_s:
            self._last[reason] = now
            self._pending[reason] = 0
            _log.warning(
                sc.EV_CONNECTION_SHED, reason=reason, count=pending, interval_s=self.interval_s
            )
        else:
            self._pending[reason] = pending


class ConnectionGuard:
    """The open connections of one server process, their deadlines and what was shed."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: set[Guarded] = set()
        self.shed_counts: dict[str, int] = dict.fromkeys(Shed.ALL, 0)
        self.log = ShedLog()
        self._sweeping = False

    def start_sweeping(self, loop: asyncio.AbstractEventLoop) -> None:
        """Arm the sweeper on ``loop`` (once; it re-arms itself every ``tick_s``)."""
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(self.limits.tick_s, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sweep(loop.time())
        loop.call_later(self.limits.tick_s, self._tick, loop)

    def note_shed(self, reason: str, now: float) -> None:
        """Count and (rate-limited) log one shed connection."""
        self.shed_counts[reason] += 1
        self.log.note(reason, now)

    def admit(self, conn: Guarded, now: float) -> bool | None:
        """Take a new connection: ``True`` normally, ``False`` over the cap (ops paths only),
        ``None`` past the reserve (the caller closes it at once)."""
        limits = self.limits
        if len(self.open) >= limits.max_connections:
            victim = self._evictable()
            if victim is not None:
                self.note_shed(Shed.EVICTED, now)
                victim.shed(Shed.EVICTED)
                self.open.discard(victim)
            elif len(self.open) >= limits.max_connections + limits.over_cap_reserve:
                self.note_shed(Shed.OVER_CAPACITY_CLOSED, now)
                return None
            else:
                self.open.add(conn)
                return False
        self.open.add(conn)
        return True

    def busy(self) -> int:
        """Connections with a request in progress (idle keep-alive ones not counted)."""
        return sum(1 for conn in self.open if conn.phase is not Phase.IDLE)

    def _evictable(self) -> Guarded | None:
        """The connection waiting longest without a request in progress."""
        best: Guarded | None = None
        for conn in self.open:
            if conn.phase in (Phase.HEAD, Phase.IDLE) and (best is None or conn.since < best.since):
                best = conn
        return best

    def release(self, conn: Guarded) -> None:
        """Forget a closed connection."""
        self.open.discard(conn)

    def expired(self, conn: Guarded, now: float) -> str | None:
        """Why ``conn`` must be closed now, or ``None``."""
        paused = conn.write_paused_at
        if paused and now - paused > self.limits.write_timeout_s:
            return Shed.WRITE_TIMEOUT
        return self._phase_expired(conn, now)

    def _phase_expired(self, conn: Guarded, now: float) -> str | None:
        limits = self.limits
        phase = conn.phase
        elapsed = now - conn.since
        if phase is Phase.HEAD:
            return Shed.HEAD_TIMEOUT if elapsed > limits.head_timeout_s else None
        if phase is Phase.IDLE:
            return Shed.IDLE_TIMEOUT if elapsed > limits.idle_timeout_s else None
        if phase is not Phase.BODY:
            return None
        if elapsed > limits.body_timeout_s:
            return Shed.BODY_TIMEOUT  # no body bytes for that long
        late = now - conn.body_started - limits.body_timeout_s
        if late > 0 and conn.body_bytes < limits.body_min_rate * late:
            return Shed.BODY_TIMEOUT  # bytes come, but below the minimum rate
        return None

    def sweep(self, now: float) -> None:
        """Close every connection past its deadline."""
        for conn in list(self.open):
            reason = self.expired(conn, now)
            if reason is not None:
                self.note_shed(reason, now)
                self.open.discard(conn)
                conn.shed(reason)


class ConnectionCollector(Collector):
    """Open connections and shed connections by reason, read from the guard at scrape time."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        """Yield the gauge and the counter."""
        yield GaugeMetricFamily(
            sc.M_CONNECTIONS_OPEN, "Open client connections", value=float(len(self.guard.open))
        )
        yield GaugeMetricFamily(
            sc.M_CONNECTIONS_CAP,
            "The open-connection cap",
            value=float(self.guard.limits.max_connections),
        )
        shed = CounterMetricFamily(
            sc.M_CONNECTIONS_SHED,
            "Client connections the server closed or refused, by reason",
            labels=("reason",),
        )
        for reason, count in self.guard.shed_counts.items():
            shed.add_metric((reason,), float(count))
        yield shed
