"""Raw-socket clients for the adversarial tests: partial heads, slow bodies, idle sockets."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from typing import Any

CRLF = b"\r\n"


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    """A TCP connection to the gateway on loopback."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Read until the server closes: (closed within ``seconds``, what it sent meanwhile)."""
    deadline = time.monotonic() + seconds
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, data
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return False, data
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk


def statuses(data: bytes) -> list[int]:
    """The status of every response in ``data`` (pipelined answers, in order)."""
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def metric_sum(url: str, name: str) -> float:
    """The sum of every sample of metric ``name`` at ``url``/metrics (0 when it has none)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:  # noqa: S310  # loopback
        text = response.read().decode()
    return sum(float(m) for m in re.findall("^" + name + r"(?:\{[^}]*\})? (\S+)$", text, re.M))


def shed_count(url: str, reason: str) -> float:
    """Connections the gateway at ``url`` shed for ``reason`` (its counter must exist)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:  # noqa: S310  # loopback
        text = response.read().decode()
    line = r'^tiergate_connections_shed_total\{reason="' + reason + r'"\} (\S+)$'
    match = re.search(line, text, re.M)
    assert match is not None, text
    return float(match[1])


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid``, in KiB."""
    for line in open(f"/proc/{pid}/status", encoding="ascii"):  # noqa: SIM115  # short read
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP response."""
    return int(response.split(b" ", 2)[1])


def json_body(response: bytes) -> Any:
    """The JSON body of a raw HTTP response."""
    return json.loads(response.partition(b"\r\n\r\n")[2])


def get(
    port: int, path: str, *, keep_alive: bool = False, extra: bytes = b""
) -> tuple[socket.socket, bytes, float]:
    """One GET on a new connection: the socket (open when ``keep_alive``), response, seconds."""
    sock = connect(port)
    started = time.perf_counter()
    connection = b"keep-alive" if keep_alive else b"close"
    sock.sendall(
        b"GET "
        + path.encode()
        + b" HTTP/1.1\r\nHost: gw\r\nConnection: "
        + connection
        + CRLF
        + extra
        + CRLF
    )
    response = read_response(sock)
    elapsed = time.perf_counter() - started
    if not keep_alive:
        sock.close()
    return sock, response, elapsed


def read_response(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """One complete response with a Content-Length body."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(CRLF)[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
