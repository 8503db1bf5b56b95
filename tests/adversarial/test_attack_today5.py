"""Attacks on today's changes: 429s the official ``openai`` client is told never to retry.

``x-should-retry: false`` must mark exactly the 429s no wait can cure. Two ways it went wrong:

* a request above the key's whole tpm, sent while the key's rpm is spent, was refused for
  the rpm (with a ``retry-after``): the client waits and sends it again, only to hear then
  that it can never fit;
* while Redis is down (``on_redis_error: open``) each process enforces its share of a key's
  tpm; a request within the key's tpm but above that share was called "too large for the
  key" with ``x-should-retry: false``, although it fits as soon as Redis is back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.config.redis_client import open_redis
from gateway.config.settings import RateLimitSettings, RedisSettings
from gateway.limits.budget_stores import MemoryBudgetStore
from gateway.limits.budgets import BudgetGate
from gateway.limits.limits import KeyRateLimited, LimitMetrics, build_limiter
from policies.cost import CostModel, TierPrice
from policies.errors import RateLimited
from policies.principal import KeyPolicy, Principal
from tests.integration.test_budgets_usage import new_key
from tests.key_fields import KeyPolicyFields
from tests.processes import free_port
from tests.stack import FAST_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow  # real processes: make test-all and CI
NOON = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC).timestamp()


def configure_redis(config: dict[str, Any], backends: Backends) -> None:
    asyncio.run(new_key(backends.redis_url))  # the gateway refuses to start with no key
    config["auth"] = {"store": "redis"}
    config["ratelimit"] = {"backend": "redis"}
    config["redis"] = {"url": backends.redis_url}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Redis, a fast simulator, one gateway with keys and limits on Redis."""
    with running_stack(sims=[FAST_SIM], redis=True, configure=configure_redis) as up:
        yield up


def _chat(stack: Stack, token: str, max_tokens: int) -> httpx.Response:
    return httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {token}"},
        json={
            "model": "fast",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        },
        timeout=30.0,
    )


def test_a_request_above_the_whole_tpm_is_final_even_while_rpm_is_spent(stack: Stack) -> None:
    """The key's one request a minute is used; the next asks for more tokens than the key's
    whole tpm. No wait cures that: the 429 must say so, not send the client back in a minute."""
    _, token = asyncio.run(new_key(stack.redis_url, rpm=1, tpm=100))
    assert _chat(stack, token, 5).status_code == 200
    refused = _chat(stack, token, 300)
    assert refused.status_code == 429
    assert refused.headers.get("x-should-retry") == "false", refused.headers
    assert "Lower max_tokens" in refused.json()["error"]["message"]


async def test_a_degraded_share_is_not_called_the_keys_tpm() -> None:
    """Redis unreachable (a closed port), limits open: each of 2 processes keeps half the
    key's tpm. A request of 80 tokens fits the key's 100 once Redis is back: it must not be
    refused as never fitting (x-should-retry: false, "the key allows 50 tokens")."""
    settings = RateLimitSettings(backend="redis", degraded_replicas=2)
    client = open_redis(
        RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.5)
    )
    limiter = build_limiter(
        settings,
        key_prefix="atk5:",
        lease_s=60.0,
        workers=1,
        client=client,
        metrics=LimitMetrics(),
    )
    principal = Principal("kid", "tenant", KeyPolicy(tpm=100))
    try:
        with pytest.raises(RateLimited) as refused:
            await limiter.admit(principal, 80)
    finally:
        await client.aclose()
    headers = refused.value.headers or {}
    assert headers.get("x-should-retry") != "false", (str(refused.value), headers)
    assert "allows 50 tokens" not in str(refused.value)


async def test_dearer_than_the_whole_month_is_final_when_the_day_refuses() -> None:
    """Daily budget 4, monthly 3 (the month binds): 1.0 spent today, then a request of 3.5.
    The day refuses it first (1 + 3.5 > 4), but it is dearer than the whole month's budget:
    no wait cures it, and the 429 must say so."""
    costs = CostModel({"precise": TierPrice(1.0, 1.0)}, "precise")
    gate = BudgetGate(MemoryBudgetStore(), costs, clock=lambda: NOON)
    principal = Principal("k1", "t", KeyPolicy(budget_daily=4.0, budget_monthly=3.0))
    assert await gate.reserve(principal, ["precise"], 500, 500) is not None  # 1.0
    with pytest.raises(KeyRateLimited) as refused:
        await gate.reserve(principal, ["precise"], 1750, 1750)  # 3.5
    assert refused.value.limit == "budget_daily"
    assert (refused.value.headers or {}).get("x-should-retry") == "false"


@pytest.mark.parametrize("window", ["budget_daily", "budget_monthly"])
def test_a_request_dearer_than_the_whole_budget_is_final_even_while_rpm_is_spent(
    stack: Stack, window: str
) -> None:
    """The key's one request a minute is used; the next costs more than the key's whole
    daily (or monthly) budget (300 tokens on fast: about 0.077 against 0.02). No wait cures
    that: the 429 must say so, as it does for a request above the whole tpm."""
    policy = (
        KeyPolicyFields(rpm=1, budget_daily=0.02)
        if window == "budget_daily"
        else KeyPolicyFields(rpm=1, budget_monthly=0.02)
    )
    _, token = asyncio.run(new_key(stack.redis_url, **policy))
    assert _chat(stack, token, 5).status_code == 200
    refused = _chat(stack, token, 300)
    assert refused.status_code == 429
    assert refused.headers.get("x-should-retry") == "false", refused.headers
    assert "budget" in refused.json()["error"]["message"], refused.json()


def test_a_request_the_precise_cap_moves_to_fast_is_priced_fast(stack: Stack) -> None:
    """A key capped at no precise share (downgrade), budget 0.05: ``model: precise`` with 100
    tokens would cost about 0.1 on precise, 0.026 on fast, where the cap sends it. It is
    served on fast; with the key's one request a minute spent, the next is refused for the
    rpm (retryable), not as dearer than the whole budget."""
    _, token = asyncio.run(
        new_key(stack.redis_url, rpm=1, budget_daily=0.05, max_precise_share=0.0)
    )
    body = {"model": "precise", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    url, auth = stack.gateway.url + "/v1/chat/completions", {"authorization": f"Bearer {token}"}
    served = httpx.post(url, headers=auth, json=body, timeout=30.0)
    assert served.status_code == 200, served.text
    assert served.headers["x-tiergate-tier"] == "fast"
    refused = httpx.post(url, headers=auth, json=body, timeout=30.0)
    assert refused.status_code == 429
    assert refused.headers.get("x-should-retry") != "false", refused.headers
    assert "requests per minute" in refused.json()["error"]["message"]
