"""A backend that sends its usage counts as strings of digits ("300") is charged for them, in
answers and in streams: the key's token limit goes down by what the backend reported (343bc90
had made such counts 0, so those answers were never charged)."""

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

from gateway.app import create_app
from gateway.keystore_file import FileKeyStore
from gateway.settings import AuthSettings, Settings, TierSettings
from policies.keys import issue_key
from policies.principal import KeyPolicy

STREAM = (
    b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": '
    b'{"content": "ok"}, "finish_reason": "stop"}]}\n\n'
    b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": '
    b'{"prompt_tokens": "300", "completion_tokens": "200", "total_tokens": "500"}}\n\n'
    b"data: [DONE]\n\n"
)
ANSWER = (
    b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": "300", "completion_tokens": "200", "total_tokens": "500"}}'
)


@pytest.fixture
def backend() -> Iterator[str]:
    """A backend whose usage counts are numeric strings."""

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
            self.send_header("Content-Type", "application/json")
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
async def test_numeric_string_usage_is_still_charged(
    backend: str, tmp_path: Path, stream: bool
) -> None:
    """Usage {"prompt_tokens": "300", "completion_tokens": "200"}: the key's tokens go down by
    about 500 after settlement."""
    store = FileKeyStore(tmp_path / "keys.yaml")
    record, token = issue_key("team", KeyPolicy(tpm=6000), now=time.time())
    store.put_sync(record)
    settings = Settings(
        tiers={
            "fast": TierSettings(model="m", replicas=[backend], default_max_tokens=16),
            "precise": TierSettings(model="p", replicas=["http://127.0.0.1:9"]),
        },
        auth=AuthSettings(keys_file=store.path, cache_ttl_s=0, keys_reload_interval_s=0),
    )
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    first_body = {**body, "stream": stream}
    headers = {"Authorization": f"Bearer {token}"}
    async with AsyncTestClient(app=create_app(settings)) as client:
        first = await client.post("/v1/chat/completions", json=first_body, headers=headers)
        assert first.status_code == 200, first.text
        await asyncio.sleep(0.2)  # a stream settles after its last byte
        before = int(first.headers["x-ratelimit-remaining-tokens"])
        probe = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert probe.status_code == 200, probe.text
        after = int(probe.headers["x-ratelimit-remaining-tokens"])
    # The probe reserves a few tokens; the first answer's 500 reported tokens were settled.
    assert before - after >= 450, (before, after)
