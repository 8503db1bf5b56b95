"""Failure injection: each fault type on the wire, the seeded draws, and runtime control."""

from __future__ import annotations

import time

import aiohttp
import pytest

from simulator.faults import FaultInjector, FaultRates
from tests.simulator.procs import SimulatorFactory, SimulatorProcess

BODY = {
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 8,
    "ignore_eos": True,
}
STREAM = {**BODY, "stream": True}


def test_draws_are_seeded_and_match_rates() -> None:
    """The same seed gives the same faults, and exclusive rates are honoured."""
    rates = FaultRates(fail_500=0.2, fail_429=0.1)
    first = FaultInjector(rates, seed=5)
    second = FaultInjector(FaultRates(**rates.as_dict()), seed=5)
    draws = [first.pre_response() for _ in range(5000)]
    assert draws == [second.pre_response() for _ in range(5000)]
    assert 0.17 < draws.count("fail_500") / 5000 < 0.23
    assert 0.08 < draws.count("fail_429") / 5000 < 0.12


def test_update_rejects_bad_values() -> None:
    """Unknown fields, non-numbers and out-of-range rates are refused."""
    injector = FaultInjector(FaultRates(), seed=0)
    active_before = injector.active  # a local, so the check below is not narrowed away
    assert not active_before
    for bad in ({"fail_999": 0.5}, {"fail_500": 1.5}, {"fail_500": "x"}):
        with pytest.raises((ValueError, TypeError)):
            injector.update(bad)
    injector.update({"drop_mid_stream": 1})
    assert injector.active
    assert injector.mid_stream() == "drop_mid_stream"


async def _collect(response: aiohttp.ClientResponse, parts: list[bytes]) -> None:
    async for data in response.content.iter_any():
        parts.append(data)


@pytest.mark.parametrize("status", [429, 400, 404, 500, 503])
async def test_status_faults(sim: SimulatorProcess, status: int) -> None:
    """``fail_<status>`` answers that status with a vLLM error body."""
    await sim.aset_faults(**{f"fail_{status}": 1.0})
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=BODY) as response,
    ):
        payload = await response.json()
    assert response.status == status
    assert payload["error"]["code"] == status
    assert response.headers["x-sim-replica"].startswith("sim-fast-")


async def test_refused_connection_closes_without_response(sim: SimulatorProcess) -> None:
    """``fail_refuse`` closes the connection before any response byte."""
    await sim.aset_faults(fail_refuse=1.0)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.post(sim.url + "/v1/chat/completions", json=BODY)


async def test_reset_connection(sim: SimulatorProcess) -> None:
    """``fail_reset`` resets the TCP connection (ECONNRESET), not a clean close."""
    await sim.aset_faults(fail_reset=1.0)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientOSError) as caught:
            await session.post(sim.url + "/v1/chat/completions", json=BODY)
    assert "reset" in str(caught.value).lower()


async def test_stall_before_first_byte(sim: SimulatorProcess) -> None:
    """``stall_first_byte`` delays the response head by ``stall_seconds``, then succeeds."""
    await sim.aset_faults(stall_first_byte=1.0, stall_seconds=0.4)
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(sim.url + "/v1/chat/completions", json=BODY) as response:
            waited = time.monotonic() - started
            assert response.status == 200
    assert waited >= 0.4


async def test_stall_mid_stream(sim: SimulatorProcess) -> None:
    """``stall_mid_stream`` pauses a stream half-way and then completes it."""
    await sim.aset_faults(stall_mid_stream=1.0, stall_seconds=0.4)
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=STREAM) as response,
    ):
        first = await response.content.readany()
        started = time.monotonic()
        rest = await response.read()
        gap = time.monotonic() - started
    assert b"data: [DONE]" not in first
    assert gap >= 0.35
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_drop_mid_stream(sim: SimulatorProcess) -> None:
    """``drop_mid_stream`` cuts the connection after some tokens, without ``[DONE]``."""
    await sim.aset_faults(drop_mid_stream=1.0)
    parts: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=STREAM) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await _collect(response, parts)
    received = b"".join(parts)
    assert b'"delta":{"content"' in received
    assert b"[DONE]" not in received
    assert (await sim.astats())["aborts_total"] == 1


async def test_error_mid_stream(sim: SimulatorProcess) -> None:
    """``error_mid_stream`` sends an in-band error event, then ``[DONE]`` as vLLM does."""
    await sim.aset_faults(error_mid_stream=1.0)
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/chat/completions", json=STREAM) as response,
    ):
        text = await response.text()
    assert response.status == 200
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert events[-2].startswith('data: {"error":{')
    assert '"code":500' in events[-2]


async def test_cli_fault_options(start_simulator: SimulatorFactory) -> None:
    """Fault rates given on the command line apply from the first request."""
    sim = start_simulator("--latency-scale", "0", "--fail-503", "1", "--seed", "3")
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/v1/completions", json={"prompt": "hi"}) as response,
    ):
        assert response.status == 503
    assert (await sim.astats())["faults"]["fail_503"] == 1.0


async def test_fault_endpoint_validates(sim: SimulatorProcess) -> None:
    """``POST /sim/faults`` rejects an out-of-range rate with a 400."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + "/sim/faults", json={"fail_500": 2}) as response,
    ):
        assert response.status == 400
