"""A client that goes away makes the gateway close the upstream, so the engine aborts."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess
from tests.processes import patience
from tests.simulator.procs import SimulatorProcess
from tests.stack import Stack, running_stack

CHAT = [{"role": "user", "content": "Tell me a long story."}]


SLOW_SIM = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "20", "--seed", "3")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """One simulator slow enough to leave mid-request (~0.3 s to first token, 80 ms a token)
    behind both tiers of a gateway."""
    with running_stack(sims=(SLOW_SIM,)) as stack:
        yield stack


@pytest.fixture(scope="module")
def slow_sim(stack: Stack) -> SimulatorProcess:
    """The slow simulator."""
    return stack.fast


@pytest.fixture(scope="module")
def slow_gateway(stack: Stack) -> GatewayProcess:
    """The gateway in front of it."""
    return stack.gateway


def wait_for_abort(sim: SimulatorProcess, before: int, timeout: float = 5.0) -> int:
    """Poll the simulator until its abort counter moves past ``before``."""
    deadline = time.monotonic() + patience(timeout)
    while time.monotonic() < deadline:
        stats = sim.stats()
        if stats["aborts_total"] > before and stats["running"] == 0:
            return int(stats["aborts_total"])
        time.sleep(0.05)
    return int(sim.stats()["aborts_total"])


def test_disconnect_mid_stream_aborts_upstream(
    slow_gateway: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """Closing a stream after the first chunk aborts the request on the engine."""
    before = slow_sim.stats()["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", slow_gateway.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())
    assert wait_for_abort(slow_sim, before) == before + 1


def test_disconnect_before_first_token_aborts_upstream(
    slow_gateway: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """Leaving while the engine is still prefilling aborts the request."""
    before = slow_sim.stats()["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 200, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            slow_gateway.url + "/v1/chat/completions",
            json=body,
            timeout=httpx.Timeout(5.0, read=0.1),
        )
    assert wait_for_abort(slow_sim, before) == before + 1


def test_disconnect_non_streaming_aborts_upstream(
    slow_gateway: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """Leaving a non-streaming request mid-generation aborts it on the engine."""
    before = slow_sim.stats()["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 100}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            slow_gateway.url + "/v1/chat/completions",
            json=body,
            timeout=httpx.Timeout(5.0, read=0.6),
        )
    assert wait_for_abort(slow_sim, before) == before + 1


def test_completed_requests_do_not_count_as_aborts(
    slow_gateway: GatewayProcess, slow_sim: SimulatorProcess
) -> None:
    """A request that runs to the end is not aborted (the counter is a real signal)."""
    before = slow_sim.stats()["aborts_total"]
    body = {"model": "fast", "messages": CHAT, "max_tokens": 3}
    resp = httpx.post(slow_gateway.url + "/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == 200
    assert slow_sim.stats()["aborts_total"] == before
