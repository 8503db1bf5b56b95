"""The request path's vocabulary: how a request ended, as values rather than bare strings.

``Outcome`` is what the observer (access log, metrics, spans) is told when a request ends; an
error that ended it before any answer is named by its error class (``Failure.kind``), e.g.
``CLIENT_GONE``. ``StrEnum`` members compare equal to their strings, so logs and metric labels
keep their values.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Outcome(StrEnum):
    """How a request that got an answer (or the start of one) ended."""

    COMPLETE = "complete"
    CLIENT_DISCONNECT = "client_disconnect"
    UPSTREAM_TRUNCATED = "upstream_truncated"
    UPSTREAM_STALL = "upstream_stall"
    UPSTREAM_RESET = "upstream_reset"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"


# Outcomes where the backend broke the stream: they count against the replica.
UPSTREAM_FAILURES: Final = frozenset(
    {
        Outcome.UPSTREAM_TRUNCATED,
        Outcome.UPSTREAM_STALL,
        Outcome.UPSTREAM_RESET,
        Outcome.UPSTREAM_ERROR,
    }
)
# The error kind of a request whose client left before its answer was ready.
CLIENT_GONE: Final = "ClientGone"
