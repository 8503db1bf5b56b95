"""The overhead benchmark's memory-phase mix, sent once per kind to a real gateway and upstream."""

from __future__ import annotations

import select
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.legs import Leg, Placement, start_fixed_upstream
from bench.harness.processes import post_json
from bench.harness.wrk import STATUS_MARK, parse_statuses
from bench.overhead.legs import start_tiergate
from bench.overhead.memory import CYCLE, KINDS, Kind, kind_request, lua_mix_script, mix_for
from bench.overhead.report import MemoryMix
from bench.overhead.variants import VARIANTS

NO_PIN = Placement.build(pin=False, boost=False)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leg]:
    """The fixed-response upstream the benchmark puts behind every proxy."""
    leg = start_fixed_upstream(tmp_path_factory.mktemp("upstream"), NO_PIN)
    yield leg
    leg.stop()


@pytest.fixture(scope="module")
def gateway(upstream: Leg, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leg]:
    """``tiergate serve`` as the ``auth-redis`` variant: file keys and the Redis limiter."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed (make redis-server)")
    leg = start_tiergate(VARIANTS["auth-redis"], upstream, tmp_path_factory.mktemp("gw"), NO_PIN)
    yield leg
    leg.stop()


def _send(leg: Leg, kind: Kind) -> int:
    """POST one request of ``kind`` as wrk does: read the answer while still writing the body.

    A gateway may answer 413 and close before the body is sent; a client that only reads once
    it has written everything (urllib) sees a reset instead of the answer.
    """
    request = kind_request(kind, leg)
    body = (request.prefix + "x" * request.fill + request.suffix).encode()
    head = [f"POST {leg.chat_path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in request.headers.items()]
    data = memoryview(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    port = int(leg.base_url.rsplit(":", 1)[1])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        while b"\r\n" not in answer:
            readable, writable, _ = select.select([sock], [sock] if data else [], [], 30)
            if readable:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            elif writable:
                try:
                    data = data[sock.send(data[:65536]) :]
                except (BrokenPipeError, ConnectionResetError):
                    data = memoryview(b"")
            else:
                break
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_each_kind_gets_its_status(gateway: Leg, kind: Kind) -> None:
    """Every kind in the mix gets exactly the status the benchmark expects from the gateway."""
    assert _send(gateway, kind) == kind.status


def test_mix_interleaves_every_kind_once_per_share(gateway: Leg) -> None:
    """One cycle holds each kind as often as its share says; auth kinds only with auth."""
    kinds, requests = mix_for(gateway, auth=True)
    assert len(kinds) == len(KINDS)
    assert len(requests) == CYCLE
    _, plain = mix_for(gateway, auth=False)
    assert len(plain) == CYCLE - sum(k.per_cycle for k in KINDS if k.needs_auth)
    script = lua_mix_script(gateway.chat_path, requests, stop_after=10)
    assert script.count("string.rep") == 1
    assert STATUS_MARK in script
    assert "x" * 1000 not in script  # bodies are rebuilt by Lua, not stored in the script


def test_statuses_line_and_mix_verdict() -> None:
    """The status counts parse from wrk's output; a 5xx or a missing status is a problem."""
    assert parse_statuses(f'noise\n{STATUS_MARK}{{"200": 5, "404": 2}}\n') == {200: 5, 404: 2}
    assert parse_statuses("no line\n") == {}
    mix = MemoryMix(kinds=[("good", 200, 9), ("unknown model", 404, 1)])
    mix.statuses = {200: 90, 404: 10}
    assert mix.unexpected() == []
    mix.statuses = {200: 90, 502: 3}
    assert mix.unexpected() == ["3 answers 502", "no 404 answer"]


def test_upstream_answers_vllm_400_for_stream_options(upstream: Leg, tmp_path: Path) -> None:
    """The fixed upstream gives vLLM's 400 to stream_options without stream, 200 otherwise."""
    bad = b'{"model": "m", "messages": [], "stream_options": {"include_usage": true}}'
    assert post_json(upstream.chat_url, bad, None)[0] == 400
    streamed = b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}'
    assert post_json(upstream.chat_url, streamed, None)[0] == 200
    assert post_json(upstream.chat_url, b'{"model": "m"}', None)[0] == 200
