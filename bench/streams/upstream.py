"""A fixed-rate streaming OpenAI-compatible upstream for the streams benchmark.

Every ``POST`` with ``"stream": true`` is answered with server-sent events at a fixed rate:
``--tokens`` content events (or the request's ``max_tokens`` when smaller) at
``--tokens-per-s``, the first one ``--first-token-ms`` after the request, then a final chunk
carrying ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks for it,
and ``data: [DONE]``. A request may override the rate and the first-token delay with the extra
body fields ``bench_tokens_per_s`` and ``bench_first_token_ms``, or the rate with the words
``pace <rate>/s`` in a message (which every proxy passes on; TierGate refuses unknown fields).
A message's ``stream <n>`` names the stream in ``GET /stats``; ``pad <n>B`` adds n bytes of text
to each of its content events.

Each content event's text is ``@<ns> `` where ``<ns>`` is ``time.monotonic_ns()`` when the
event was written, so a client on the same machine measures how long every event took to
reach it, through whatever proxy sits in between.

One periodic tick (a timer wheel with 1 ms slots) writes every due event; there is no timer or
task per stream, so one process holds tens of thousands of open streams. A stream gets at
most one event per slot, so rates above 1,000 events/s per stream are not reached.
Non-streaming POSTs, ``/health``, ``/v1/models`` and ``/metrics`` answer as
``bench/harness/fixed_upstream.py`` does.
``GET /stats`` returns counters as JSON (streams started, completed, closed by the peer with
the time of each close, content events written).

Run: ``python bench/streams/upstream.py --port 8001 [--tokens 64 --tokens-per-s 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import uvloop

from bench.harness.fixed_upstream import RequestProtocol, build_responses

SLOT_NS = 1_000_000  # the wheel's resolution: 1 ms
_STREAM_ID = re.compile(rb"stream (\d+)")
_PACE = re.compile(rb"pace (\d+(?:\.\d+)?)/s")
_PAD = re.compile(rb"pad (\d+)B")
MAX_PAD = 65536
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


@dataclass(frozen=True)
class Pace:
    """How one answer is streamed: how many content events, how fast, after what delay."""

    tokens: int
    tokens_per_s: float
    first_token_ms: float


@dataclass
class Counters:
    """What ``GET /stats`` reports."""

    started: int = 0
    completed: int = 0
    content_events: int = 0
    closed_by_peer: int = 0
    aborts: list[tuple[int, int]] = field(default_factory=list)  # (stream id, monotonic ns)
    open_streams: int = 0

    def as_json(self) -> bytes:
        """The counters as a JSON document."""
        doc = {
            "started": self.started,
            "completed": self.completed,
            "content_events": self.content_events,
            "closed_by_peer": self.closed_by_peer,
            "open": self.open_streams,
            "aborts": self.aborts,
        }
        return json.dumps(doc).encode()


def chunked(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding ``payload``."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def sse(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``doc`` as compact JSON."""
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def chunk_doc(
    stream_id: str, model: str, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    """An OpenAI ``chat.completion.chunk`` with one choice."""
    return {
        "id": stream_id,
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Stream:
    """One answer being streamed: pre-rendered event halves around each event's timestamp."""

    __slots__ = ("_later", "due_ns", "ended", "interval_ns", "number", "pace", "prefix",
                 "protocol", "sent", "suffix", "tail")  # fmt: skip

    def __init__(
        self, protocol: StreamProtocol, number: int, pace: Pace, tail: bytes, now_ns: int, *,
        pad: int = 0,
    ) -> None:  # fmt: skip
        self.protocol = protocol
        self.number = number
        self.pace = pace
        model = protocol.model
        first = sse(
            chunk_doc(f"chatcmpl-s{number}", model, {"role": "assistant", "content": "\x00"}, None)
        )
        # ``pad`` bytes of text after each event's timestamp (a client that stops reading
        # then fills the buffers on the way in seconds, not minutes).
        filler = b"x" * pad
        self.prefix, suffix = first.split(b"\\u0000")
        self.suffix = filler + suffix
        later = sse(chunk_doc(f"chatcmpl-s{number}", model, {"content": "\x00"}, None))
        later_prefix, later_suffix = later.split(b"\\u0000")
        self._later = (later_prefix, filler + later_suffix)
        self.tail = tail
        self.sent = 0
        self.ended = False
        self.interval_ns = int(1e9 / pace.tokens_per_s)
        self.due_ns = now_ns + int(pace.first_token_ms * 1e6)

    def emit(self, stamp: bytes) -> bool:
        """Write the next event (and the tail after the last); whether more are due."""
        event = self.prefix + b"@" + stamp + b" " + self.suffix
        if self.sent == 0:
            self.prefix, self.suffix = self._later
        self.sent += 1
        last = self.sent >= self.pace.tokens
        payload = chunked(event)
        if last:
            payload += self.tail
        self.protocol.write(payload)
        if last:
            self.ended = True
            self.protocol.stream_done()
        return not last


class Wheel:
    """Every open stream, bucketed by the 1 ms slot its next event is due in; one tick a slot."""

    def __init__(self, counters: Counters) -> None:
        self.slots: dict[int, list[Stream]] = {}
        self.counters = counters
        self.last_slot = time.monotonic_ns() // SLOT_NS
        self.ticking = False

    def add(self, stream: Stream) -> None:
        """Schedule ``stream``'s next event."""
        if not self.ticking:
            self.ticking = True
            self.last_slot = time.monotonic_ns() // SLOT_NS - 1
            asyncio.get_running_loop().call_soon(self.tick)
        slot = max(-(-stream.due_ns // SLOT_NS), self.last_slot + 1)
        self.slots.setdefault(slot, []).append(stream)

    def tick(self) -> None:
        """Write every event due up to now, reschedule the streams, and arm the next tick."""
        now = time.monotonic_ns()
        now_slot = now // SLOT_NS
        stamp = str(now).encode()
        slots = self.slots
        written = 0
        for slot in range(self.last_slot + 1, now_slot + 1):
            bucket = slots.pop(slot, None)
            if not bucket:
                continue
            for stream in bucket:
                if stream.ended:
                    continue
                written += 1
                if stream.emit(stamp):
                    stream.due_ns += stream.interval_ns
                    due_slot = max(-(-stream.due_ns // SLOT_NS), now_slot + 1)
                    slots.setdefault(due_slot, []).append(stream)
        self.counters.content_events += written
        self.last_slot = now_slot
        if slots:
            asyncio.get_running_loop().call_later(SLOT_NS / 1e9, self.tick)
        else:
            self.ticking = False


class StreamProtocol(RequestProtocol):
    """A keep-alive connection: streaming POSTs go to the wheel, the rest answer at once."""

    def __init__(self, responses: dict[str, bytes], model: str, pace: Pace, wheel: Wheel) -> None:
        super().__init__()
        self.responses = responses
        self.model = model
        self.pace = pace
        self.wheel = wheel
        self.body = b""
        self.stream: Stream | None = None

    def on_body(self, body: bytes) -> None:
        self.body += body

    def write(self, payload: bytes) -> None:
        """Write to the connection (nothing once it is closed)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(payload)

    def stream_done(self) -> None:
        """The answer's last event was written."""
        self.stream = None
        self.wheel.counters.completed += 1
        self.wheel.counters.open_streams -= 1

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        body, self.body, self._url = self.body, b"", b""
        if method == b"GET" and path == "/stats":
            payload = self.wheel.counters.as_json()
            self.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                       b"content-length: %d\r\n\r\n%b" % (len(payload), payload))  # fmt: skip
            return
        if method != b"POST":
            self.write(self.responses.get(path, self.responses["404"]))
            return
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        if not isinstance(request, dict) or request.get("stream") is not True:
            self.write(self.responses["POST"])
            return
        self.start_stream(request, body)

    def start_stream(self, request: dict[str, Any], body: bytes) -> None:
        """Send the response head and put the answer on the wheel."""
        pace = pace_for(request, self.pace)
        paced = _PACE.search(body)
        if paced is not None and float(paced.group(1)) > 0:
            pace = Pace(pace.tokens, float(paced.group(1)), pace.first_token_ms)
        padded = _PAD.search(body)
        pad = min(int(padded.group(1)), MAX_PAD) if padded else 0
        found = _STREAM_ID.search(body)
        number = int(found.group(1)) if found else -1
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        finish = "length" if pace.tokens < self.pace.tokens else "stop"
        tail = answer_tail(f"chatcmpl-s{number}", self.model, finish, pace.tokens, usage)
        counters = self.wheel.counters
        counters.started += 1
        counters.open_streams += 1
        self.write(_HEAD)
        self.stream = Stream(self, number, pace, tail, time.monotonic_ns(), pad=pad)
        self.wheel.add(self.stream)

    def connection_lost(self, exc: Exception | None) -> None:
        stream, self.stream = self.stream, None
        self._transport = None
        if stream is not None and not stream.ended:
            stream.ended = True
            counters = self.wheel.counters
            counters.closed_by_peer += 1
            counters.open_streams -= 1
            counters.aborts.append((stream.number, time.monotonic_ns()))


def pace_for(request: dict[str, Any], default: Pace) -> Pace:
    """The request's pace: ``max_tokens`` caps the answer; extra fields override the rest."""
    tokens = default.tokens
    limit = request.get("max_tokens") or request.get("max_completion_tokens")
    if isinstance(limit, int) and 0 < limit < tokens:
        tokens = limit
    rate = request.get("bench_tokens_per_s", default.tokens_per_s)
    delay = request.get("bench_first_token_ms", default.first_token_ms)
    if not isinstance(rate, int | float) or rate <= 0:
        rate = default.tokens_per_s
    if not isinstance(delay, int | float) or delay < 0:
        delay = default.first_token_ms
    return Pace(tokens, float(rate), float(delay))


def answer_tail(stream_id: str, model: str, finish: str, tokens: int, usage: bool) -> bytes:
    """What follows the last content event: the finish chunk, usage if asked, [DONE], the end."""
    parts = [sse(chunk_doc(stream_id, model, {}, finish))]
    if usage:
        doc = chunk_doc(stream_id, model, {}, None)
        doc["choices"] = []
        doc["usage"] = {"prompt_tokens": 12, "completion_tokens": tokens,
                        "total_tokens": 12 + tokens}  # fmt: skip
        parts.append(sse(doc))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(chunked(p) for p in parts) + b"0\r\n\r\n"


def raise_fd_limit(at_least: int = 0) -> int:
    """Raise this process' open-file soft limit to its hard limit, and both to ``at_least``
    where the process may raise its hard limit (root, CAP_SYS_RESOURCE); return the new limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < at_least:
        # Unprivileged, this fails: the report states the limit the run had.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, at_least))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def serve(host: str, port: int, model: str, pace: Pace) -> None:
    """Listen until cancelled."""
    responses = build_responses(model)
    wheel = Wheel(Counters())
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: StreamProtocol(responses, model, pace, wheel),
        host,
        port,
        backlog=16384,
        reuse_address=True,
    )
    print(f"stream upstream listening on http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Parse arguments and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tiergate-fast")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tokens-per-s", type=float, default=20.0)
    parser.add_argument("--first-token-ms", type=float, default=0.0)
    args = parser.parse_args()
    raise_fd_limit()
    pace = Pace(args.tokens, args.tokens_per_s, args.first_token_ms)
    uvloop.run(serve(args.host, args.port, args.model, pace))


if __name__ == "__main__":
    main()
