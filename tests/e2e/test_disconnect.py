"""A client that leaves mid-stream makes the gateway close the upstream; the real server sees it.

llama.cpp's server notices a closed connection between two tokens, stops generating and logs
``Disconnected from client (via refresh/close) Address(host=..., port=<gateway's port>)``.
"""

from __future__ import annotations

import re
import time

import httpx

from tests.e2e.conftest import Keys
from tests.e2e.llama_server import LlamaServer
from tests.integration.gateway_proc import GatewayProcess

STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
_DISCONNECTED = re.compile(r"Disconnected from client \(via refresh/close\) .*port=(\d+)\)")


def disconnected_ports(server: LlamaServer) -> list[int]:
    """The client ports the server logged as gone, oldest first."""
    return [int(m[1]) for m in _DISCONNECTED.finditer(server.log_text())]


def test_leaving_mid_stream_closes_the_connection_to_the_real_server(
    gateway: GatewayProcess, keys: Keys, fast_server: LlamaServer
) -> None:
    """After a few tokens the client leaves: the server logs the gateway's connection as gone."""
    seen_before = len(disconnected_ports(fast_server))
    body = {
        "model": "fast",
        "messages": STORY,
        "max_tokens": 400,
        "stream": True,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {keys.open}"}
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()  # kept referenced: dropping it would close the connection
        tokens = 0
        while tokens < 4:
            tokens += next(lines).startswith("data: {")
        open_during = set(fast_server.established_peers())
    deadline = time.monotonic() + 15
    while len(disconnected_ports(fast_server)) == seen_before and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = disconnected_ports(fast_server)[seen_before:]
    assert len(gone) == 1, fast_server.log_text()[-2000:]
    assert gone[0] in open_during
    while gone[0] in fast_server.established_peers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone[0] not in fast_server.established_peers()


def test_server_serves_the_next_request_after_a_disconnect(
    gateway: GatewayProcess, keys: Keys
) -> None:
    """The abandoned generation does not poison the server: the next request is answered."""
    body = {"model": "fast", "messages": STORY, "max_tokens": 6}
    headers = {"Authorization": f"Bearer {keys.open}"}
    resp = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"]
