"""A backend's reported usage is clipped to what the request could have used before it settles
the key's limits: a backend claiming 1.5e9 tokens must not lock a key out for weeks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from structlog.testing import capture_logs

from gateway.pipeline.events import Usage
from gateway.pipeline.usage_bound import PROMPT_ALLOWANCE, UsageBound, UsageClipper
from tests.gateway.canned_backend import canned_backend, keyed_app

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
    with canned_backend(ANSWER, STREAM) as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
async def test_a_huge_reported_usage_does_not_lock_the_key_out(
    backend: str, tmp_path: Path, stream: bool
) -> None:
    """After an answer claiming 1.5e9 tokens, the key (100k tokens a minute) is still served."""
    app, token = keyed_app(backend, tmp_path, tpm=100_000)
    body = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    headers = {"Authorization": f"Bearer {token}"}
    async with AsyncTestClient(app=app) as client:
        first = await client.post(
            "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
        )
        assert first.status_code == 200, first.text
        await asyncio.sleep(0.2)  # a stream settles after its last byte
        probe = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert probe.status_code == 200, probe.text
    assert int(probe.headers["x-ratelimit-remaining-tokens"]) > 50_000
