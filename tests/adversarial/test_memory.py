"""P2: nothing of a request outlives its response, whatever the status (3 MB bodies refused)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
BIG = "lorem ipsum " * 250_000  # 3 MB, ~500k tokens


def rss_mib(pid: int) -> float:
    """The resident set size of process ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str]]:
    """A gateway with a fast-only key in front of a simulator with a short context."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    record, key = issue_key("mem", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=time.time())
    FileKeyStore(path).put_sync(record)
    sim = (*FAST_SIM, "--max-model-len", "4096")

    def fast_only_key(config: dict[str, Any], _backends: Backends) -> None:
        del config["telemetry"]  # the access log on, the default
        config["auth"] = {"keys_file": str(path)}
        config["server"] = {"max_body_bytes": 4 * 1024 * 1024}
        config["router"] = {"long_prompt_tokens": None}

    with running_stack(sims=[sim], configure=fast_only_key) as stack:
        yield stack.gateway, key


def refusals(key: str) -> list[tuple[int, bytes, dict[str, str]]]:
    """One request of every kind of refusal, each carrying a ~3 MB body, and one success."""
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def chat(**fields: object) -> bytes:
        body = {"model": "fast", "messages": [{"role": "user", "content": BIG}], **fields}
        return json.dumps(body).encode()

    return [
        (400, b'{"model": "fast", "messages": [' + BIG.encode(), auth),  # malformed JSON
        (400, chat(temperature="hot"), auth),  # wrong type
        (401, chat(), {"Authorization": "Bearer tg-nope-" + "Z" * 43}),
        (403, chat(model="precise"), auth),  # tier not allowed for this key
        (404, chat(model="no-such-model"), auth),
        (413, chat(extra="y" * 2_000_000), auth),
        (400, chat(max_tokens=8), auth),  # the backend's context-length 400, passed through
        (
            200,
            json.dumps(
                {"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            auth,
        ),
    ]


def send_all(port: int, requests: list[tuple[int, bytes, dict[str, str]]]) -> None:
    """Send each request on a fresh connection and check its status."""
    for status, body, headers in requests:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            assert response.status == status, (status, response.status)
        finally:
            conn.close()


def test_refused_big_bodies_do_not_grow_memory(stack: tuple[GatewayProcess, str]) -> None:
    """~270 MB of refused 3 MB bodies leave RSS within 40 MiB of where it was after warm-up."""
    gateway, key = stack
    requests = refusals(key)
    send_all(gateway.port, requests * 2)  # warm-up: allocator arenas, caches, first imports
    before = rss_mib(gateway.pid)
    send_all(gateway.port, requests * 12)
    after = rss_mib(gateway.pid)
    assert after - before < 40, f"RSS grew {after - before:.0f} MiB ({before:.0f} -> {after:.0f})"
