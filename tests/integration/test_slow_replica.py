"""A replica that is only slow (healthy, answers 200, 3x the time per token) gets clearly less
sequential traffic than its equal share, and its share back once it is fast again
(``balancing.speed_aware``, docs/replicas.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.simulator.procs import SimulatorProcess
from tests.stack import PRECISE_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow

TIMED = ("--profile", "fast", "--model", "tiergate-fast", "--output-tokens", "16")
FAST = (*TIMED, "--latency-scale", "1")
SLOW = (*TIMED, "--latency-scale", "3")
ADMIN = {"Authorization": "Bearer slow-replica-admin-token-00000000000"}


def _one_tier(config: dict[str, Any], backends: Backends) -> None:
    """The fast tier, least-loaded, on the first two simulators; speeds forgotten within
    seconds (prefix affinity's weighted hash: tests/policies/test_selection_speed.py)."""
    config["tiers"]["fast"]["replicas"] = [backends.sims[0].url, backends.sims[1].url]
    config["tiers"]["fast"]["strategy"] = "least_loaded"
    config["balancing"] = {"speed_half_life_s": 2.0}
    config["auth"]["admin_token"] = ADMIN["Authorization"][7:]


def _received(url: str) -> int:
    return int(httpx.get(url + "/sim/stats", timeout=5).json()["requests_total"])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """A fast and a 3x slower simulator in one tier behind one gateway."""
    with running_stack(sims=(FAST, SLOW, PRECISE_SIM), configure=_one_tier) as running:
        running.gateway.wait_until_ready()
        yield running


def _ask(client: openai.OpenAI, i: int) -> None:
    """One short question, streamed, read to its end."""
    stream = client.chat.completions.create(
        model="fast",
        max_tokens=16,
        stream=True,
        messages=[{"role": "user", "content": f"question {i}: what is {i} + 1?"}],
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def _speeds(stack: Stack) -> list[Any]:
    view = httpx.get(stack.gateway.url + "/admin/backends", headers=ADMIN, timeout=5).json()
    return [r["ms_per_token"] for r in view["tiers"]["fast"]["replicas"]]


def test_streams_are_timed_per_decoded_token_and_whole_answers_not(stack: Stack) -> None:
    """Whole (non-streamed) answers leave ms_per_token unknown (their time is mostly prefill
    and queueing); streamed ones set it, the slow replica's about three times the other's."""
    body = {"model": "fast", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(8):
        assert stack.post(body).status_code == 200
    assert _speeds(stack) == [None, None]
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=2)
    deadline = time.monotonic() + 20.0
    speeds: list[Any] = [None, None]
    while None in speeds and time.monotonic() < deadline:
        _ask(client, 0)
        speeds = _speeds(stack)
    fast_ms, slow_ms = speeds
    assert fast_ms is not None, speeds
    assert slow_ms is not None, speeds
    assert 1.5 * fast_ms < slow_ms < 6 * fast_ms, speeds


def test_a_slow_replica_gets_less_traffic_and_more_again_once_fast(stack: Stack) -> None:
    """40 sequential requests: the slow replica gets at most 6 (11 in one run without speeds:
    ties alternate, stale scraped loads aside). Restarted at normal speed on its port, it
    gets a third or more of a batch of 12 within 30 s."""
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=2)
    slow = stack.sims[1]
    before = _received(slow.url)
    for i in range(40):
        _ask(client, i)
    to_slow = _received(slow.url) - before
    assert to_slow <= 6, f"the slow replica got {to_slow} of 40 sequential requests"

    slow.kill()
    healed = SimulatorProcess(*FAST, "--port", str(slow.port)).start()
    try:
        deadline = time.monotonic() + 30.0
        shares: list[int] = []
        while time.monotonic() < deadline:
            start = _received(healed.url)
            for i in range(12):
                _ask(client, 100 + i)
            shares.append(_received(healed.url) - start)
            if shares[-1] >= 4:
                break
        assert shares, "no batch was sent"
        assert shares[-1] >= 4, f"the healed replica's shares of 12: {shares}"
    finally:
        healed.stop()
