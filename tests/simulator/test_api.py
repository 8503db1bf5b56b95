"""The OpenAI-compatible surface, driven with the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.simulator.procs import SimulatorFactory, SimulatorProcess

CHAT: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


def _client(sim: SimulatorProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


async def test_chat_non_streaming_with_openai_client(sim: SimulatorProcess) -> None:
    """A chat completion parses with the openai client and carries ids, usage and headers."""
    async with _client(sim) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="tiergate-fast",
            messages=CHAT,
            max_tokens=8,
            extra_headers={"x-request-id": "req-123"},
        )
    reply = raw.parse()
    assert raw.headers["x-request-id"] == "req-123"
    assert raw.headers["x-sim-replica"] == f"sim-fast-{sim.port}"
    assert reply.id == "chatcmpl-req-123"
    assert reply.model == "tiergate-fast"
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    assert reply.usage is not None
    assert 4 <= reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # As vLLM without --enable-prompt-tokens-details: no cached-token count.
    assert reply.usage.prompt_tokens_details is None


async def test_chat_streaming_with_usage(sim: SimulatorProcess) -> None:
    """A stream starts with the role, sends one token per chunk and ends with a usage chunk."""
    async with _client(sim) as client:
        stream = await client.chat.completions.create(
            model="tiergate-fast",
            messages=CHAT,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    token_chunks = [c for c in chunks[1:] if c.choices]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == len(token_chunks)
    assert token_chunks[-1].choices[0].finish_reason in {"stop", "length"}
    assert all(c.choices[0].finish_reason is None for c in token_chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_stream_wire_format(sim: SimulatorProcess) -> None:
    """The raw stream is text/event-stream, ``data:`` events, and ends with ``[DONE]``."""
    body = {"messages": CHAT, "max_tokens": 3, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=body) as response,
    ):
        text = await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert '"usage"' not in text


async def test_text_completions(sim: SimulatorProcess) -> None:
    """``/v1/completions`` answers unary and streamed text completions."""
    async with _client(sim) as client:
        unary = await client.completions.create(
            model="tiergate-fast", prompt="Once upon", max_tokens=5
        )
        stream = await client.completions.create(
            model="tiergate-fast",
            prompt="Once upon",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert unary.id.startswith("cmpl-")
    assert unary.object == "text_completion"
    assert unary.choices[0].text
    assert chunks[-1].usage is not None
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed
    assert chunks[-1].usage.completion_tokens == sum(1 for c in chunks if c.choices)


async def test_models_lists_served_model(sim: SimulatorProcess) -> None:
    """``/v1/models`` lists exactly the served model, owned by vllm."""
    async with _client(sim) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == ["tiergate-fast"]
    assert models.data[0].owned_by == "vllm"


async def test_health_follows_runtime_switch(sim: SimulatorProcess) -> None:
    """``/health`` is 200 with an empty body, and 503 once marked unhealthy."""
    async with aiohttp.ClientSession() as session:
        async with session.get(sim.url + "/health") as response:
            assert response.status == 200
            assert await response.read() == b""
        await sim.aset_faults(healthy=False)
        async with session.get(sim.url + "/health") as response:
            assert response.status == 503


@pytest.mark.parametrize(
    ("body", "status", "error_type", "fragment"),
    [
        ({"model": "nope", "messages": CHAT}, 404, "NotFoundError", "`nope` does not exist"),
        ({"messages": "not a list"}, 400, "BadRequestError", "Invalid request body"),
        ({"messages": CHAT, "n": 2}, 400, "BadRequestError", "n=1"),
        ({"messages": CHAT, "max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
        (
            {"messages": CHAT, "stream_options": {"include_usage": True}},
            400,
            "BadRequestError",
            "stream=True",
        ),
        # Types vLLM's request model checks (the gateway forwards these fields unchecked).
        ({"messages": CHAT, "stop": 5}, 400, "BadRequestError", "stop"),
        ({"messages": CHAT, "user": 5}, 400, "BadRequestError", "user"),
        ({"messages": CHAT, "logit_bias": [1]}, 400, "BadRequestError", "logit_bias"),
        ({"messages": CHAT, "top_k": "a"}, 400, "BadRequestError", "top_k"),
    ],
)
async def test_errors_have_vllm_shape(
    sim: SimulatorProcess, body: dict[str, object], status: int, error_type: str, fragment: str
) -> None:
    """Bad requests get vLLM's ``{"error": {message, type, param, code}}`` body."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=body) as response,
    ):
        payload = await response.json()
    assert response.status == status
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == status
    assert payload["error"]["type"] == error_type
    assert fragment in payload["error"]["message"]


async def test_malformed_json_is_400(sim: SimulatorProcess) -> None:
    """A body that is not JSON is a 400, never a 500."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", data=b"{not json") as response,
    ):
        assert response.status == 400


async def test_traceparent_and_last_request_recorded(sim: SimulatorProcess) -> None:
    """``/sim/stats`` shows the received traceparent and the last request body."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = {"messages": CHAT, "max_tokens": 2, "temperature": 0.3, "top_k": 5}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            sim.url + "/v1/chat/completions", json=body, headers={"traceparent": traceparent}
        ) as response,
    ):
        assert response.status == 200
        assert len(response.headers["x-request-id"]) == 32
    stats = await sim.astats()
    assert stats["last_traceparent"] == traceparent
    assert stats["last_request"] == body
    assert stats["requests_total"] == 1


async def test_echo_mode_replies_with_last_user_message(start_simulator: SimulatorFactory) -> None:
    """With ``--echo`` the reply is the last user message, truncated to max_tokens."""
    sim = start_simulator("--echo", "--latency-scale", "0", "--profile", "precise")
    async with _client(sim) as client:
        full = await client.chat.completions.create(
            model="tiergate-precise", messages=[*CHAT, {"role": "user", "content": "Hi, you!"}]
        )
        cut = await client.chat.completions.create(
            model="tiergate-precise",
            max_tokens=3,
            messages=[{"role": "user", "content": "one two three four five"}],
        )
    assert full.choices[0].message.content == "Hi, you!"
    assert full.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == "one two three"
    assert cut.choices[0].finish_reason == "length"
