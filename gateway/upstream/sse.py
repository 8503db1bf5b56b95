"""Server-sent events as backends write them, read the way an SSE client reads them.

Backends differ in how they frame and spell their events (LF, CRLF or CR line ends; ``data:``
with or without the space; named events; llama.cpp's ``error:`` field; an error object in
OpenAI's shape, TGI's or the flat one of SGLang and older vLLM). Forwarding reads the first
event with these helpers and the relay every later one, so both read them the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from gateway.pipeline.events import UNREADABLE_JSON, FailureKind, status_kind
from gateway.upstream.attempt import AttemptFailed, choice_text, error_status

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
# Checks that an event's data is JSON without building it (about a third of a full decode).
_checker = msgspec.json.Decoder(msgspec.Raw)
ERROR_EVENT: Final = b'data: {"error"'  # the backend's error event in OpenAI's shape
_ERROR_KEY: Final = b'"error"'  # in every error event, in any shape
# What a server-sent event's first line starts with (a field, or ":" for a comment).
SSE_FIELDS: Final = (b"data:", b":", b"event:", b"id:", b"retry:", b"error:")
BOM: Final = b"\xef\xbb\xbf"
# An SSE event ends with a blank line: LF (vLLM, SGLang, llama.cpp), CRLF (sse-starlette's
# default) or CR framing; the first event says which one the stream uses.
EVENT_END: Final = re.compile(rb"\n\n|\r\n\r\n|\r\r")
MAX_EVENT: Final = 1 << 20  # the largest SSE event read from a backend


def keep_alive(event: bytes) -> bool:
    """A whole event with nothing for the caller: blank, fields without data (already made
    blank), or comments only (sse-starlette's ``: ping``, a hosted API's ``: PROCESSING``).
    Such events before the first one are dropped, so the first-byte limit and the handling
    of a first error event apply to the event that starts the answer."""
    if not event.endswith(b"\n\n"):
        return False
    return all(not line or line.startswith(b":") for line in event.split(b"\n"))


def first_of_dialect(event: bytes) -> bytes:
    """A first event not in the relay's dialect: rewritten, or a failed attempt when the answer
    is not server-sent events at all (an HTML page, a JSON answer, an empty body)."""
    if event and not event.strip(b"\n"):  # an empty event (blank lines) before the first one
        return event
    if not event.startswith(SSE_FIELDS):
        raise AttemptFailed(
            FailureKind.BAD_ANSWER,
            "The backend's stream ended before any event."
            if not event
            else "The backend's answer to a stream request is not server-sent events.",
        )
    if event.endswith(b"\n\n"):
        event = standard_event(event[:-2]) + b"\n\n"
    return event


def standard_event(event: bytes) -> bytes:
    """An SSE event (without its blank line) in the one dialect the relay reads.

    Servers may write ``data:`` without the space, name the event (``event: message``,
    ``event: error``), or add ``id:``/``retry:`` lines: a single ``data`` line becomes
    ``data: <value>`` (blank before the value dropped), the other fields dropped. llama.cpp
    writes its errors in an ``error:`` field: it becomes ``data: {"error": <value>}``, the
    relay's error event. An event with several ``data`` lines, or only comments, is returned
    as is (the same object); one with fields but no data (``retry: 3000``, ``event: ping``)
    becomes empty (a client's SSE parser would try to read JSON from it).
    """
    found: bytes | None = None
    error: bytes | None = None
    comments = True
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            if found is not None:
                return event
            found = line[6:] if line[5:6] == b" " else line[5:]
        elif line.startswith(b"error:"):
            error = line[7:] if line[6:7] == b" " else line[6:]
        if not line.startswith(b":"):
            comments = False
    if found is not None:  # blank before JSON is no part of it: ``data:  {`` reads as usual
        return b"data: " + found.lstrip(b" \t")
    if error is not None:
        return b'data: {"error": ' + error + b"}"
    return event if comments else b""


def event_data(event: bytes) -> bytes:
    """The data of a ``data:`` event, as an SSE client reads it: each ``data`` line's value
    (one space after the colon dropped), joined by line feeds; other fields and comments left
    out."""
    if b"\n" not in event:
        return event[6:] if event[5:6] == b" " else event[5:]
    return b"\n".join(
        line[6:] if line[5:6] == b" " else line[5:]
        for line in event.split(b"\n")
        if line.startswith(b"data:")
    )


def event_error(event: bytes) -> dict[str, Any] | None:
    """The error a ``data:`` event carries instead of a chunk, in any shape a backend writes:
    ``{"error": {...}}`` (vLLM, llama.cpp; spaced any way), ``{"error": "..."}`` (TGI) or the
    flat ``{"object": "error", "message": ...}`` (SGLang, older vLLM); ``None`` for a chunk.
    Only an event that names ``"error"`` is decoded."""
    if _ERROR_KEY not in event:
        return None
    raw = event_data(event)
    try:
        data = _decoder.decode(raw)
    except UNREADABLE_JSON:
        data = _python_decoded(raw)  # 1e400, NaN: read as an SDK reads them
    if not isinstance(data, dict) or "choices" in data:
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return error
    if isinstance(error, str) and error:
        return {"message": error}
    return data if data.get("object") == "error" else None


def stream_error(event: bytes) -> AttemptFailed:
    """A stream whose first event is the backend's error: a failure with that error's status.

    Nothing reached the caller yet, so it is handled like an HTTP error answer (vLLM 0.11 puts
    "Request id ... already running." there; a 5xx may be retried on another replica).
    """
    inner = event_error(event) or {}
    status = error_status(inner)
    message = inner.get("message")
    text = message[:2000] if isinstance(message, str) and message else "The backend failed."
    return AttemptFailed(status_kind(status), text, status=status, body=inner)


def joined_event(event: bytes) -> bytes | None:
    """An event whose data spans several lines, as the one ``data: <JSON>`` line the relay
    reads (the lines an SSE client joins with line feeds, each line feed made a space: both
    are blank between JSON's values, and JSON has none inside a string); ``None`` where the
    joined data is not JSON."""
    data = event_data(event)
    if not _json_data(data):
        return None
    return b"data: " + data.replace(b"\n", b" ").lstrip(b" \t")


def is_json(event: bytes) -> bool:
    """Is a ``data:`` event's data JSON (what an OpenAI client decodes)? Checked, not built.

    The check skips strings unread, so text outside ASCII is also checked to be UTF-8: an
    SSE client decodes each line as UTF-8 before any JSON (the openai client fails on a
    stray byte), and the relay's own reads of an event decode it whole."""
    return _json_data(event_data(event))


def _json_data(data: bytes) -> bool:
    """:func:`is_json` for an event's data."""
    try:
        _checker.decode(data)
        if not data.isascii():
            data.decode()
    except (*UNREADABLE_JSON, UnicodeDecodeError):
        return _python_json(data)
    return True


def _python_json(data: bytes) -> bool:
    """Data the strict check refused that Python's ``json`` (the openai client's reader) still
    reads: ``NaN`` and ``Infinity``, which servers on Python's ``json.dumps`` write (a logprob
    of ``-Infinity`` from llama-cpp-python). Only the refused path comes here."""
    if b"NaN" not in data and b"Infinity" not in data:
        return False
    return _python_decoded(data) is not _UNREADABLE


_UNREADABLE: Final = object()  # what ``_python_decoded`` gives for data Python cannot read


def _python_decoded(data: bytes) -> Any:
    """``data`` as Python's ``json`` (the openai client's reader) builds it, for what the strict
    decoder refuses: a number past a double's range (``1e400`` is infinity there), ``NaN``;
    ``_UNREADABLE`` where that fails too. Only the refused paths come here."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return _UNREADABLE


def quoted_keys(event: bytes, secrets: Sequence[str]) -> list[str]:
    """The upstream keys in ``secrets`` that a ``data:`` event quotes: as sent, or written with
    JSON escapes (``\\/`` for ``/``, as PHP's json_encode writes it), which the caller's JSON
    decoder reads as the key. Only an event with an escape in it is decoded."""
    found = [key for key in secrets if key.encode() in event]
    if len(found) == len(secrets) or b"\\" not in event:
        return found
    try:
        data = _decoder.decode(event_data(event))
    except UNREADABLE_JSON:
        return found
    strings: list[str] = []
    pending: list[Any] = [data]
    while pending:  # every string of the data, keys included (no recursion: deep nesting)
        value = pending.pop()
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            strings.extend(value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return found + [
        key for key in secrets if key not in found and any(key in text for text in strings)
    ]


def unasked(data: dict[str, Any]) -> bytes | None:
    """An event carrying ``usage`` that the gateway asked for and the caller did not: dropped
    when it has no choices (vLLM's usage chunk), otherwise sent on without its ``usage``."""
    if not data.get("choices"):
        return None
    return b"data: " + _encoder.encode({k: v for k, v in data.items() if k != "usage"}) + b"\n\n"


def first_choice_text(event: bytes) -> str | None:
    """The text a ``data:`` chunk adds to its first choice (a chat delta's or a completion's)."""
    return choice_text(event[6:], "delta")
