"""A client that goes away aborts its request: slot and KV blocks freed, abort counted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.simulator.procs import SimulatorProcess

# fast profile x5: 50 ms base, 0.6 ms per prompt token, 20 ms per output token.
ARGS = ("--latency-scale", "5", "--max-num-seqs", "1")
DECODE = {
    "messages": [{"role": "user", "content": "Count slowly."}],
    "max_tokens": 200,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def slow_sim_process() -> Iterator[SimulatorProcess]:
    """One slow simulator with a single running slot."""
    with SimulatorProcess(*ARGS) as sim:
        yield sim
        assert "Traceback" not in sim.stderr_text()


@pytest.fixture
def slow_sim(slow_sim_process: SimulatorProcess) -> SimulatorProcess:
    """The slow simulator with zeroed counters."""
    slow_sim_process.reset()
    return slow_sim_process


async def _settled(sim: SimulatorProcess, aborts: int) -> dict[str, Any]:
    for _ in range(300):
        stats = await sim.astats()
        if stats["aborts_total"] == aborts and stats["running"] == 0 and not stats["waiting"]:
            return stats
        await asyncio.sleep(0.01)
    raise AssertionError(f"request was not aborted: {stats}")


async def _settled_waiting(sim: SimulatorProcess) -> None:
    for _ in range(300):
        if (await sim.astats())["waiting"] == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("queued request never left the queue")


def _abort_count(sim: SimulatorProcess) -> float:
    for line in sim.metrics_text().splitlines():
        if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no abort sample")


async def test_streaming_disconnect_mid_decode(slow_sim: SimulatorProcess) -> None:
    """Closing a stream after the first tokens aborts the request and frees its blocks."""
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            slow_sim.url + "/v1/chat/completions", json={**DECODE, "stream": True}
        )
        await response.content.readline()
        assert (await slow_sim.astats())["kv_cache_usage"] > 0
        response.close()
    stats = await _settled(slow_sim, aborts=1)
    assert stats["kv_cache_usage"] == 0
    assert stats["finished"] == {"stop": 0, "length": 0, "abort": 1}
    assert _abort_count(slow_sim) == 1


async def test_streaming_disconnect_before_first_token(slow_sim: SimulatorProcess) -> None:
    """Leaving during a long prefill (headers sent, no token yet) aborts the request."""
    body = {
        "messages": [{"role": "user", "content": "word " * 2000}],
        "max_tokens": 5,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        response = await session.post(slow_sim.url + "/v1/chat/completions", json=body)
        assert response.status == 200
        await asyncio.sleep(0.1)
        assert (await slow_sim.astats())["running"] == 1
        response.close()
    stats = await _settled(slow_sim, aborts=1)
    assert stats["kv_cache_usage"] == 0
    assert "vllm:generation_tokens_total" in slow_sim.metrics_text()


async def test_non_streaming_disconnect_mid_decode(slow_sim: SimulatorProcess) -> None:
    """A non-streaming client that times out is noticed (handler cancellation) and aborted."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                session.post(slow_sim.url + "/v1/chat/completions", json=DECODE), 0.3
            )
    stats = await _settled(slow_sim, aborts=1)
    assert stats["kv_cache_usage"] == 0
    assert _abort_count(slow_sim) == 1


async def test_disconnect_while_queued(slow_sim: SimulatorProcess) -> None:
    """A request waiting for a slot leaves the queue when its client goes away."""
    async with aiohttp.ClientSession() as session:
        busy = asyncio.create_task(session.post(slow_sim.url + "/v1/chat/completions", json=DECODE))
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(
            session.post(slow_sim.url + "/v1/chat/completions", json=DECODE)
        )
        for _ in range(100):
            if (await slow_sim.astats())["waiting"] == 1:
                break
            await asyncio.sleep(0.01)
        assert (await slow_sim.astats())["waiting"] == 1
        queued.cancel()
        await _settled_waiting(slow_sim)
        assert (await slow_sim.astats())["running"] == 1
        busy.cancel()
    stats = await _settled(slow_sim, aborts=2)
    assert stats["waiting"] == 0
