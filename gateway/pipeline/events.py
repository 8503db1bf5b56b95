"""The request path's vocabulary: how an attempt or a request ended, and what it reports.

``Outcome`` is what the observer (access log, metrics, spans) is told when a request ends; an
error that ended it before any answer is named by its error class (``Failure.kind``), e.g.
``ClientGone``. ``FailureKind`` says how one upstream attempt failed (retry rules, replica
health, the ``outcome``/``reason`` metric labels); an HTTP error answer is ``status_<code>``.
``StrEnum`` members compare equal to their strings, so logs and metric labels keep their values.

Forwarding reports each upstream attempt as values (:class:`AttemptStart`,
:class:`AttemptEnd`) to an :class:`AttemptEvents` listener; the pipeline records them on the
request's context and hands them on to telemetry. :data:`NO_EVENTS` listens to nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple, Protocol

import msgspec

# A backend's JSON that cannot be read: malformed, or nested past msgspec's guard (it raises
# RecursionError near 1,000 levels). Every decode of what a backend sent catches both, so a
# hostile answer is undecodable, never a 500.
UNREADABLE_JSON: Final = (msgspec.DecodeError, RecursionError)


class Outcome(StrEnum):
    """How a request that got an answer (or the start of one) ended."""

    COMPLETE = "complete"
    CLIENT_DISCONNECT = "client_disconnect"
    UPSTREAM_TRUNCATED = "upstream_truncated"
    UPSTREAM_STALL = "upstream_stall"
    UPSTREAM_RESET = "upstream_reset"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"
    # The request's own time limit (timeouts.total_s) ended the stream: a long answer, or a
    # client reading slowly; not the backend's failure, so it never counts against a replica.
    DEADLINE = "deadline"


# Outcomes where the backend broke the stream: they count against the replica.
UPSTREAM_FAILURES: Final = frozenset(
    {
        Outcome.UPSTREAM_TRUNCATED,
        Outcome.UPSTREAM_STALL,
        Outcome.UPSTREAM_RESET,
        Outcome.UPSTREAM_ERROR,
    }
)


class FailureKind(StrEnum):
    """How one upstream attempt failed, when it was not an HTTP error answer."""

    NO_REPLICA = "no_replica"
    CONNECT = "connect"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT = "timeout"
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    RESET = "reset"
    MID_STREAM = "mid_stream"
    # A 200 the gateway cannot pass on: not a JSON object, too large, an oversize first event.
    BAD_ANSWER = "bad_answer"


# Failures where no request byte reached a backend: retried elsewhere, free of the budget.
NOT_SENT: Final = frozenset({FailureKind.CONNECT, FailureKind.CONNECT_TIMEOUT})
# Failures where the backend took too long (the caller gets a 504).
TIMEOUTS: Final = frozenset(
    {FailureKind.TIMEOUT, FailureKind.FIRST_BYTE_TIMEOUT, FailureKind.CONNECT_TIMEOUT}
)


def status_kind(status: int) -> str:
    """The failure kind of an HTTP error answer: ``status_<code>``."""
    return f"status_{status}"


@dataclass(slots=True)
class Usage:
    """Token counts reported by the backend (or, when it reports none, counted by the relay)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class AttemptStart(NamedTuple):
    """One upstream attempt is about to be sent (its replica chosen, its id fresh)."""

    tier: str
    replica: str  # host:port
    url: str
    strategy: str
    routed_at: float  # perf_counter when the replica choice began
    prefix_blocks: int
    # True when the prefix ranking chose the replica, False when load overrode it, None when
    # no prefix was followed.
    prefix_match: bool | None
    upstream_request_id: str
    body: Mapping[str, Any]
    # The upstream keys: blanked where a span captures what the backend wrote.
    secrets: tuple[str, ...] = ()


class AttemptEnd(NamedTuple):
    """One upstream attempt ended: opened (``failure`` None) or failed (its kind)."""

    upstream_s: float  # time spent waiting on the backend
    first_chunk_at: float | None = None  # perf_counter when a stream's first event came
    failure: str | None = None  # a FailureKind, status_<code>, or an exception's class name
    body: bytes | None = None  # a complete answer
    first_event: bytes = b""  # a stream's first SSE event


class AttemptEvents(Protocol):
    """Listens to the upstream attempts of one request."""

    def attempt_started(self, start: AttemptStart) -> Mapping[str, str]:
        """An attempt starts; returns extra headers to send with it (trace context)."""
        ...

    def attempt_ended(self, end: AttemptEnd) -> None:
        """The attempt started last has ended."""
        ...


_NO_HEADERS: Final[Mapping[str, str]] = {}


class _NoEvents:
    """Listens to nothing."""

    __slots__ = ()

    def attempt_started(self, start: AttemptStart) -> Mapping[str, str]:
        """No extra headers."""
        return _NO_HEADERS

    def attempt_ended(self, end: AttemptEnd) -> None:
        """Nothing to record."""


NO_EVENTS: Final[AttemptEvents] = _NoEvents()
