"""The hostile clients of issue 11, P1 and P3, as measurements against a running server.

P1: one client streams an endless header value; how long does ``/livez`` take meanwhile?
P3: N slowloris clients (one header byte every second), N stopped mid-headers and N sending
a body at 1 byte / 2 s; how many of each are still open after ``hold_s``?
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from dataclasses import dataclass


def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None


def _livez_s(port: int) -> float:
    started = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /livez HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
    while sock.recv(65536):
        pass
    sock.close()
    return time.perf_counter() - started


@dataclass(frozen=True)
class GrowingHeader:
    """P1: /livez latency while one header streams, and how the stream ended."""

    seconds: float
    sent_kib: int
    livez_p50_ms: float
    livez_max_ms: float
    answer: str


def growing_header(port: int, seconds: float) -> GrowingHeader:
    """Stream ``X-Grow: aaaa…`` in 4 KiB writes for ``seconds`` while timing /livez."""
    sent = [0]
    answer = ["still reading after the run"]

    def stream() -> None:
        sock = _connect(port)
        if sock is None:
            answer[0] = "could not connect"
            return
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nX-Grow: ")
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                sock.sendall(b"a" * 4096)
                sent[0] += 4096
        except OSError:
            sock.settimeout(2)
            try:
                first = sock.recv(200).split(b"\r\n", 1)[0]
            except OSError:
                first = b""
            answer[0] = first.decode("latin-1") or "closed without an answer"
        sock.close()

    thread = threading.Thread(target=stream)
    thread.start()
    latencies = []
    while thread.is_alive():
        latencies.append(_livez_s(port))
        time.sleep(0.05)
    thread.join()
    latencies = latencies or [_livez_s(port)]
    return GrowingHeader(
        seconds,
        sent[0] // 1024,
        statistics.median(latencies) * 1000,
        max(latencies) * 1000,
        answer[0],
    )


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def slow_clients(port: int, count: int, hold_s: float) -> dict[str, int]:
    """P3: how many of ``count`` slowloris / mid-header / slow-body clients are open after
    ``hold_s`` (the slow ones keep trickling a byte per second or per two seconds)."""
    kinds = {
        "slowloris": b"GET /livez HTTP/1.1\r\nHost: b\r\nX-Slow: ",
        "mid_headers": b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\n",
        "slow_body": (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        ),
    }
    socks: dict[str, list[socket.socket]] = {}
    for kind, start in kinds.items():
        opened = [s for s in (_connect(port) for _ in range(count)) if s is not None]
        for sock in opened:
            sock.sendall(start)
        socks[kind] = opened
    started = time.monotonic()
    tick = 0
    while time.monotonic() - started < hold_s:
        time.sleep(1.0)
        tick += 1
        for kind, every in (("slowloris", 1), ("slow_body", 2)):
            if tick % every == 0:
                for sock in socks[kind]:
                    with contextlib.suppress(OSError):
                        sock.send(b"x" if kind == "slowloris" else b" ")
    counts = {kind: sum(_still_open(s) for s in opened) for kind, opened in socks.items()}
    for opened in socks.values():
        for sock in opened:
            sock.close()
    return counts
