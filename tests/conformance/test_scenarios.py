"""The same gateway scenarios against every backend variant (tests/conformance/backends.py).

Each scenario goes through a real ``tiergate serve`` to a real simulator process; a backend
whose behaviour differs in a way the gateway does not handle shows up as a failing case.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conformance.conftest import ADMIN, TIER_CAP, Stack, gateway_config
from tests.integration.forked_gateway import ForkedGateway

pytestmark = pytest.mark.slow
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about tiers."}]


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key=stack.key, max_retries=0)


def _events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e.strip()]


def _stream(
    stack: Stack, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, str]:
    payload = {"model": "fast", "messages": CHAT, "stream": True, **body}
    with httpx.stream(
        "POST",
        stack.gateway.url + "/v1/chat/completions",
        json=payload,
        headers={**stack.auth(), **(headers or {})},
        timeout=30,
    ) as resp:
        return resp.status_code, resp.read().decode()


def test_non_streaming(stack: Stack) -> None:
    """A plain chat completion comes back whole, with usage and the caller's request id."""
    raw = _client(stack).chat.completions.with_raw_response.create(
        model="fast", messages=CHAT, max_tokens=8, extra_headers={"x-request-id": "conf-1"}
    )
    reply = raw.parse()
    assert raw.headers["x-request-id"] == "conf-1"
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert 1 <= reply.usage.completion_tokens <= 8


@pytest.mark.parametrize("include_usage", [True, False])
def test_streaming_usage(stack: Stack, include_usage: bool) -> None:
    """A stream ends with [DONE]; the usage chunk reaches only callers who asked for it."""
    body: dict[str, Any] = {"max_tokens": 8}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    status, text = _stream(stack, body)
    events = _events(text)
    assert status == 200
    assert events[-1] == "data: [DONE]"
    usage_chunks = [e for e in events if '"usage"' in e]
    assert len(usage_chunks) == (1 if include_usage else 0)


def test_in_stream_error_is_a_failure(stack: Stack) -> None:
    """An error event mid-stream reaches the caller without [DONE] or usage, and counts."""
    before = stack.replica()["attempts"].get("mid_stream", 0)
    stack.sim.set_faults(error_mid_stream=1.0)
    try:
        status, text = _stream(
            stack, {"max_tokens": 20, "ignore_eos": True, "stream_options": {"include_usage": True}}
        )
    finally:
        stack.sim.set_faults(error_mid_stream=0.0)
    events = _events(text)
    assert status == 200
    assert events[-1].startswith('data: {"error"')
    assert "[DONE]" not in text
    assert not [e for e in events if '"usage"' in e]
    assert stack.replica()["attempts"].get("mid_stream", 0) == before + 1
    assert asyncio.run(_wait_for(lambda: '"upstream_error"' in stack.gateway.log_text()))


async def _same_id_streams(stack: Stack, request_id: str) -> list[httpx.Response]:
    payload = {
        "model": "fast",
        "messages": CHAT,
        "stream": True,
        "max_tokens": 60,
        "ignore_eos": True,
    }
    headers = {**stack.auth(), "x-request-id": request_id}
    async with httpx.AsyncClient(timeout=30) as client:
        sends = [
            client.post(stack.gateway.url + "/v1/chat/completions", json=payload, headers=headers)
            for _ in range(2)
        ]
        return list(await asyncio.gather(*sends))


def test_duplicate_caller_ids(stack: Stack) -> None:
    """Two concurrent requests with one caller id both complete; each echoes the caller's id."""
    request_id = str(uuid.uuid4())
    answers = asyncio.run(_same_id_streams(stack, request_id))
    for resp in answers:
        assert resp.status_code == 200
        assert resp.headers["x-request-id"] == request_id
        assert '"error"' not in resp.text
        assert _events(resp.text)[-1] == "data: [DONE]"
    sent = stack.sim.stats()["last_request_id"]
    assert sent
    assert sent not in (request_id, uuid.UUID(request_id).hex)
    assert asyncio.run(_wait_for(lambda: sent in _logged(stack, "upstream_request_id")))


def test_no_max_tokens_is_bounded(stack: Stack) -> None:
    """Without max_tokens the gateway forwards the tier's cap, so the backend stops there."""
    reply = _client(stack).chat.completions.create(model="fast", messages=CHAT)
    assert stack.sim.stats()["last_request"]["max_tokens"] == TIER_CAP
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= TIER_CAP


def test_completions_without_max_tokens_keep_the_api_default(stack: Stack) -> None:
    """A text completion without max_tokens is bounded by the API's default of 16 tokens."""
    resp = httpx.post(
        stack.gateway.url + "/v1/completions",
        headers=stack.auth(),
        json={"model": "fast", "prompt": "Once upon a time"},
    )
    assert resp.status_code == 200
    assert stack.sim.stats()["last_request"]["max_tokens"] == 16
    assert resp.json()["usage"]["completion_tokens"] <= 16


async def _burst(stack: Stack, count: int) -> list[httpx.Response]:
    payload = {"model": "fast", "messages": CHAT}
    async with httpx.AsyncClient(timeout=60) as client:
        sends = [
            client.post(
                stack.gateway.url + "/v1/chat/completions",
                json=payload,
                headers=stack.auth(stack.capped_key),
            )
            for _ in range(count)
        ]
        return list(await asyncio.gather(*sends))


def test_token_caps_hold_without_max_tokens(stack: Stack) -> None:
    """Issue 11 P4: a 256-token, 3,000-tpm key bursting without max_tokens stays in bounds."""
    answers = asyncio.run(_burst(stack, 16))
    served = [r.json()["usage"] for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(served) + len(refused) == len(answers)
    assert served
    assert refused
    assert all(u["completion_tokens"] <= 256 for u in served)
    assert sum(u["total_tokens"] for u in served) <= 3000


def test_n_is_bounded_by_the_key(stack: Stack) -> None:
    """n above the key's max_n (default 1) is refused before anything is forwarded."""
    before = stack.sim.stats()["requests_total"]
    resp = httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        headers=stack.auth(),
        json={"model": "fast", "messages": CHAT, "max_tokens": 4, "n": 3},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "n"
    assert resp.json()["error"]["code"] == "n_exceeded"
    assert stack.sim.stats()["requests_total"] == before


def test_client_errors_pass_through(stack: Stack) -> None:
    """A backend 400 (prompt over the context) reaches the caller as 400 with its message."""
    long_prompt = [{"role": "user", "content": "word " * 2100}]
    resp = httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        headers=stack.auth(),
        json={"model": "fast", "messages": long_prompt, "max_tokens": 4},
    )
    assert resp.status_code == 400
    assert "maximum context length" in resp.json()["error"]["message"]
    assert stack.replica()["misconfigured"] is False


def test_client_disconnect_aborts_upstream(stack: Stack) -> None:
    """A caller leaving mid-stream makes the backend abort the request."""
    before = stack.sim.stats()["aborts_total"]
    payload = {
        "model": "fast",
        "messages": CHAT,
        "stream": True,
        "max_tokens": 250,
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST",
        stack.gateway.url + "/v1/chat/completions",
        json=payload,
        headers=stack.auth(),
        timeout=30,
    ) as resp:
        next(resp.iter_bytes())
    deadline = asyncio.run(_wait_for(lambda: stack.sim.stats()["aborts_total"] > before))
    assert deadline


def _logged(stack: Stack, field: str) -> list[object]:
    """The values of ``field`` in the gateway's JSON log lines so far."""
    values = []
    for line in stack.gateway.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and field in entry:
            values.append(entry[field])
    return values


async def _wait_for(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(0.05)
    return False


def test_slow_non_streaming_reply_is_generated_once(stack: Stack) -> None:
    """A non-streaming reply slower than first_byte_s is waited for, never sent again."""
    config = gateway_config(
        stack.sim, stack.keys_file, timeouts={"first_byte_s": 0.1, "total_s": 30}
    )
    with ForkedGateway(config) as gw:
        before = stack.sim.stats()["requests_total"]
        resp = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=stack.auth(),
            timeout=30,
            json={"model": "fast", "messages": CHAT, "max_tokens": 80, "ignore_eos": True},
        )
        assert resp.status_code == 200, resp.text
        assert stack.sim.stats()["requests_total"] == before + 1


def test_upstream_credentials_refused(stack: Stack) -> None:
    """A wrong upstream key: 502 naming the gateway's credentials, replica misconfigured,
    not ready."""
    if not stack.backend.api_key:
        pytest.xfail(f"{stack.backend.name} has no API key option")
    config = gateway_config(stack.sim, stack.keys_file, api_key="not-the-key")
    with ForkedGateway(config) as gw:
        resp = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=stack.auth(),
            json={"model": "fast", "messages": CHAT, "max_tokens": 4},
        )
        assert resp.status_code == 502
        error = resp.json()["error"]
        assert error["code"] == "upstream_auth_failed"
        assert "refused the gateway's credentials" in error["message"]
        assert stack.replica(gw)["misconfigured"] is True
        assert stack.replica(gw)["state"] == "misconfigured"
        ready = httpx.get(gw.url + "/readyz")
        assert ready.status_code == 503
        assert "replica.misconfigured" in gw.log_text()
        assert "not-the-key" not in gw.log_text()
        assert "not-the-key" not in json.dumps(stack.backends(gw))
    assert ADMIN not in resp.text


def test_gateway_sends_the_upstream_key(stack: Stack) -> None:
    """The backend refuses callers without its key; through the gateway the key is sent."""
    if not stack.backend.api_key:
        pytest.xfail(f"{stack.backend.name} has no API key option")
    direct = httpx.post(
        stack.sim.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4}
    )
    assert direct.status_code == 401
    resp = httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        headers=stack.auth(),
        json={"model": "fast", "messages": CHAT, "max_tokens": 4},
    )
    assert resp.status_code == 200
    assert stack.replica()["misconfigured"] is False


def test_cached_prompt_tokens_reach_the_caller(stack: Stack) -> None:
    """A repeated long system prompt reports cached tokens through the gateway."""
    if not stack.backend.prompt_tokens_details:
        pytest.xfail(f"{stack.backend.name} reports no cached-token counts")
    messages = [
        {"role": "system", "content": "You are a careful assistant. " * 40},
        {"role": "user", "content": "hi"},
    ]
    details = []
    for _ in range(2):
        resp = httpx.post(
            stack.gateway.url + "/v1/chat/completions",
            headers=stack.auth(),
            json={"model": "fast", "messages": messages, "max_tokens": 4},
        )
        assert resp.status_code == 200
        details.append(resp.json()["usage"].get("prompt_tokens_details") or {})
    assert details[1].get("cached_tokens", 0) > 200
