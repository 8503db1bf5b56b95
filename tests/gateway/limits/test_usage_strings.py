"""A backend that sends its usage counts as strings of digits ("300") is charged for them, in
answers and in streams: the key's token limit goes down by what the backend reported (343bc90
had made such counts 0, so those answers were never charged)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from tests.gateway.canned_backend import canned_backend, keyed_app

TPM = 1200  # room for the 500 charged and two reservations; refills 20 tokens a second

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
    with canned_backend(ANSWER, STREAM) as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
async def test_numeric_string_usage_is_still_charged(
    backend: str, tmp_path: Path, stream: bool
) -> None:
    """Usage {"prompt_tokens": "300", "completion_tokens": "200"}: the key's tokens go down by
    about 500 after settlement (less what the bucket refilled meanwhile, however long it took)."""
    app, token = keyed_app(backend, tmp_path, tpm=TPM)
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    first_body = {**body, "stream": stream}
    headers = {"Authorization": f"Bearer {token}"}
    async with AsyncTestClient(app=app) as client:
        started = time.monotonic()
        first = await client.post("/v1/chat/completions", json=first_body, headers=headers)
        assert first.status_code == 200, first.text
        await asyncio.sleep(0.2)  # a stream settles after its last byte
        before = int(first.headers["x-ratelimit-remaining-tokens"])
        probe = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert probe.status_code == 200, probe.text
        after = int(probe.headers["x-ratelimit-remaining-tokens"])
        refilled = TPM / 60 * (time.monotonic() - started)  # at most, between the two headers
    # The probe reserves a few tokens; the first answer's 500 reported tokens were settled.
    assert before - after + refilled >= 450, (before, after, refilled)
