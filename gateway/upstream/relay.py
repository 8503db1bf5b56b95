"""Relaying a backend's SSE stream to the client, event by event, never buffering the answer.

The relay records ``usage`` (for token limits and telemetry), drops the usage chunk the gateway
asked for on the caller's behalf, and keeps the streaming contract: if the backend fails or
stalls after the first byte, the client gets an in-band error event and **no** ``[DONE]``, so
a truncated answer never looks complete. vLLM (and SGLang) follow their own in-stream error
event with ``data: [DONE]``; the relay stops at the error, so that ``[DONE]`` never reaches the
caller, the stream counts as failed and no usage is made up for it.

What the stream delivered (tokens, final chunks, usage) is counted by its base class,
:class:`~gateway.upstream.stream_tally.StreamTally`; the causes of a cut and their outcomes are
in gateway/upstream/stream_cuts.py.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import msgspec
import structlog

from gateway.pipeline.errors import error_body
from gateway.pipeline.events import UNREADABLE_JSON, UPSTREAM_FAILURES, Outcome, Usage
from gateway.upstream.attempt import error_status
from gateway.upstream.forwarding import Exchange
from gateway.upstream.keys import blank
from gateway.upstream.sse import (
    ERROR_EVENT,
    MAX_EVENT,
    event_error,
    is_json,
    joined_event,
    quoted_keys,
    standard_event,
)
from gateway.upstream.stream_cuts import CUT_OUTCOMES, CUT_STATUS, Cut, error_event
from gateway.upstream.stream_tally import StreamTally

_log = structlog.get_logger("tiergate.relay")
_checker = msgspec.json.Decoder(msgspec.Raw)  # an event's data is JSON: checked, not built
_DONE = b"data: [DONE]"
_DATA = b"data: "
_DATA_OBJECT = b"data: {"
_BLANKS: Final = (b" ", b"\t")  # after ``data: ``: more blank before the data
_ERROR_KEY = b'"error"'  # in an error event of any shape (and in a chunk now and then)
_SEP = b"\n\n"
DATA_LINE = b"data:"  # in what a read lets through: an event with data came
_LF = 0x0A  # b"\n"[0]
# A ``usage`` object (not ``"usage": null``, as OpenAI and SGLang send on every chunk) to parse.
_USAGE = b'"usage"'
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


def _closed(_outcome: str, _usage: Usage | None) -> None:
    """What a closed relay's ``on_close`` becomes."""


class StreamRelay(StreamTally):
    """Turns an :class:`Exchange` into the byte stream the client receives.

    The relay reports to its caller only: ``on_event`` (if given) sees each event relayed,
    ``on_close`` is called exactly once, with the outcome and the usage (the backend's, or
    the relay's own count from ``prompt_tokens`` and the content chunks, at most
    ``max_tokens`` per choice).

    The stream reaches the caller as complete only when the backend ended it: its final chunk
    (a string ``finish_reason``) or, when ``choices`` > 1, one for each choice it started
    (by ``index``: a backend that ignores ``n`` starts one), then ``[DONE]`` or,
    for a server that never sends ``[DONE]``, the clean end of the body (the relay then sends
    the ``[DONE]``). Every other end is an in-band error event without ``[DONE]``, an outcome
    other than ``complete`` and a :class:`Cut` in ``cut``.
    """

    def __init__(
        self,
        exchange: Exchange,
        *,
        strip_usage: bool,
        idle_s: float,
        on_close: Callable[[str, Usage | None], None],
        on_event: Callable[[bytes], None] | None = None,
        prompt_tokens: int = 0,
        max_tokens: int | None = None,
        capture: bool = False,
        choices: int = 1,
    ) -> None:
        super().__init__(
            strip_usage=strip_usage,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            capture=capture,
            choices=choices,
        )
        self.exchange = exchange
        self.on_event = on_event
        self.idle_s = idle_s
        self.on_close = on_close
        self.done = False
        self.errored = False
        self.ended = False  # [DONE] or the backend's error: nothing after it is relayed
        self.closed = False
        self.outcome: str = Outcome.CLIENT_DISCONNECT
        self.cut: Cut | None = None
        self._cr = b""  # a CRLF stream's read that ended between \r and \n: its \r, held back
        self.expired = False  # the request's deadline (timeouts.total_s) cut the stream
        self.silent = False  # the backend sent no chunk for idle_s: the stream was cut
        # When the read now waiting for the backend began, or its last chunk came if later
        # (0.0: none is waiting; the relay may be parked while the client drains what it was
        # given). Keep-alive comments and pieces of an event do not move it.
        self.reading_since = 0.0
        # The start of an event whose end has not arrived yet; grown in place once it spans
        # more than two pieces: a pumped stream hands over every chunk of the body on its own,
        # and copying the start again for each would cost time quadratic in the event's size
        # (a backend's one-byte chunks).
        self._rest: bytes | bytearray = b""
        self._timers: list[asyncio.TimerHandle | None] = []  # cancelled when the relay closes

    async def close(self) -> None:
        """Run after the response: make sure the lease is back even if iteration never ended."""
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for timer in self._timers:
            if timer is not None:
                timer.cancel()
        if self.usage is None and self.last_data:
            # Ended early (client gone, backend broke): what was streamed was still served,
            # and limits, budgets and the usage ledger count it.
            self._count_usage()
        if self.cut is not None:
            self.exchange.replica.truncated[self.cut] += 1
            _log.warning(
                "stream.cut",
                tier=self.exchange.pool.tier,
                replica=self.exchange.replica.name,
                cause=self.cut,
                token_events=self.token_events,
            )
        self.exchange.finish(
            abort=not self.done,
            failed=self.outcome in UPSTREAM_FAILURES,
            tokens=self.token_events - 1 if self.choices == 1 else 0,  # n > 1: interleaved
            since=self.first_token_at,
        )
        on_close, self.on_close, self.on_event = self.on_close, _closed, None
        on_close(self.outcome, self.usage)  # then no reference back (the caller's closure
        # holds the relay): a finished stream is freed by reference counting, not the collector

    def _event(self, event: bytes) -> bytes | None:
        """Inspect one complete event; return what to send: ``event`` itself (the very object)
        when it goes out as it came, other bytes (separator included) in its place, or
        ``None`` to drop it."""
        if event.startswith(_DATA_OBJECT):  # the usual: a chunk, checked inline (hot path)
            try:
                _checker.decode(event[6:])  # JSON? (checked, not built; strings skipped)
                if not event.isascii():
                    event.decode()  # an SSE client decodes each line as UTF-8 first
            except (*UNREADABLE_JSON, UnicodeDecodeError):
                if _LF in event:  # data over several lines: read joined
                    return self._data(event)
                if not is_json(event):  # NaN, Infinity: the whole check
                    return self._malformed()
            error = event_error(event) if event.startswith(ERROR_EVENT) else None
            if error is None and not self._chunk(event) and _ERROR_KEY in event:
                error = event_error(event)  # no finish_reason, so no choice's: another shape?
            if error is not None:
                return self._error(event, error)
            return self._passed(event)
        return self._other_event(event)

    def _other_event(self, event: bytes) -> bytes | None:
        """:meth:`_event` for anything but a ``data: {`` event."""
        if event.startswith(_DONE):
            return self._done(event)
        if not event.startswith(_DATA) or event[6:7] in _BLANKS:  # other dialects, ``data:  {``
            standard = standard_event(event)
            if standard is not event:
                sent = self._event(standard)
                return standard + _SEP if sent is standard else sent
            if DATA_LINE not in event:  # comments only
                return self._passed(event)
        elif not event[6:].strip():
            # ``data:`` with no value: an SSE client still hands it on, and an SDK fails to
            # read JSON from it; it reaches the caller blank, like a field-only event.
            return _SEP
        return self._data(event)

    def _data(self, event: bytes) -> bytes | None:
        """An event with data not in the usual spelling: passed on, the backend's in-band
        error, or data that is not JSON. Data over several lines is read (counted, its
        usage recorded) joined into one line, and passed on as sent unless that reading
        changes it (the gateway's usage chunk dropped, an error rewritten)."""
        if _LF in event and (joined := joined_event(event)) is not None:
            sent = self._event(joined)
            return event if sent is joined else sent
        if not is_json(event):
            return self._malformed()
        if _ERROR_KEY in event and (error := event_error(event)) is not None:
            return self._error(event, error)
        return self._passed(event)

    def _passed(self, event: bytes) -> bytes | None:
        """An event that goes on to the caller (the gateway's own usage chunk dropped)."""
        on_event = self.on_event
        if on_event is not None:
            on_event(event)
        if _USAGE in event and event.startswith(_DATA) and _USAGE_OBJECT.search(event):
            return self._usage_event(event)
        return event

    def _error(self, event: bytes, error: dict[str, Any]) -> bytes:
        """The backend's own in-band error, in any shape: passed on in OpenAI's (as sent when it
        starts as OpenAI's does and quotes no upstream key; otherwise rewritten, the key
        blanked), and the stream ends there, whatever the backend sends after it (vLLM:
        [DONE])."""
        on_event = self.on_event
        if on_event is not None:
            on_event(event)
        self.outcome = Outcome.UPSTREAM_ERROR
        self.cut = Cut.UPSTREAM_ERROR
        self.errored = self.ended = True
        secrets = self.exchange.secrets
        quoted = quoted_keys(event, secrets) if secrets else None
        if event.startswith(ERROR_EVENT) and not quoted:
            return event
        message, kind = error.get("message"), error.get("type")
        text = message if isinstance(message, str) and message else "The backend failed."
        kind = kind if isinstance(kind, str) and kind else "server_error"
        if quoted:  # a backend may quote the key it was sent ("Incorrect API key provided"),
            # in any field it writes: blanked before the cut, which could split it
            text, kind = blank(text, quoted), blank(kind, quoted)
        return b"data: " + error_body(text[:2000], kind[:100], None, error_status(error)) + _SEP

    def _malformed(self) -> bytes:
        """An event whose data is not JSON: an SDK fails on it, so the stream ends there as the
        backend's error (the event itself is not passed on)."""
        self.ended = True
        return self._cut(Cut.MALFORMED_EVENT, "The backend sent an event that is not JSON.")

    def _done(self, event: bytes) -> bytes:
        """``[DONE]``: the end of a complete answer only after every choice's final chunk."""
        self.done = self.ended = True
        if not self._finished():
            # llama-cpp-python (``--interrupt_requests``, its default) ends a running stream
            # this way when another request waits: a cut answer, never a complete one.
            return self._cut(
                Cut.NO_FINISH_REASON,
                "The backend ended the stream before the answer was finished.",
            )
        if self.usage is None:
            return self._estimated_usage() + event + _SEP
        return event

    def _split(self, buffer: bytes) -> tuple[bytes, bytes]:
        """What to send of ``buffer``'s complete events, and the incomplete rest.

        Events that go out as they came are sent as the bytes read (one slice, no copy per
        event); only a read with an event changed or dropped is put together again."""
        *events, rest = buffer.split(_SEP)
        out: list[bytes] | None = None
        end = 0  # where the events looked at so far end in ``buffer``
        for event in events:
            sent = self._event(event)
            if sent is not event:
                if out is None:
                    out = [buffer[:end]]
                if sent is not None:
                    out.append(sent)
            elif out is not None:
                out.append(event + _SEP)
            end += len(event) + 2
            if self.ended:
                rest = b""
                break
        if out is None:
            return buffer[:end], rest
        return b"".join(out), rest

    def _to_lf(self, data: bytes, framing: bytes) -> bytes:
        """A CRLF or CR framed stream's bytes with LF line ends (what the relay splits on)."""
        if framing == b"\r\n":
            data = self._cr + data
            self._cr = b"\r" if data[-1:] == b"\r" else b""
            if self._cr:
                data = data[:-1]
        return data.replace(framing, b"\n")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        response = self.exchange.opened.response
        assert response is not None  # noqa: S101  # streams keep their response
        self.start_timers()
        try:
            chunk = self.feed(self.exchange.first_event, framed=True)
            if chunk:
                yield chunk
            waiting_since = time.monotonic()  # the idle clock: only chunks restart it
            while not self.stopped:
                self.reading_since = waiting_since
                data = await response.readany()
                self.reading_since = 0.0
                if not data:
                    break
                chunk = self.feed(data)
                if chunk:
                    now = time.monotonic()
                    if DATA_LINE in chunk:  # an event with data, not a keep-alive comment
                        waiting_since = now
                    yield chunk
                    waiting_since += time.monotonic() - now  # the client's time, not idle
            if ending := self.ending():
                yield ending
        except OSError:
            yield self.lost()
        except Exception:  # noqa: BLE001  # a bug on an odd event: end the stream readably, not cut
            yield self.internal_error()
        finally:
            self._close()

    @property
    def stopped(self) -> bool:
        """Nothing more is read from the backend: the answer ended, failed or was cut."""
        return self.done or self.errored or self.cut is not None

    def feed(self, data: bytes, *, framed: bool = False) -> bytes:
        """Take ``data`` read from the backend; return what of it goes to the client now
        (complete events; the rest waits for the next read). ``framed``: already LF-framed
        (the first event, which forwarding read). An event growing past the size limit cuts
        the stream: its error event is returned and :attr:`stopped` turns true."""
        if not framed:
            self.exchange.replica.heard_at = time.monotonic()
            framing = self.exchange.framing
            if framing is not None:  # LF streams (the usual) pass untouched
                data = self._to_lf(data, framing)
        rest = self._rest
        if rest:
            if _SEP not in data and not (data[:1] == b"\n" and rest[-1] == _LF):
                if type(rest) is bytes:  # a third piece of one event: grow it in place from here
                    rest = self._rest = bytearray(rest)
                rest += data  # the event goes on: nothing to split yet
                return self._oversize(b"") if len(rest) > MAX_EVENT else b""
            data = b"".join((rest, data))
            self._rest = b""
        chunk, tail = self._split(data)
        if tail:
            self._rest = tail
            if len(tail) > MAX_EVENT:
                return self._oversize(chunk)
        return chunk

    def _oversize(self, chunk: bytes) -> bytes:
        """``chunk``, then the error event of an event without end (never buffered whole)."""
        self._rest = b""
        return chunk + self._cut(
            Cut.OVERSIZE_EVENT, "The backend sent an event above the size limit."
        )

    def internal_error(self) -> bytes:
        """The error event of a stream the gateway failed to relay (logged here)."""
        _log.exception("relay.failed")
        return self._cut(Cut.INTERNAL_ERROR, "The gateway failed while relaying the stream.")

    def finish(self) -> None:
        """Close the relay: the backend's exchange finished, ``on_close`` called (once)."""
        self._close()

    def stalled(self) -> None:
        """The client stopped reading and is being cut (``server.stream_stall_s``): when the
        stream closes, the backend's is aborted, the slot freed and the cut counted."""
        if not self.closed and self.cut is None:
            self.cut = Cut.CLIENT_STALL
            self.outcome = CUT_OUTCOMES[Cut.CLIENT_STALL]

    @property
    def complete(self) -> bool:
        """The backend ended the answer and the caller has all of it."""
        return self.outcome == Outcome.COMPLETE

    def _cut(self, cut: Cut, message: str) -> bytes:
        """End the stream as cut short: the outcome, the cause, the caller's error event."""
        self.cut = cut
        self.outcome = CUT_OUTCOMES[cut]
        return error_event(message, CUT_STATUS.get(cut, 502))

    def ending(self) -> bytes:
        """The stream's body ended: complete when the backend finished it, else cut short."""
        if self.cut is not None:
            return b""
        if self.done:
            self.outcome = Outcome.COMPLETE
            return b""
        if self._finished():
            # A server that ends its stream without [DONE] after the final chunk: complete;
            # the caller gets the [DONE] (and the usage chunk) an OpenAI client expects.
            sent = self._event(_DONE)
            ending = _DONE + _SEP if sent is _DONE else sent or b""
            self.outcome = Outcome.COMPLETE
            return ending
        return self._cut(Cut.EARLY_EOF, "The backend ended the stream early.")

    def start_timers(self) -> None:
        """Start the stream's deadline and idle timers (closing the relay cancels them)."""
        self._timers = [self._deadline_timer(), self._idle_timer()]

    def _deadline_timer(self) -> asyncio.TimerHandle | None:
        """One timer for the whole stream (not a check per chunk): at the request's deadline
        the backend's connection is closed, which ends the relay's read with an OSError."""
        deadline = self.exchange.deadline
        if deadline == math.inf:
            return None
        delay = max(0.0, deadline - time.monotonic())
        return asyncio.get_running_loop().call_later(delay, self._expire)

    def _idle_timer(self) -> asyncio.TimerHandle | None:
        """One timer per stream for the tier's idle limit (not one per read): it looks every
        ``idle_s`` at most, and cuts only a read that has waited for the backend that long."""
        if not math.isfinite(self.idle_s):
            return None
        return asyncio.get_running_loop().call_later(self.idle_s, self._check_idle)

    def _check_idle(self) -> None:
        """Close the backend's connection if the read has waited ``idle_s`` (which ends it
        with an OSError), else look again when it could have."""
        if self.closed or self.done:
            return
        since = self.reading_since
        waited = time.monotonic() - since if since else 0.0
        if waited >= self.idle_s:
            self.silent = True
            response = self.exchange.opened.response
            if response is not None:
                response.close()
            return
        asyncio.get_running_loop().call_later(self.idle_s - waited, self._check_idle)

    def lost(self) -> bytes:
        """The error event of a stream whose connection closed: the deadline's, the idle
        limit's, or a reset."""
        if self.expired:
            return self._cut(Cut.DEADLINE, "The stream ran past the request's time limit.")
        if self.silent:
            return self._cut(Cut.STALL, "The backend stopped sending tokens.")
        return self._cut(Cut.RESET, "The connection to the backend was lost mid-stream.")

    def _expire(self) -> None:
        """The request's deadline passed mid-stream: close the backend's connection."""
        if not self.closed and not self.done:
            self.expired = True
            response = self.exchange.opened.response
            if response is not None:
                response.close()
