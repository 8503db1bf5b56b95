"""A backend's reported usage is clipped to what the request could have used before it settles
the key's limits: a backend claiming 1.5e9 tokens must not lock a key out for weeks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.events import Usage
from gateway.keystore_file import FileKeyStore
from gateway.settings import AuthSettings, Settings, TierSettings
from gateway.usage_bound import PROMPT_ALLOWANCE, UsageBound, UsageClipper
from policies.keys import issue_key
from policies.principal import KeyPolicy

HUGE = b'{"prompt_tokens": 1500000000, "completion_tokens": 1e30, "total_tokens": 1e30}'
STREAM = (
    b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": '
    b'{"content": "ok"}, "finish_reason": "stop"}]}\n\n'
    b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": '
    + HUGE
    + b"}\n\ndata: [DONE]\n\n"
)
ANSWER = (
    b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], "usage": ' + HUGE + b"}"
)


def test_usage_within_the_bound_is_unchanged() -> None:
    """Honest usage passes through as the same object, and nothing is logged."""
    clip = UsageClipper()
    usage = Usage(prompt_tokens=50, completion_tokens=16, cached_tokens=10)
    with capture_logs() as logs:
        assert clip(usage, UsageBound.of(200, 16, 1), "fast") is usage
        assert clip(None, UsageBound.of(200, 16, 1), "fast") is None
    assert not logs
    assert clip.clipped == 0


def test_usage_above_the_bound_is_clipped_and_warned_once() -> None:
    """Each count is clipped to the bound (completions: max_tokens x n); one warning per 10 s."""
    clip = UsageClipper()
    bound = UsageBound.of(1000, 16, 2)
    usage = Usage(prompt_tokens=1 << 40, completion_tokens=10**9, cached_tokens=1 << 40)
    with capture_logs() as logs:
        first = clip(usage, bound, "fast")
        clip(usage, bound, "fast")
    assert first == Usage(1000 + PROMPT_ALLOWANCE, 32, 1000 + PROMPT_ALLOWANCE)
    assert [e["event"] for e in logs] == ["usage.clipped"]
    assert clip.clipped == 2


@pytest.fixture
def backend() -> Iterator[str]:
    """A backend that reports 1.5e9 prompt and 1e30 completion tokens for every answer."""

    class Backend(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the stdlib's name
            sent = self.rfile.read(int(self.headers["Content-Length"]))
            stream = b'"stream":true' in sent.replace(b" ", b"")
            answer = STREAM if stream else ANSWER
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def do_GET(self) -> None:  # health probes and /v1/models: answered 200
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_huge_reported_usage_does_not_lock_the_key_out(
    backend: str, tmp_path: Path, stream: bool
) -> None:
    """After an answer claiming 1.5e9 tokens, the key (100k tokens a minute) is still served."""
    store = FileKeyStore(tmp_path / "keys.yaml")
    record, token = issue_key("team", KeyPolicy(tpm=100_000), now=time.time())
    store.put_sync(record)
    settings = Settings(
        tiers={
            "fast": TierSettings(model="m", replicas=[backend], default_max_tokens=16),
            "precise": TierSettings(model="p", replicas=["http://127.0.0.1:9"]),
        },
        auth=AuthSettings(keys_file=store.path, cache_ttl_s=0, keys_reload_interval_s=0),
    )
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    headers = {"Authorization": f"Bearer {token}"}
    async with AsyncTestClient(app=create_app(settings)) as client:
        first = await client.post(
            "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
        )
        assert first.status_code == 200, first.text
        await asyncio.sleep(0.2)  # a stream settles after its last byte
        probe = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert probe.status_code == 200, probe.text
    assert int(probe.headers["x-ratelimit-remaining-tokens"]) > 50_000
