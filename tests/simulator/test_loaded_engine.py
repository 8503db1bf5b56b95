"""A loaded engine over real sockets: KV budget, waiting by reason, admission rejections, /load."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import aiohttp

from simulator.cli import build_parser, config_from_args
from tests.processes import patience
from tests.simulator.procs import SimulatorFactory, SimulatorProcess

# 150 generated tokens at 50x the fast profile's latency: a request holds its slot for
# tens of seconds, so every state below is observed while it lasts (the test aborts it).
LONG = {
    "messages": [{"role": "user", "content": "Write a long essay."}],
    "max_tokens": 150,
    "ignore_eos": True,
}
SLOW = ("--latency-scale", "50", "--jitter", "0")


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` whose labels include ``labels``."""
    for match in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", metrics, re.MULTILINE):
        if all(f'{key}="{value}"' in match[1] for key, value in labels.items()):
            return float(match[2])
    raise AssertionError(f"no {name} {labels}")


async def _until(sim: SimulatorProcess, holds: Callable[[str], bool]) -> str:
    """The first metrics page on which ``holds`` is true."""
    deadline = asyncio.get_running_loop().time() + patience(10.0)
    while asyncio.get_running_loop().time() < deadline:
        metrics = await asyncio.to_thread(sim.metrics_text)
        if holds(metrics):
            return metrics
        await asyncio.sleep(0.02)
    raise AssertionError("the engine never reached the expected state")


async def _post(session: aiohttp.ClientSession, sim: SimulatorProcess) -> int:
    async with session.post(sim.url + "/v1/chat/completions", json=LONG) as response:
        await response.read()
        return response.status


async def _load(session: aiohttp.ClientSession, sim: SimulatorProcess) -> int:
    async with session.get(sim.url + "/load") as response:
        assert response.status == 200
        body = await response.json()
        return int(body["server_load"])


def _state(running: int, capacity: int, deferred: int = 0) -> Callable[[str], bool]:
    def holds(metrics: str) -> bool:
        return (
            sample(metrics, "vllm:num_requests_running") == running
            and sample(metrics, "vllm:num_requests_waiting_by_reason", reason="capacity")
            == capacity
            and sample(metrics, "vllm:num_requests_waiting_by_reason", reason="deferred")
            == deferred
        )

    return holds


async def test_full_engine_waits_for_capacity_then_rejects(
    start_simulator: SimulatorFactory,
) -> None:
    """One slot, a queue of one: the second request waits for capacity, the third is the
    engine's own 503, counted as an admission rejection; /load counts what is in flight."""
    sim = start_simulator(
        "--max-num-seqs", "1", "--max-queue", "1", "--enable-server-load-tracking", *SLOW
    )
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_post(session, sim))]
        await _until(sim, _state(running=1, capacity=0))
        tasks.append(asyncio.create_task(_post(session, sim)))
        metrics = await _until(sim, _state(running=1, capacity=1))
        assert sample(metrics, "vllm:num_requests_waiting") == 1
        assert await _load(session, sim) == 2
        assert await _post(session, sim) == 503
        metrics = await asyncio.to_thread(sim.metrics_text)
        assert sample(metrics, "vllm:admission_rejections", reason="queue_full") == 1
        assert sim.stats()["admission_rejections"] == {"queue_full": 1}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await _until(sim, _state(running=0, capacity=0))


async def test_kv_budget_holds_a_request_back_below_max_num_seqs(
    start_simulator: SimulatorFactory,
) -> None:
    """Each request needs 11 of 16 KV blocks (chat prompt + 150 generated tokens): the second waits
    for capacity although 7 of 8 sequence slots are free."""
    sim = start_simulator("--max-num-seqs", "8", "--kv-blocks", "16", *SLOW)
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_post(session, sim))]
        metrics = await _until(sim, _state(running=1, capacity=0))
        assert sample(metrics, "vllm:kv_cache_usage_perc") == 11 / 16
        tasks.append(asyncio.create_task(_post(session, sim)))
        await _until(sim, _state(running=1, capacity=1))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_deferred_requests_are_not_capacity(start_simulator: SimulatorFactory) -> None:
    """A request held back by --deferred-s waits as 'deferred', not 'capacity'; /load without
    --enable-server-load-tracking answers 0, as vLLM's."""
    sim = start_simulator("--deferred-s", "30", *SLOW)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(_post(session, sim))
        metrics = await _until(sim, _state(running=0, capacity=0, deferred=1))
        assert sample(metrics, "vllm:num_requests_waiting") == 1
        assert await _load(session, sim) == 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_per_tier_knobs() -> None:
    """A slower and smaller instance: decode speed, slots and KV budget from flags."""
    args = build_parser().parse_args(
        ["--decode-tokens-per-s", "50", "--max-num-seqs", "4", "--kv-blocks", "64"]
    )
    config = config_from_args(args)
    assert config.profile.inter_token_s == 1 / 50
    assert (config.max_num_seqs, config.kv_blocks) == (4, 64)
    default = config_from_args(build_parser().parse_args([]))
    assert default.profile.inter_token_s == 0.004
