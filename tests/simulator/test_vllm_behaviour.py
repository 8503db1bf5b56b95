"""The simulator reproduces vLLM where the gateway depends on it (issue 18), per release."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.simulator.procs import SimulatorFactory, SimulatorProcess

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Tell me about tiers."}]
LONG_SYSTEM = "You are a careful assistant. " * 40


async def _post(
    sim: SimulatorProcess, body: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            sim.url + "/v1/chat/completions", json=body, headers=headers or {}
        ) as response,
    ):
        return response.status, await response.text()


async def test_no_max_tokens_generates_to_the_end_of_the_context(
    start_simulator: SimulatorFactory,
) -> None:
    """A chat request without max_tokens writes max_model_len - prompt tokens, as vLLM does."""
    sim = start_simulator("--latency-scale", "0", "--max-model-len", "300")
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json={"messages": CHAT}) as response,
    ):
        reply = await response.json()
    usage = reply["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 300
    assert reply["choices"][0]["finish_reason"] == "length"


async def _hold_stream(sim: SimulatorProcess, request_id: str, started: asyncio.Event) -> str:
    """A long stream with ``request_id``; sets ``started`` once its first event arrived."""
    body = {"messages": CHAT, "max_tokens": 150, "ignore_eos": True, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            sim.url + "/v1/chat/completions", json=body, headers={"x-request-id": request_id}
        ) as response,
    ):
        first = await response.content.readuntil(b"\n\n")
        started.set()
        return (first + await response.content.read()).decode()


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_011_refuses_a_duplicate_running_request_id(
    start_simulator: SimulatorFactory,
    stream: bool,
) -> None:
    """0.11: a second request with an id already running fails (400, or error event + [DONE])."""
    sim = start_simulator("--vllm-version", "0.11", "--profile", "fast")
    started = asyncio.Event()
    holder = asyncio.create_task(_hold_stream(sim, "same-id", started))
    await started.wait()
    body = {"messages": CHAT, "max_tokens": 4, "stream": stream}
    status, text = await _post(sim, body, {"x-request-id": "same-id"})
    first = await holder
    assert first.rstrip().endswith("data: [DONE]")
    assert "already running" not in first
    assert "Request id chatcmpl-same-id already running." in text
    if stream:
        assert status == 200
        events = [e for e in text.split("\n\n") if e]
        assert events[0].startswith('data: {"error":')
        assert events[-1] == "data: [DONE]"
    else:
        assert status == 400


async def test_current_vllm_accepts_duplicate_request_ids(
    start_simulator: SimulatorFactory,
) -> None:
    """Current vLLM suffixes every engine id, so concurrent duplicates both succeed."""
    sim = start_simulator("--profile", "fast")
    started = asyncio.Event()
    holder = asyncio.create_task(_hold_stream(sim, "same-id", started))
    await started.wait()
    status, text = await _post(
        sim, {"messages": CHAT, "max_tokens": 4}, {"x-request-id": "same-id"}
    )
    assert (await holder).rstrip().endswith("data: [DONE]")
    assert status == 200, text


async def test_api_key_guards_only_v1_paths(start_simulator: SimulatorFactory) -> None:
    """With --api-key, /v1/* needs the bearer key (401 otherwise); /health and /metrics don't."""
    sim = start_simulator("--latency-scale", "0", "--api-key", "sekret")
    body = {"messages": CHAT, "max_tokens": 4}
    assert (await _post(sim, body))[0] == 401
    status, text = await _post(sim, body, {"Authorization": "Bearer wrong"})
    assert (status, text) == (401, '{"error":"Unauthorized"}')
    assert (await _post(sim, body, {"Authorization": "Bearer sekret"}))[0] == 200
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/metrics"):
            async with session.get(sim.url + path) as response:
                assert response.status == 200, path
        async with session.get(sim.url + "/v1/models") as response:
            assert response.status == 401


async def _cached_details(sim: SimulatorProcess) -> list[object]:
    body = {
        "messages": [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    out: list[object] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
                out.append((await response.json())["usage"]["prompt_tokens_details"])
    return out


async def test_cached_tokens_need_enable_prompt_tokens_details(
    start_simulator: SimulatorFactory,
) -> None:
    """Cached-token counts appear only with --enable-prompt-tokens-details, as in vLLM."""
    plain = start_simulator("--latency-scale", "0")
    assert await _cached_details(plain) == [None, None]
    detailed = start_simulator("--latency-scale", "0", "--enable-prompt-tokens-details")
    first, second = await _cached_details(detailed)
    assert first is None  # nothing cached yet: vLLM leaves the details out
    assert isinstance(second, dict)
    assert second["cached_tokens"] > 200
