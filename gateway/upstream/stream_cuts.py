"""Why a stream the backend had started did not reach the caller complete, and what follows.

Each :class:`Cut` maps to the request's outcome (:data:`CUT_OUTCOMES`) and to the status of
the in-band error event the caller gets in its place (:data:`CUT_STATUS`, else 502;
:func:`error_event`), never followed by ``[DONE]``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from gateway.pipeline.errors import error_body
from gateway.pipeline.events import Outcome

_SEP = b"\n\n"


class Cut(StrEnum):
    """Why a stream the backend had started did not reach the caller complete."""

    NO_FINISH_REASON = "no_finish_reason"  # [DONE] before every choice had finished
    EARLY_EOF = "early_eof"  # the body ended with neither [DONE] nor a final chunk
    RESET = "reset"  # the connection to the backend was lost
    STALL = "stall"  # no bytes for the tier's idle timeout
    DEADLINE = "deadline"  # the request's own time limit (timeouts.total_s)
    UPSTREAM_ERROR = "upstream_error"  # the backend's own in-band error event
    OVERSIZE_EVENT = "oversize_event"  # an event above the size limit
    MALFORMED_EVENT = "malformed_event"  # an event whose data is not JSON
    INTERNAL_ERROR = "internal_error"  # the gateway failed while relaying
    CLIENT_STALL = "client_stall"  # the client read nothing for server.stream_stall_s


def error_event(message: str, code: int) -> bytes:
    """An in-band SSE error event in vLLM's shape."""
    return b"data: " + error_body(message, "server_error", None, code) + _SEP


CUT_OUTCOMES: Final = {
    Cut.NO_FINISH_REASON: Outcome.UPSTREAM_TRUNCATED,
    Cut.EARLY_EOF: Outcome.UPSTREAM_TRUNCATED,
    Cut.RESET: Outcome.UPSTREAM_RESET,
    Cut.STALL: Outcome.UPSTREAM_STALL,
    Cut.DEADLINE: Outcome.DEADLINE,
    Cut.UPSTREAM_ERROR: Outcome.UPSTREAM_ERROR,
    Cut.OVERSIZE_EVENT: Outcome.UPSTREAM_ERROR,
    Cut.MALFORMED_EVENT: Outcome.UPSTREAM_ERROR,
    Cut.INTERNAL_ERROR: Outcome.INTERNAL_ERROR,
    Cut.CLIENT_STALL: Outcome.CLIENT_DISCONNECT,
}
CUT_STATUS: Final = {Cut.STALL: 504, Cut.DEADLINE: 504, Cut.INTERNAL_ERROR: 500}
