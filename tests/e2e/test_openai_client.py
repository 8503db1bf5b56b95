"""The official ``openai`` client through the gateway to a real llama.cpp server and model."""

from __future__ import annotations

import re
import time
import uuid

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import FAST_MODEL, PRECISE_MODEL, Keys
from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi! How are you today?"}]


def test_chat_non_streaming_has_content_and_consistent_usage(client: openai.OpenAI) -> None:
    """A non-streaming chat answer from the real model has text, real usage and our headers."""
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=HELLO, max_tokens=12
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.model == FAST_MODEL
    usage = completion.usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 12
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    headers = raw.http_response.headers
    assert headers["x-tiergate-tier"] == "fast"
    assert headers["x-request-id"]


def test_chat_streaming_ends_with_a_consistent_usage_chunk(client: openai.OpenAI) -> None:
    """A stream asked for usage delivers text chunks, then one usage chunk with no choices."""
    stream = client.chat.completions.create(
        model="precise",
        messages=HELLO,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert {c.model for c in chunks} == {PRECISE_MODEL}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    content_chunks = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert 0 < last.usage.completion_tokens <= 12
    assert last.usage.completion_tokens >= content_chunks - 1
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_ends_with_done_and_hides_usage_not_asked_for(
    gateway: GatewayProcess, keys: Keys
) -> None:
    """On the wire the stream is SSE ending in [DONE], with no usage the caller did not ask for."""
    body = {"model": "fast", "messages": HELLO, "max_tokens": 8, "stream": True}
    headers = {"Authorization": f"Bearer {keys.open}"}
    with httpx.stream(
        "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3
    assert not any(re.search(r'"usage"\s*:\s*\{', event) for event in events)


def test_completions_both_modes(client: openai.OpenAI) -> None:
    """Legacy completions answer with text and usage, streaming (ending in usage) and not."""
    done = client.completions.create(model="fast", prompt="Once upon a time", max_tokens=8)
    assert done.choices[0].text
    assert done.usage is not None
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    parts = list(
        client.completions.create(
            model="precise",
            prompt="Once upon a time",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(p.choices[0].text for p in parts if p.choices)
    assert parts[-1].usage is not None
    assert 0 < parts[-1].usage.completion_tokens <= 8


def test_models_lists_the_real_served_names(client: openai.OpenAI) -> None:
    """/v1/models lists auto, the tiers and the names the real servers serve."""
    ids = {m.id for m in client.models.list()}
    assert {"auto", "fast", "precise", FAST_MODEL, PRECISE_MODEL} <= ids


def test_readyz_is_ready_with_real_servers(gateway: GatewayProcess) -> None:
    """/readyz reports both tiers ready although llama.cpp's server has no /health route."""
    deadline = time.monotonic() + patience(5)
    resp = httpx.get(gateway.url + "/readyz", timeout=5)
    while resp.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        resp = httpx.get(gateway.url + "/readyz", timeout=5)
    assert resp.status_code == 200, resp.text
    assert resp.json()["tiers"] == {"fast": True, "precise": True}


def test_a_callers_own_request_id_is_kept(client: openai.OpenAI) -> None:
    """A caller's non-UUID x-request-id is echoed and does not upset the backend."""
    raw = client.chat.completions.with_raw_response.create(
        model="fast",
        messages=HELLO,
        max_tokens=4,
        extra_headers={"x-request-id": "order-42/checkout"},
    )
    assert raw.http_response.status_code == 200
    assert raw.http_response.headers["x-request-id"] == "order-42/checkout"
    assert raw.parse().choices[0].message.content


def test_tracing_exports_a_span_in_the_callers_trace(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    """With tracing on, the request's spans join the caller's trace (W3C traceparent)."""
    trace_id = uuid.uuid4().hex
    client.chat.completions.create(
        model="fast",
        messages=HELLO,
        max_tokens=4,
        extra_headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    deadline = time.monotonic() + patience(15)
    while trace_id not in gateway.log_text() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert trace_id in gateway.log_text()
