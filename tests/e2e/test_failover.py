"""A real server killed mid-run: fast-tier traffic fails over to precise, never a 500.

This module has its own two servers and gateway (it kills them). Its tests run in file order,
each one step further into the outage: fast dies mid-stream, then precise dies too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import (
    FAST_MODEL,
    PRECISE_MODEL,
    TRACE_ENV,
    Keys,
    client_for,
    gateway_config,
    llama,
)
from tests.e2e.llama_server import LlamaServer
from tests.integration.gateway_proc import GatewayProcess
from tests.redis_server import RedisServer

STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi! How are you today?"}]


class Stack:
    """This module's servers and gateway."""

    def __init__(self, fast: LlamaServer, precise: LlamaServer, gateway: GatewayProcess) -> None:
        self.fast = fast
        self.precise = precise
        self.gateway = gateway


@pytest.fixture(scope="module")
def stack(keys: Keys, redis: RedisServer) -> Iterator[Stack]:
    """Two fresh real servers and a gateway in front of them."""
    with llama(FAST_MODEL) as fast, llama(PRECISE_MODEL) as precise:
        config = gateway_config(fast.url, precise.url, keys.file, redis.url)
        with GatewayProcess(config, env=TRACE_ENV, ready_timeout=60) as gateway:
            yield Stack(fast, precise, gateway)


@pytest.fixture(scope="module")
def client(stack: Stack, keys: Keys) -> openai.OpenAI:
    """The official client against this module's gateway."""
    return client_for(stack.gateway, keys.open)


def stream_events(resp: httpx.Response) -> Iterator[str]:
    """The ``data:`` payloads of an SSE response."""
    for line in resp.iter_lines():
        if line.startswith("data: "):
            yield line[6:]


def test_killing_the_fast_server_mid_stream_ends_the_stream_with_an_error(
    stack: Stack, keys: Keys
) -> None:
    """The stream in flight ends with an in-band error event and no [DONE], status still 200."""
    body = {"model": "fast", "messages": STORY, "max_tokens": 400, "stream": True}
    headers = {"Authorization": f"Bearer {keys.open}"}
    with httpx.stream(
        "POST",
        stack.gateway.url + "/v1/chat/completions",
        json=body,
        headers=headers,
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        events = stream_events(resp)
        received = [next(events) for _ in range(3)]
        stack.fast.kill()
        received.extend(events)
    assert "[DONE]" not in received
    error = json.loads(received[-1])["error"]
    assert error["code"] in (502, 504)
    assert error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("model", ["fast", "auto", FAST_MODEL])
def test_fast_traffic_fails_over_to_precise(
    client: openai.OpenAI, stack: Stack, model: str, *, stream: bool
) -> None:
    """With the fast server dead, fast-bound requests are answered by precise, flagged as such."""
    assert not stack.fast.running
    with client.chat.completions.with_streaming_response.create(
        model=model,
        messages=HELLO,
        max_tokens=6,
        stream=stream,
    ) as raw:
        assert raw.status_code == 200
        assert raw.headers["x-tiergate-tier"] == "precise"
        assert raw.headers["x-tiergate-fallback-from"] == "fast"
        text = raw.read().decode()
    assert PRECISE_MODEL in text
    if stream:
        assert text.rstrip().endswith("data: [DONE]")


def test_readiness_reports_the_dead_tier(stack: Stack) -> None:
    """/readyz names the fast tier as down while precise still serves."""
    deadline = time.monotonic() + 10
    resp = httpx.get(stack.gateway.url + "/readyz", timeout=5)
    while resp.json()["tiers"].get("fast") and time.monotonic() < deadline:
        time.sleep(0.2)
        resp = httpx.get(stack.gateway.url + "/readyz", timeout=5)
    assert resp.json()["tiers"] == {"fast": False, "precise": True}
    assert resp.status_code == 503


@pytest.mark.parametrize("model", ["precise", "fast", "auto"])
def test_with_both_servers_dead_errors_are_openai_shaped_not_500(
    stack: Stack, keys: Keys, model: str
) -> None:
    """With every server dead the gateway answers 502/503 in OpenAI's error shape, never 500."""
    stack.precise.kill()
    body = {"model": model, "messages": HELLO, "max_tokens": 4}
    resp = httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {keys.open}"},
        timeout=60,
    )
    assert resp.status_code in (502, 503)
    error = resp.json()["error"]
    assert error["message"]
    assert error["type"]


def test_no_request_in_the_outage_was_a_500(stack: Stack) -> None:
    """The gateway's access log shows no 500 for any request of the outage."""
    statuses = []
    for line in stack.gateway.log_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "status" in record and "route" in record:
            statuses.append(record["status"])
    assert statuses
    assert 500 not in statuses
