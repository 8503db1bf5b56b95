"""The connection guard's arithmetic: admission at the cap, deadlines, the fd ceiling, logs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from structlog.testing import capture_logs

from gateway.http.connections import (
    ConnectionGuard,
    ConnectionLimits,
    Phase,
    Shed,
    ShedLog,
    connection_cap,
)
from gateway.http.edge import raw_error


@dataclass(eq=False)
class FakeConnection:
    """A connection as the guard sees it; ``shed_for`` records why it was closed."""

    phase: Phase = Phase.HEAD
    since: float = 0.0
    body_started: float = 0.0
    body_bytes: int = 0
    write_paused_at: float = 0.0
    shed_for: list[str] = field(default_factory=list)

    def shed(self, reason: str) -> None:
        """Remember the reason."""
        self.shed_for.append(reason)


LIMITS = ConnectionLimits(
    head_timeout_s=10,
    body_timeout_s=5,
    body_min_rate=100,
    idle_timeout_s=60,
    max_connections=2,
    over_cap_reserve=1,
)


def test_at_the_cap_the_longest_waiting_idle_connection_is_evicted() -> None:
    """A new connection at the cap closes the oldest one without a request in progress."""
    guard = ConnectionGuard(LIMITS)
    busy = FakeConnection(Phase.BUSY, since=0.0)
    idle = FakeConnection(Phase.IDLE, since=1.0)
    assert guard.admit(busy, 0.0) is True
    assert guard.admit(idle, 1.0) is True
    assert guard.admit(FakeConnection(since=2.0), 2.0) is True
    assert idle.shed_for == [Shed.EVICTED]
    assert busy.shed_for == []
    assert guard.shed_counts[Shed.EVICTED] == 1


def test_past_the_cap_with_all_busy_only_the_reserve_is_admitted_then_closed() -> None:
    """All slots busy: one more is admitted for ops paths, the next is refused at once."""
    guard = ConnectionGuard(LIMITS)
    for _ in range(2):
        guard.admit(FakeConnection(Phase.BODY), 0.0)
    reserve = FakeConnection(Phase.BUSY)
    assert guard.admit(reserve, 0.0) is False
    assert guard.admit(FakeConnection(Phase.BUSY), 0.0) is None
    assert guard.shed_counts[Shed.OVER_CAPACITY_CLOSED] == 1
    guard.release(reserve)
    assert len(guard.open) == 2


def test_deadlines_by_phase() -> None:
    """HEAD and IDLE have their own timeouts; BUSY has none; BODY pauses and rate are checked."""
    guard = ConnectionGuard(LIMITS)
    assert guard.expired(FakeConnection(Phase.HEAD, since=0), 10.5) == Shed.HEAD_TIMEOUT
    assert guard.expired(FakeConnection(Phase.HEAD, since=0), 9.5) is None
    assert guard.expired(FakeConnection(Phase.IDLE, since=0), 59) is None
    assert guard.expired(FakeConnection(Phase.IDLE, since=0), 61) == Shed.IDLE_TIMEOUT
    assert guard.expired(FakeConnection(Phase.BUSY, since=0), 1e6) is None
    paused = FakeConnection(Phase.BODY, since=0, body_started=0, body_bytes=10**6)
    assert guard.expired(paused, 5.5) == Shed.BODY_TIMEOUT
    trickle = FakeConnection(Phase.BODY, since=9.9, body_started=0, body_bytes=400)
    assert guard.expired(trickle, 10.0) == Shed.BODY_TIMEOUT  # owes 500 bytes after 5 s grace
    fair = FakeConnection(Phase.BODY, since=9.9, body_started=0, body_bytes=600)
    assert guard.expired(fair, 10.0) is None


def test_a_client_that_reads_nothing_is_cut_in_any_phase() -> None:
    """Writes paused past write_timeout_s: the connection goes, even while BUSY (a stream)."""
    guard = ConnectionGuard(ConnectionLimits(write_timeout_s=30))
    stalled = FakeConnection(Phase.BUSY, since=0, write_paused_at=5.0)
    assert guard.expired(stalled, 34.0) is None
    assert guard.expired(stalled, 35.5) == Shed.WRITE_TIMEOUT
    idle = FakeConnection(Phase.IDLE, since=100, write_paused_at=1.0)
    assert guard.expired(idle, 40) == Shed.WRITE_TIMEOUT
    assert guard.expired(FakeConnection(Phase.BUSY, since=0), 1e6) is None  # never paused


def test_sweep_closes_only_the_expired() -> None:
    """The sweeper closes and forgets expired connections and keeps the rest."""
    guard = ConnectionGuard(ConnectionLimits(max_connections=10))
    stale, fresh = FakeConnection(since=0), FakeConnection(since=100)
    guard.admit(stale, 0)
    guard.admit(fresh, 100)
    guard.sweep(105)
    assert stale.shed_for == [Shed.HEAD_TIMEOUT]
    assert fresh.shed_for == []
    assert guard.open == {fresh}


def test_the_cap_stays_below_the_fd_limit() -> None:
    """The cap is the configured one unless the fd limit cannot carry it."""
    assert connection_cap(None, 20_000) == (20_000 - 256) // 2
    assert connection_cap(1000, 20_000) == 1000
    assert connection_cap(50_000, 1024) == (1024 - 256) // 2
    assert connection_cap(None, 100) == 16


def test_shed_log_is_rate_limited_with_counts() -> None:
    """One line per reason per interval, carrying how many were shed since the last line."""
    log = ShedLog(interval_s=10)
    with capture_logs() as logs:
        for i in range(100):
            log.note(Shed.HEAD_TIMEOUT, i * 0.1)
        log.note(Shed.HEAD_TIMEOUT, 10.0)
        log.note(Shed.IDLE_TIMEOUT, 10.0)
    assert [(e["reason"], e["count"]) for e in logs] == [
        (Shed.HEAD_TIMEOUT, 1),
        (Shed.HEAD_TIMEOUT, 100),
        (Shed.IDLE_TIMEOUT, 1),
    ]


def test_raw_error_is_a_complete_openai_shaped_response() -> None:
    """The server's own refusals carry the OpenAI envelope, a length and a close."""
    response = raw_error(431, "Request Header Fields Too Large", "too big", "head")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert json.loads(body) == {
        "error": {
            "message": "too big",
            "type": "invalid_request_error",
            "param": None,
            "code": "head",
        }
    }


def test_busy_counts_connections_with_a_request_in_progress_not_idle_keep_alive_ones() -> None:
    """What the garbage collector's schedule waits on (gateway/http/collector.py): a load
    balancer's idle keep-alive connections do not keep a server from its full passes."""
    guard = ConnectionGuard(ConnectionLimits(max_connections=10))
    for phase in (Phase.HEAD, Phase.BODY, Phase.BUSY, Phase.IDLE, Phase.IDLE, Phase.IDLE):
        guard.admit(FakeConnection(phase), 0.0)
    assert len(guard.open) == 6
    assert guard.busy() == 3
