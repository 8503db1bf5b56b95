"""Scheduling over real sockets: slots, the waiting queue, queue-full answers and latency."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest

from tests.simulator.procs import SimulatorFactory, SimulatorProcess

LONG = {
    "messages": [{"role": "user", "content": "Write a long essay."}],
    "max_tokens": 150,
    "ignore_eos": True,
}


def gauge(metrics: str, name: str) -> float:
    """The value of a ``vllm:`` sample on a metrics page."""
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", metrics, re.MULTILINE)
    assert match, name
    return float(match[1])


async def _post(session: aiohttp.ClientSession, sim: SimulatorProcess) -> int:
    async with session.post(sim.url + "/v1/chat/completions", json=LONG) as response:
        await response.read()
        return response.status


async def _wait_for(sim: SimulatorProcess, running: int, waiting: int) -> str:
    for _ in range(200):
        metrics = await asyncio.to_thread(sim.metrics_text)
        if (
            gauge(metrics, "vllm:num_requests_running") == running
            and gauge(metrics, "vllm:num_requests_waiting") == waiting
        ):
            return metrics
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw running={running} waiting={waiting}")


@pytest.mark.parametrize("status", [503, 429])
async def test_full_queue_is_refused(start_simulator: SimulatorFactory, status: int) -> None:
    """With every slot busy and the queue at its bound, the next request gets 503 (or 429)."""
    sim = start_simulator(
        "--max-num-seqs",
        "1",
        "--max-queue",
        "1",
        "--latency-scale",
        "1",
        "--queue-full-status",
        str(status),
    )
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(_post(session, sim))
        await _wait_for(sim, running=1, waiting=0)
        second = asyncio.create_task(_post(session, sim))
        metrics = await _wait_for(sim, running=1, waiting=1)
        assert gauge(metrics, "vllm:kv_cache_usage_perc") > 0
        async with session.post(sim.url + "/v1/chat/completions", json=LONG) as refused:
            payload = await refused.json()
        assert refused.status == status
        assert "queue is full" in payload["error"]["message"]
        assert await first == 200
        assert await second == 200
    metrics = await asyncio.to_thread(sim.metrics_text)
    assert gauge(metrics, "vllm:num_requests_waiting") == 0
    assert gauge(metrics, "vllm:kv_cache_usage_perc") == 0


async def test_latency_follows_profile(start_simulator: SimulatorFactory) -> None:
    """A precise-profile stream has a TTFT near the base cost and ~12 ms between tokens."""
    sim = start_simulator("--profile", "precise", "--seed", "1")
    body = {**LONG, "max_tokens": 20, "stream": True}
    arrivals: list[float] = []
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic() - started)
    ttft = arrivals[0]
    decode = arrivals[-1] - arrivals[0]
    assert 0.004 < ttft < 0.2
    assert 19 * 0.012 * 0.5 < decode < 19 * 0.012 * 4
    metrics = await asyncio.to_thread(sim.metrics_text)
    assert gauge(metrics, "vllm:time_to_first_token_seconds_count") == 1
    assert gauge(metrics, "vllm:inter_token_latency_seconds_count") == 19
    assert gauge(metrics, "vllm:generation_tokens_total") == 20
