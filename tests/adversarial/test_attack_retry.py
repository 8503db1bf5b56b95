"""Retry storms when every replica of both tiers fails (P5's retry budget)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
REQUESTS = 100
RATIO, MIN_PER_S, WINDOW_S = 0.2, 3.0, 10.0


async def burst(url: str, n: int) -> list[httpx.Response]:
    """``n`` concurrent small chat requests on the fast tier."""
    body = {"model": "fast", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=30) as client:
        return list(
            await asyncio.gather(
                *[client.post(url + "/v1/chat/completions", json=body) for _ in range(n)]
            )
        )


def test_a_fallback_does_not_double_the_retry_budget() -> None:
    """All replicas answer 503: retries stay within ratio x client requests + the floor.

    Each tier's retry loop counts the request as started, so a request that falls back to
    precise counts twice and the budget allows ratio x 2N retries instead of ratio x N.
    """
    sims = [
        SimulatorProcess("--profile", profile, "--latency-scale", "0", "--fail-503", "1.0")
        for profile in ("fast", "fast", "precise")
    ]
    for sim in sims:
        sim.start()
    try:
        fast_a, fast_b, precise = sims
        config = {
            "auth": {"enabled": False},
            "tiers": tiers_config([fast_a.url, fast_b.url], [precise.url]),
            "retry": {"budget_ratio": RATIO, "budget_min": MIN_PER_S, "budget_window_s": WINDOW_S},
            "telemetry": {"access_log": False},
        }
        with GatewayProcess(config) as gateway:
            responses = asyncio.run(burst(gateway.url, REQUESTS))
        attempts = sum(sim.stats()["requests_total"] for sim in sims)
    finally:
        for sim in sims:
            sim.stop()
    assert all(r.status_code == 503 for r in responses)
    assert all(set(r.json()["error"]) >= {"message", "type", "param", "code"} for r in responses)
    first_attempts = 2 * REQUESTS  # one on fast, one on the precise fallback
    retries = attempts - first_attempts
    allowed = RATIO * REQUESTS + MIN_PER_S * WINDOW_S
    assert retries <= allowed + 2, f"{retries} retries for {REQUESTS} requests (cap {allowed})"
