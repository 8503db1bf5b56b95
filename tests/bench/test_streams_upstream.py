"""The streams benchmark's own parts against real processes: the fixed-rate upstream, the load
client and the accept-queue probe."""

from __future__ import annotations

import itertools
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.harness.legs import Leg, Placement
from bench.streams.legs import UpstreamPace, start_stream_upstream
from bench.streams.probes import accept_queue, cpu_seconds, parse_ss_queue, session_pids
from bench.streams.wave import upstream_stats

NO_PIN = Placement.build(pin=False, boost=False)
CLIENT = Path(__file__).resolve().parents[2] / "bench" / "streams" / "client.py"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Leg]:
    """The fixed-rate upstream as a real process, 100 events/s by default."""
    leg = start_stream_upstream(tmp_path, NO_PIN, UpstreamPace(100.0, 0.0))
    try:
        yield leg
    finally:
        leg.stop()


def events(raw: str) -> list[str]:
    """The data lines of a server-sent event stream."""
    return [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]


def test_official_client_reads_content_then_finish_reason_then_usage(upstream: Leg) -> None:
    """The openai client parses every chunk: 12 content deltas, finish_reason, then usage."""
    client = openai.OpenAI(base_url=upstream.base_url + "/v1", api_key="unused")
    chunks = list(
        client.chat.completions.create(
            model=upstream.model,
            messages=[{"role": "user", "content": "stream 7: hello"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    contents = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(contents) == 12
    assert all(text.startswith("@") and text[1:].strip().isdigit() for text in contents)
    assert finishes == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[0].choices[0].delta.role == "assistant"


def test_raw_stream_ends_with_done_after_the_finish_chunk(upstream: Leg) -> None:
    """On the wire: the finish chunk, then [DONE] last; no usage chunk unless asked for."""
    body = {"model": upstream.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "stream": True}  # fmt: skip
    response = httpx.post(upstream.chat_url, json=body, timeout=10)
    assert response.headers["content-type"] == "text/event-stream"
    data = events(response.text)
    assert data[-1] == "[DONE]"
    final = json.loads(data[-2])
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["object"] == "chat.completion.chunk"
    assert not any("usage" in json.loads(d) for d in data[:-1])


def test_rate_and_first_token_delay_are_honoured(upstream: Leg) -> None:
    """'pace 50/s' in the message gives 20 ms between the events' write times (the stamps they
    carry, so the reader's own scheduling does not count); bench_first_token_ms delays the
    first."""
    body = {"model": upstream.model, "max_tokens": 11, "stream": True,
            "messages": [{"role": "user", "content": "stream 1 pace 50/s"}],
            "bench_first_token_ms": 150}  # fmt: skip
    start = time.monotonic_ns()
    with httpx.stream("POST", upstream.chat_url, json=body, timeout=10) as response:
        stamps = [
            int(found) for found in re.findall(r'"content":"@(\d+)', response.read().decode())
        ]
    assert len(stamps) == 11
    assert stamps[0] - start >= 150_000_000
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    assert 18 <= statistics.median(gaps_ms) <= 22
    assert 180 <= (stamps[-1] - stamps[0]) / 1e6 <= 260


def test_a_client_hanging_up_is_counted_as_closed_by_peer(upstream: Leg) -> None:
    """The upstream stops the stream and records which one and when the peer closed it."""
    message = {"role": "user", "content": "stream 42"}
    request = {"model": upstream.model, "max_tokens": 500, "stream": True, "messages": [message]}
    body = json.dumps(request).encode()
    host, port = upstream.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        received = b""
        sock.settimeout(5)
        while b"chat.completion.chunk" not in received:  # the head may come in its own read
            piece = sock.recv(65536)
            assert piece, f"closed before the first event: {received!r}"
            received += piece
        closed_at = time.monotonic_ns()
    deadline = time.monotonic() + 2
    stats = upstream_stats(upstream)
    while not stats["aborts"] and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = upstream_stats(upstream)
    assert stats["closed_by_peer"] == 1
    number, when = stats["aborts"][0]
    assert number == 42
    assert 0 <= when - closed_at < 1_000_000_000
    assert stats["open"] == 0


def test_client_counts_every_event_and_the_storm_hangs_up_half(upstream: Leg) -> None:
    """The load client sees all events of 20 streams at ~10 ms gaps; with a storm, half hang up."""
    cmd = [sys.executable, str(CLIENT), "--url", upstream.base_url, "--model", upstream.model,
           "--streams", "20", "--max-tokens", "30", "--ramp-s", "0.1"]  # fmt: skip
    result = json.loads(subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout)
    assert result["ok"] == 20
    assert result["errors"] == {}
    assert result["events"] == result["expected_whole_streams"] == 600
    assert 8 <= result["gap_ms"]["p50"] <= 13
    storm = [*cmd, "--hangup-fraction", "0.5", "--hangup-at-s", "0.2"]
    stormed = json.loads(subprocess.run(storm, capture_output=True, check=True, timeout=60).stdout)
    assert len(stormed["hangups"]) == 10
    assert stormed["ok"] == 10
    assert stormed["errors"] == {}
    time.sleep(0.5)
    assert upstream_stats(upstream)["closed_by_peer"] == 10


def test_accept_queue_counts_connections_nobody_accepted_yet() -> None:
    """A listening socket with three connected, unaccepted clients shows a queue of 3."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            assert accept_queue(port) == 3
            server.accept()[0].close()
            assert accept_queue(port) == 2
        finally:
            for client in clients:
                client.close()


def test_ss_output_parsing_sums_listen_lines_only() -> None:
    """Recv-Q is summed over LISTEN lines (SO_REUSEPORT workers), other states ignored."""
    text = ("LISTEN 5 4096 127.0.0.1:9000 0.0.0.0:*\nLISTEN 2 4096 127.0.0.1:9000 0.0.0.0:*\n"
            "ESTAB 9 0 127.0.0.1:9000 127.0.0.1:5555\n")  # fmt: skip
    assert parse_ss_queue(text) == 7
    assert parse_ss_queue("") == 0


def test_cpu_seconds_of_a_session_grow_with_work(upstream: Leg) -> None:
    """The upstream's session CPU time rises while it streams."""
    assert upstream.main.proc is not None
    pids = session_pids(upstream.main.proc.pid)
    assert upstream.main.proc.pid in pids
    before = cpu_seconds(pids)
    body = {"model": upstream.model, "max_tokens": 300, "stream": True,
            "messages": [{"role": "user", "content": "pace 1000/s"}]}  # fmt: skip
    for _ in range(5):
        httpx.post(upstream.chat_url, json=body, timeout=10)
    assert cpu_seconds(pids) > before


def test_stoppers_stop_reading_then_take_the_rest_and_are_left_out_of_the_others_numbers(
    upstream: Leg,
) -> None:
    """Two of ten clients ask for padded answers and stop reading at 0.3 s; direct never cuts
    them, so read again after 1 s they get their whole answers. The other eight's numbers
    are theirs alone."""
    cmd = [sys.executable, str(CLIENT), "--url", upstream.base_url, "--model", upstream.model,
           "--streams", "10", "--max-tokens", "30", "--ramp-s", "0.1", "--stop-fraction", "0.2",
           "--stop-at-s", "0.3", "--stop-hold-s", "1", "--stop-tokens", "60",
           "--stop-pad", "500"]  # fmt: skip
    result = json.loads(subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout)
    assert result["stoppers"] == {"n": 2, "stopped": 2, "complete": 2}
    assert result["ok"] == 8
    assert result["errors"] == {}
    assert result["events"] == 8 * 30
    raw = httpx.post(upstream.base_url + "/v1/chat/completions", json={
        "model": upstream.model, "stream": True, "max_tokens": 2,
        "messages": [{"role": "user", "content": "pad 500B"}],
    }).text  # fmt: skip
    texts = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events(raw)[:2]]
    assert [len(t.split(" ", 1)[1]) for t in texts] == [500, 500]  # "@<ns> " then the pad


def test_the_run_raises_its_open_file_limits_as_far_as_it_may() -> None:
    """Soft goes to hard; hard goes up to what the ladder needs where the process may raise it
    (CAP_SYS_RESOURCE), and is left alone, without failing, elsewhere (the build machine's root
    lacks that capability)."""
    import resource
    import subprocess
    import sys

    def low_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1024))

    code = "from bench.streams.upstream import raise_fd_limit; print(raise_fd_limit(4096))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=low_limits,
    )
    status = Path("/proc/self/status").read_text()
    effective = int(
        next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff")), 16
    )
    may_raise_hard = bool(effective & (1 << 24))  # CAP_SYS_RESOURCE
    assert int(proc.stdout) == (4096 if may_raise_hard else 1024)
