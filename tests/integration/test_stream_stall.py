"""A stream whose client stops reading is cut after ``server.stream_stall_s`` (issue 37).

A real gateway in front of the streams benchmark's fixed-rate streamer
(``bench/streams/upstream.py``, a real process): one client opens a fast, long stream on a raw
socket with a small receive buffer and then reads nothing; another streams an answer through the
official client at the same time. The reader's answer arrives whole; the stalled one is cut,
its backend stream aborted, its replica slot freed, and the cut counted with its cause.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_proc import GatewayProcess, fixed_rate_streamer
from tests.processes import patience

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-stream-stall-tests"
MODEL = "tiergate-fast"
_ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}
STALL_S = 1.0
_CUTS = re.compile(r'tiergate_stream_truncated_total\{[^}]*cause="client_stall"[^}]*\} (\S+)')


@pytest.fixture(scope="module")
def streamer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fixed-rate SSE upstream: answers as long as ``max_tokens``, paced per request."""
    with fixed_rate_streamer(tmp_path_factory.mktemp("streamer"), MODEL, 100_000) as url:
        yield url


def _config(upstream: str) -> dict[str, Any]:
    tier = {"model": MODEL, "replicas": [upstream], "max_concurrency": 8}
    return {
        "auth": {"enabled": False, "admin_token": ADMIN},
        "server": {"stream_stall_s": STALL_S},
        "tiers": {"fast": tier, "precise": dict(tier)},
    }


def _stalled_client(gw: GatewayProcess) -> socket.socket:
    """A stream of 4,000 events at 1,000/s on a socket with a 4 KiB receive buffer that is
    never read: the gateway's writes to it pause within a second or two."""
    body = json.dumps({
        "model": "fast", "stream": True, "max_tokens": 4_000,
        "messages": [{"role": "user", "content": "stream 1, pace 1000/s"}],
    }).encode()  # fmt: skip
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + body)
    return sock


def _read_stream(gw: GatewayProcess) -> tuple[int, str | None]:
    """A reader's answer through the official client: content events, finish reason."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    events, finish = 0, None
    for chunk in client.chat.completions.create(
        model="fast",
        messages=[{"role": "user", "content": "stream 2, pace 40/s"}],
        max_tokens=120,
        stream=True,
    ):
        for choice in chunk.choices:
            events += bool(choice.delta.content)
            finish = choice.finish_reason or finish
    return events, finish


def _until(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + patience(seconds)
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def _client_stall_cuts(gw: GatewayProcess) -> float:
    found = _CUTS.search(httpx.get(gw.url + "/metrics", headers=_ADMIN_HEADERS).text)
    return float(found.group(1)) if found else 0.0


def _in_flight(gw: GatewayProcess) -> int:
    view = httpx.get(gw.url + "/admin/backends", headers=_ADMIN_HEADERS)
    return sum(
        replica["in_flight"]
        for tier in view.json()["tiers"].values()
        for replica in tier["replicas"]
    )


def test_a_client_that_stops_reading_is_cut_while_a_reader_beside_it_completes(
    streamer: str,
) -> None:
    with GatewayProcess(_config(streamer)) as gw:
        stalled = _stalled_client(gw)
        try:
            _until(lambda: httpx.get(streamer + "/stats").json()["open"] == 1, 5)
            events, finish = _read_stream(gw)  # 3 s, while the other one stalls
            assert (events, finish) == (120, "length")
            _until(lambda: _client_stall_cuts(gw) == 1.0, STALL_S + 10)
            stats = httpx.get(streamer + "/stats").json()
            assert stats["closed_by_peer"] == 1  # the stalled stream's backend was aborted
            assert stats["completed"] == 1  # the reader's
            assert stats["content_events"] < 4_000 + 120  # cut long before its end
            _until(lambda: _in_flight(gw) == 0, 5)  # its slot is free again
            stalled.settimeout(patience(5))
            received = bytearray()
            with contextlib.suppress(ConnectionResetError):  # else the kernel's bytes, then EOF
                while chunk := stalled.recv(65536):
                    received += chunk
            assert received.startswith(b"HTTP/1.1 200")
            assert b"[DONE]" not in received  # what it got never looks complete
            assert not received.endswith(b"0\r\n\r\n")  # nor ends the chunked body
            assert "client_stall" in gw.log_text()
        finally:
            stalled.close()
