"""Attacks on wave-limits, wave-shadow and wave-deploy (review of today's merges, round 6).

* A key with a precise-share cap (downgrade) and a budget its request fits on fast but not on
  precise: while the cap's window still lets it go precise the budget refuses it with
  ``x-should-retry: false``, yet the same request is served once the window moves it to fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_budgets_usage import new_key
from tests.stack import FAST_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow  # real processes: make test-all and CI


def _configure(config: dict[str, Any], backends: Backends) -> None:
    asyncio.run(new_key(backends.redis_url))  # the gateway refuses to start with no key
    config["auth"] = {"store": "redis"}
    config["ratelimit"] = {"backend": "redis"}
    config["redis"] = {"url": backends.redis_url}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Redis, a fast simulator, one gateway with keys, limits and budgets on Redis."""
    with running_stack(sims=[FAST_SIM], redis=True, configure=_configure) as up:
        yield up


def test_a_budget_refusal_the_precise_cap_cures_is_not_final(stack: Stack) -> None:
    """Budget 0.05 a day, precise share capped at 0.5 (downgrade): ``model: precise`` with
    100 tokens costs about 0.1 on precise (more than the whole budget), 0.026 on fast. Sent
    again and again, the cap moves it to fast and it is served: no refusal before that may
    tell the client never to retry it."""
    _, token = asyncio.run(new_key(stack.redis_url, budget_daily=0.05, max_precise_share=0.5))
    body = {"model": "precise", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    url, auth = stack.gateway.url + "/v1/chat/completions", {"authorization": f"Bearer {token}"}
    answers = [httpx.post(url, headers=auth, json=body, timeout=30.0) for _ in range(4)]
    statuses = [(a.status_code, a.headers.get("x-should-retry")) for a in answers]
    assert any(a.status_code == 200 for a in answers), statuses  # the cap's move cures it
    finals = [a for a in answers if a.headers.get("x-should-retry") == "false"]
    assert not finals, (statuses, finals[0].json())
