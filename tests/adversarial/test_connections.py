"""P1 and P3 of issue 11 against a real ``tiergate serve``: bounded heads, deadlines, the cap.

Each test here failed on the old server (uvicorn + httptools, no head limit, no deadline
before the first request, no connection cap): the 431, the 408s, the closes and the shed
counters did not exist.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from tests.adversarial.rawhttp import (
    closed_within,
    connect,
    get,
    json_body,
    read_response,
    rss_kib,
    shed_count,
    status_of,
)
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

HEAD_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5
SLACK = 1.5  # the sweeper's tick plus a loaded 2-core machine


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    """Zero-latency fast and precise simulators."""
    with (
        SimulatorProcess(
            "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
        ) as fast,
        SimulatorProcess(
            "--profile", "precise", "--model", "tiergate-precise", "--latency-scale", "0"
        ) as precise,
    ):
        yield fast, precise


def gateway_config(
    sims: tuple[SimulatorProcess, SimulatorProcess], **server: object
) -> dict[str, object]:
    """Auth off, short connection deadlines, ``server`` overrides."""
    return {
        "auth": {"enabled": False},
        "server": {
            "head_timeout_s": HEAD_TIMEOUT,
            "body_timeout_s": BODY_TIMEOUT,
            "idle_timeout_s": IDLE_TIMEOUT,
            **server,
        },
        "tiers": tiers_config([sims[0].url], [sims[1].url]),
    }


@pytest.fixture(scope="module")
def gw(sims: tuple[SimulatorProcess, SimulatorProcess]) -> Iterator[GatewayProcess]:
    """A gateway with short connection deadlines and the default 16 KiB head limit."""
    with GatewayProcess(gateway_config(sims)) as proc:
        yield proc


def _shed(gw: GatewayProcess, reason: str) -> float:
    return shed_count(gw.url, reason)


def _stream_header(port: int, seconds: float, out: dict[str, object]) -> None:
    """Send a header value 1 KiB at a time until the server answers or ``seconds`` pass."""
    sock = connect(port)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Grow: ")
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sock.sendall(b"a" * 1024)
            sent += 1024
            time.sleep(0.001)
    except (BrokenPipeError, ConnectionResetError):
        pass
    out["sent"] = sent
    out["closed"], out["response"] = closed_within(sock, 5)
    sock.close()


def test_growing_header_gets_431_while_livez_stays_fast(gw: GatewayProcess) -> None:
    """A header streamed without end is cut at 16 KiB with a 431; /livez answers meanwhile."""
    out: dict[str, object] = {}
    thread = threading.Thread(target=_stream_header, args=(gw.port, 2.0, out))
    thread.start()
    latencies = []
    while thread.is_alive():
        _, response, elapsed = get(gw.port, "/livez")
        assert status_of(response) == 200
        latencies.append(elapsed)
        time.sleep(0.02)
    thread.join()
    result = out["response"]
    assert isinstance(result, bytes)
    assert status_of(result) == 431, result[:200]
    assert json_body(result)["error"]["code"] == "request_header_fields_too_large"
    assert out["closed"] is True
    assert max(latencies) < 0.5, latencies
    assert _shed(gw, "head_too_large") >= 1


def test_many_growing_headers_do_not_grow_memory(gw: GatewayProcess) -> None:
    """300 clients pushing 64 KiB headers each (19 MiB in all) leave RSS within 8 MiB."""
    for _ in range(20):  # warm up allocator pools first
        get(gw.port, "/livez")
    before = rss_kib(gw.pid)
    for _ in range(300):
        sock = connect(gw.port)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"b" * 65536)
        closed, response = closed_within(sock, 5)
        sock.close()
        assert closed
        assert not response or status_of(response) == 431
    assert rss_kib(gw.pid) - before < 8 * 1024


def test_pipelined_growing_header_gets_431(gw: GatewayProcess) -> None:
    """A header growing behind a complete request on the same connection is cut at the limit."""
    sock = connect(gw.port)
    sock.sendall(
        b"GET /livez HTTP/1.1\r\nHost: gw\r\n\r\nGET /livez HTTP/1.1\r\nHost: gw\r\nX-Grow: "
    )
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for _ in range(256):
            sock.sendall(b"p" * 1024)
            time.sleep(0.002)
    closed, data = closed_within(sock, 5)
    sock.close()
    assert closed
    assert data.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 431" in data


def test_head_over_the_limit_in_one_piece_gets_431(gw: GatewayProcess) -> None:
    """A complete 20 KiB head sent at once is refused with 431 and the connection closed."""
    _, response, _ = get(gw.port, "/livez", extra=b"X-Big: " + b"c" * 20_000 + b"\r\n")
    assert status_of(response) == 431
    assert json_body(response)["error"]["type"] == "invalid_request_error"


def test_head_under_the_limit_is_served(gw: GatewayProcess) -> None:
    """A 15 KiB head (big cookies, long traces) is below the limit and served."""
    _, response, _ = get(gw.port, "/livez", extra=b"X-Big: " + b"c" * 15_000 + b"\r\n")
    assert status_of(response) == 200


def test_slowloris_connections_are_closed_after_the_head_timeout(gw: GatewayProcess) -> None:
    """30 clients trickling one header byte every 0.2 s are all closed with 408 in time."""
    socks = [connect(gw.port) for _ in range(30)]
    for sock in socks:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
    started = time.monotonic()
    alive = list(socks)
    while alive and time.monotonic() - started < HEAD_TIMEOUT + SLACK:
        for sock in list(alive):
            try:
                sock.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                alive.remove(sock)
        time.sleep(0.2)
    results = [closed_within(sock, 1.0) for sock in socks]
    for sock in socks:
        sock.close()
    assert all(closed for closed, _ in results)
    assert any(data.startswith(b"HTTP/1.1 408") for _, data in results)
    assert _shed(gw, "head_timeout") >= 30


def test_connection_stopped_mid_headers_is_closed(gw: GatewayProcess) -> None:
    """A head that stops half-way gets 408 and a close after the head timeout, not before."""
    sock = connect(gw.port)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
    early, _ = closed_within(sock, HEAD_TIMEOUT * 0.5)
    closed, data = closed_within(sock, HEAD_TIMEOUT + SLACK)
    sock.close()
    assert not early
    assert closed
    assert status_of(data) == 408
    assert json_body(data)["error"]["code"] == "request_timeout"


def test_connection_that_never_sends_is_closed(gw: GatewayProcess) -> None:
    """A connection that sends nothing at all is closed after the head timeout, silently."""
    sock = connect(gw.port)
    closed, data = closed_within(sock, HEAD_TIMEOUT + SLACK)
    sock.close()
    assert closed
    assert data == b""


def test_idle_keep_alive_connection_is_closed(gw: GatewayProcess) -> None:
    """After a response, a keep-alive connection stays usable, then idles out."""
    sock, response, _ = get(gw.port, "/livez", keep_alive=True)
    assert status_of(response) == 200
    early, _ = closed_within(sock, IDLE_TIMEOUT * 0.5)
    assert not early
    sock.sendall(b"GET /livez HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status_of(read_response(sock)) == 200
    closed, data = closed_within(sock, IDLE_TIMEOUT + SLACK)
    sock.close()
    assert closed
    assert data == b""
    assert _shed(gw, "idle_timeout") >= 1


def _post_head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(length).encode() + b"\r\n\r\n"
    )


def test_slow_body_upload_is_closed(gw: GatewayProcess) -> None:
    """A body sent at 1 byte every 0.3 s (below 1 KiB/s) gets 408 and a close."""
    socks = [connect(gw.port) for _ in range(10)]
    for sock in socks:
        sock.sendall(_post_head(1000) + b"{")
    started = time.monotonic()
    while time.monotonic() - started < BODY_TIMEOUT + SLACK:
        for sock in socks:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b" ")
        time.sleep(0.3)
    results = [closed_within(sock, 1.0) for sock in socks]
    for sock in socks:
        sock.close()
    assert all(closed for closed, _ in results)
    assert all(status_of(data) == 408 for _, data in results if data)
    assert _shed(gw, "body_timeout") >= 10


def test_stalled_body_is_closed(gw: GatewayProcess) -> None:
    """A body that stops after its head is closed with 408 after the body timeout."""
    sock = connect(gw.port)
    sock.sendall(_post_head(100))
    closed, data = closed_within(sock, BODY_TIMEOUT + SLACK)
    sock.close()
    assert closed
    assert status_of(data) == 408


def test_body_in_pieces_at_a_fair_rate_is_served(gw: GatewayProcess) -> None:
    """A body sent in four pieces over 0.6 s is read and answered normally."""
    body = (
        b'{"model": "tiergate-fast", "max_tokens": 4, '
        b'"messages": [{"role": "user", "content": "' + b"y" * 4000 + b'"}]}'
    )
    sock = connect(gw.port)
    sock.sendall(_post_head(len(body)))
    step = len(body) // 4 + 1
    for i in range(0, len(body), step):
        time.sleep(0.2)
        sock.sendall(body[i : i + step])
    response = read_response(sock)
    sock.close()
    assert status_of(response) == 200, response[:300]


CAP = 20
RESERVE = 5


@pytest.fixture(scope="module")
def capped(sims: tuple[SimulatorProcess, SimulatorProcess]) -> Iterator[GatewayProcess]:
    """A gateway capped at 20 connections (+5 for probes), with long deadlines."""
    config = gateway_config(
        sims,
        max_connections=CAP,
        max_connections_reserve=RESERVE,
        head_timeout_s=60,
        body_timeout_s=60,
        idle_timeout_s=60,
    )
    with GatewayProcess(config) as proc:
        yield proc


def _chat(port: int) -> int:
    body = (
        b'{"model": "tiergate-fast", "max_tokens": 4, '
        b'"messages": [{"role": "user", "content": "hi"}]}'
    )
    sock = connect(port)
    sock.sendall(
        _post_head(len(body)).replace(b"Host: gw", b"Host: gw\r\nConnection: close") + body
    )
    response = read_response(sock)
    sock.close()
    return status_of(response)


def test_idle_connections_over_the_cap_do_not_stop_legitimate_requests(
    capped: GatewayProcess,
) -> None:
    """60 silent connections against a cap of 20: new clients get served, the oldest go."""
    silent = [connect(capped.port) for _ in range(60)]
    try:
        statuses = [_chat(capped.port) for _ in range(10)]
        _, livez, _ = get(capped.port, "/livez")
        closed = sum(closed_within(sock, 0.05)[0] for sock in silent)
    finally:
        for sock in silent:
            sock.close()
    assert statuses == [200] * 10
    assert status_of(livez) == 200
    assert closed >= 60 - CAP  # evicted for the newer ones; at most CAP remain
    assert _shed(capped, "evicted_for_new_connection") >= 40


def test_busy_connections_at_the_cap_leave_livez_served(capped: GatewayProcess) -> None:
    """With every slot reading a body, probes still get /livez and the rest a clean 503."""
    busy = [connect(capped.port) for _ in range(CAP)]
    for sock in busy:
        sock.sendall(_post_head(100))
    time.sleep(0.3)
    try:
        _, livez, _ = get(capped.port, "/livez")
        _, models, _ = get(capped.port, "/v1/models")
        chat = _chat(capped.port)
    finally:
        for sock in busy:
            sock.close()
    assert status_of(livez) == 200
    assert status_of(models) == 503
    assert b"retry-after: 1" in models.lower()
    assert json_body(models)["error"]["code"] == "server_overloaded"
    assert chat == 503
    assert _shed(capped, "over_capacity") >= 2
    time.sleep(0.3)
    assert _chat(capped.port) == 200  # once they are gone, business as usual


def test_shedding_is_logged_at_a_bounded_rate(capped: GatewayProcess) -> None:
    """Each kind of shedding logs a connection.shed line with a count, not one per connection.

    It sheds connections itself (60 silent ones over a cap of 20: about 40 evictions): under
    xdist's work stealing the tests that shed before it may have run on another worker, with
    their own gateway, and left this one's log without a line."""
    silent = [connect(capped.port) for _ in range(60)]
    try:
        assert _chat(capped.port) == 200
    finally:
        for sock in silent:
            sock.close()
    deadline = time.monotonic() + patience(5.0)
    lines: list[str] = []
    while not any("evicted_for_new_connection" in line for line in lines):
        assert time.monotonic() < deadline, capped.log_text()[-2000:]
        time.sleep(0.05)
        lines = [line for line in capped.log_text().splitlines() if "connection.shed" in line]
    assert _shed(capped, "evicted_for_new_connection") >= 40
    assert len(lines) < 10, lines
