"""The streams benchmark's load: N streaming chat requests, each on its own connection, held
open for their whole answer; every event is timestamped on arrival.

A raw asyncio protocol on uvloop with httptools' response parser (it undoes chunked transfer
encoding). Connections start evenly over ``--ramp-s``. Per stream it keeps when the connection
was started, when the first byte and the first content event came, and each content event's
arrival time beside the upstream's write time carried in the event (``@<ns>``, see
``upstream.py``). With ``--hangup-fraction`` a share of the clients closes its connection
``--hangup-at-s`` after the ramp started (the disconnect storm). It prints one JSON summary.

Run: ``python bench/streams/client.py --url http://127.0.0.1:8080 --model fast --streams 100``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import httptools
import uvloop

from bench.streams.stats import delays_ms, gaps_ms, summary
from bench.streams.upstream import raise_fd_limit

_STAMP = re.compile(rb'"content":\s*"@(\d+)')
_FINISH = re.compile(rb'"finish_reason":\s*"(\w+)"')


@dataclass
class Record:
    """What one stream saw."""

    number: int
    started: int = 0
    first_byte: int = 0
    status: int = 0
    arrivals: list[int] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    finish: str = ""
    done: bool = False
    complete: bool = False
    error: str = ""
    hung_up: int = 0
    stopper: bool = False  # asks for a long padded answer and stops reading mid-way
    stopped: int = 0


class StreamClient(asyncio.Protocol):
    """One streaming request on its own connection."""

    def __init__(self, record: Record, request: bytes, finished: asyncio.Future[None]) -> None:
        self.record = record
        self.request = request
        self.finished = finished
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.now = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.now = time.monotonic_ns()
        if not self.record.first_byte:
            self.record.first_byte = self.now
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"bad HTTP: {exc}")

    def on_headers_complete(self) -> None:
        self.record.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        data = self.buffer + body
        if b"\n\n" not in data:
            self.buffer = data
            return
        events = data.split(b"\n\n")
        self.buffer = events.pop()
        for event in events:
            self.event(event)

    def event(self, event: bytes) -> None:
        """Handle one server-sent event."""
        record = self.record
        found = _STAMP.search(event)
        if found is not None:
            record.arrivals.append(self.now)
            record.stamps.append(int(found.group(1)))
        elif event.endswith(b"[DONE]"):
            record.done = True
        if not record.finish:
            finish = _FINISH.search(event)
            if finish is not None:
                record.finish = finish.group(1).decode()
        if b'"error"' in event and not record.error:
            record.error = "error event"

    def on_message_complete(self) -> None:
        record = self.record
        record.complete = True
        if record.status != 200:
            record.error = record.error or f"HTTP {record.status}"
        elif not (record.finish and record.done):
            record.error = record.error or "no finish_reason or [DONE]"
        if self.transport is not None:
            self.transport.close()

    def fail(self, why: str) -> None:
        """Record an error and close."""
        self.record.error = self.record.error or why
        if self.transport is not None:
            self.transport.close()

    def hang_up(self) -> None:
        """Close the connection mid-answer (the disconnect storm)."""
        if self.transport is not None and not self.record.complete:
            self.record.hung_up = time.monotonic_ns()
            self.transport.close()

    def stop_reading(self) -> None:
        """Read nothing more, socket left open (a client that stopped reading)."""
        if self.transport is not None and not self.record.complete:
            self.record.stopped = time.monotonic_ns()
            self.transport.pause_reading()

    def read_again(self) -> None:
        """Take what the proxy left (its end shows whether it cut the stream)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        record = self.record
        if not record.complete and not record.hung_up:
            record.error = record.error or f"closed early ({exc or 'EOF'})"
        if not self.finished.done():
            self.finished.set_result(None)


def request_bytes(args: argparse.Namespace, number: int) -> bytes:
    """The HTTP/1.1 request of stream ``number``."""
    # The upstream reads "pace R/s" from the message: proxies pass messages on unchanged.
    pace = f" pace {args.tokens_per_s:g}/s" if args.tokens_per_s else ""
    tokens = args.max_tokens
    if is_stopper(args, number):
        pace += f" pad {args.stop_pad}B"
        tokens = args.stop_tokens
    body: dict[str, Any] = {
        "model": args.model,
        "messages": [{"role": "user", "content": f"stream {number}{pace}: tell me a story"}],
        "stream": True,
        "max_tokens": tokens,
    }
    payload = json.dumps(body).encode()
    host = args.url.removeprefix("http://")
    head = [f"POST {args.path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", "Accept: text/event-stream"]  # fmt: skip
    if args.key:
        head.append(f"Authorization: Bearer {args.key}")
    head += args.header
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def is_stopper(args: argparse.Namespace, number: int) -> bool:
    """Whether stream ``number`` is one of the ``--stop-fraction`` that stop reading."""
    fraction: float = args.stop_fraction
    return fraction > 0 and number % max(1, round(1 / fraction)) == 0


async def hold_stoppers(
    args: argparse.Namespace, begin: float, clients: dict[int, StreamClient]
) -> list[asyncio.Task[None]]:
    """At ``--stop-at-s`` the stoppers stop reading; a task lets them read again after
    ``--stop-hold-s`` and gives them 3 s to reach their end. No stop at all: ``--stop-at-s``
    0 (the control wave, same streams)."""
    if not args.stop_fraction or not args.stop_at_s:
        return []
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, begin + args.stop_at_s - loop.time()))
    stoppers = [c for n, c in clients.items() if is_stopper(args, n)]
    for client in stoppers:
        client.stop_reading()

    async def release() -> None:
        await asyncio.sleep(args.stop_hold_s)
        for client in stoppers:
            client.read_again()
        await asyncio.sleep(3.0)
        for client in stoppers:
            if client.transport is not None and not client.record.complete:
                client.record.error = client.record.error or "still open"
                client.transport.close()

    return [asyncio.create_task(release())]


async def one_stream(
    args: argparse.Namespace, record: Record, clients: dict[int, StreamClient]
) -> None:
    """Open one connection, send the request and wait for the answer's end."""
    loop = asyncio.get_running_loop()
    host, port = args.url.removeprefix("http://").rsplit(":", 1)
    finished: asyncio.Future[None] = loop.create_future()
    record.started = time.monotonic_ns()
    try:
        _, protocol = await loop.create_connection(
            lambda: StreamClient(record, request_bytes(args, record.number), finished),
            host,
            int(port),
        )
    except OSError as exc:
        record.error = f"connect: {exc.strerror or exc}"
        return
    clients[record.number] = protocol
    await finished


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start every stream on the ramp, optionally hang some up, wait, and summarise."""
    loop = asyncio.get_running_loop()
    records = [Record(i) for i in range(args.streams)]
    clients: dict[int, StreamClient] = {}
    begin = loop.time()
    tasks = []
    for record in records:
        delay = begin + args.ramp_s * record.number / max(1, args.streams) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        record.stopper = is_stopper(args, record.number)
        tasks.append(asyncio.create_task(one_stream(args, record, clients)))
    tasks += await hold_stoppers(args, begin, clients)
    if args.hangup_fraction > 0:
        await asyncio.sleep(max(0.0, begin + args.hangup_at_s - loop.time()))
        step = max(1, round(1 / args.hangup_fraction))
        for number, client in list(clients.items()):
            if number % step == 0:
                client.hang_up()
    remaining = begin + args.ramp_s + args.deadline_s - loop.time()
    if args.stop_fraction and args.stop_at_s:
        remaining = max(remaining, begin + args.stop_at_s + args.stop_hold_s + 4 - loop.time())
    _, pending = await asyncio.wait(tasks, timeout=max(0.1, remaining))
    for client in clients.values():
        if not client.record.complete and not client.record.hung_up:
            client.fail("deadline")
    for task in pending:
        task.cancel()
    for record in records:
        if not record.started or (not record.complete and not record.error and not record.hung_up):
            record.error = record.error or "deadline"
    return summarise(records, args)


def stopper_summary(records: list[Record]) -> dict[str, int]:
    """How the streams of clients that stopped reading ended: cut by the proxy (closed
    without their end), complete, or still open when given back their reading."""
    ends = Counter(
        "complete" if r.complete and not r.error
        else "open" if r.error == "still open"
        else "cut" for r in records
    )  # fmt: skip
    return {"n": len(records), "stopped": sum(1 for r in records if r.stopped), **ends}


def summarise(all_records: list[Record], args: argparse.Namespace) -> dict[str, Any]:
    """Numbers the orchestrator reports, from every stream's record (the stoppers' apart:
    every other number is the other streams')."""
    records = [r for r in all_records if not r.stopper]
    gaps: list[float] = []
    delays: list[float] = []
    ttft: list[float] = []
    first_byte: list[float] = []
    arrivals: list[int] = []
    for record in records:
        gaps += gaps_ms(record.arrivals)
        delays += delays_ms(record.arrivals, record.stamps)
        arrivals += record.arrivals[:1] + record.arrivals[-1:]
        if record.arrivals:
            ttft.append((record.arrivals[0] - record.started) / 1e6)
        if record.first_byte:
            first_byte.append((record.first_byte - record.started) / 1e6)
    errors = Counter(r.error.split(":")[0] for r in records if r.error)
    whole = [r for r in records if not r.hung_up]
    span_s = (max(arrivals) - min(arrivals)) / 1e9 if arrivals else 0.0
    events = sum(len(r.arrivals) for r in records)
    return {
        "streams": len(records),
        "ok": sum(1 for r in records if r.complete and not r.error),
        "errors": dict(errors),
        "error_examples": sorted({r.error for r in records if r.error})[:5],
        "events": events,
        "events_whole_streams": sum(len(r.arrivals) for r in whole),
        "expected_whole_streams": len(whole) * args.max_tokens,
        "events_per_s": events / span_s if span_s else 0.0,
        "ttft_ms": summary(ttft),
        "first_byte_ms": summary(first_byte),
        "gap_ms": summary(gaps),
        "delay_ms": summary(delays),
        "hangups": [[r.number, r.hung_up] for r in records if r.hung_up],
        "stoppers": stopper_summary([r for r in all_records if r.stopper]),
    }


def main() -> None:
    """Parse arguments, run the streams, print the summary as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="base URL, http://HOST:PORT")
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--model", required=True)
    parser.add_argument("--key", default="")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tokens-per-s", type=float, default=0.0, help="ask the upstream")
    parser.add_argument("--ramp-s", type=float, default=1.0)
    parser.add_argument("--deadline-s", type=float, default=30.0)
    parser.add_argument("--hangup-fraction", type=float, default=0.0)
    parser.add_argument("--hangup-at-s", type=float, default=2.0)
    parser.add_argument("--stop-fraction", type=float, default=0.0, help="clients that stop")
    parser.add_argument("--stop-at-s", type=float, default=0.0, help="0: they read on")
    parser.add_argument("--stop-hold-s", type=float, default=30.0)
    parser.add_argument("--stop-tokens", type=int, default=800)
    parser.add_argument("--stop-pad", type=int, default=2000, help="bytes added per event")
    args = parser.parse_args()
    raise_fd_limit()
    result = uvloop.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
