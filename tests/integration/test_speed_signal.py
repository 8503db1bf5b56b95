"""Equal replicas under mixed traffic must not look unequal (``balancing.speed_aware``).

A replica's speed is its decode time per token: long prompts asked for a token or two (their
time is prefill and queueing) and whole answers (no first-token time to split them at) must
not move it, or prefix affinity moves prefixes away from the replica that holds their cache.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.stack import PRECISE_SIM, Backends, Stack, running_stack

pytestmark = pytest.mark.slow

EQUAL = ("--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "1")
TOKEN = "speed-signal-admin-token-0000000000000"  # a test's own admin token
WORDS = ("claim", "policy", "invoice", "router", "ledger", "tenant", "shard", "quota")


def _one_tier(config: dict[str, Any], backends: Backends) -> None:
    config["tiers"]["fast"]["replicas"] = [backends.sims[0].url, backends.sims[1].url]
    config["tiers"]["fast"]["strategy"] = "prefix_affinity"
    config["auth"]["admin_token"] = TOKEN


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Two simulators of equal speed in one prefix-affinity tier."""
    with running_stack(sims=(EQUAL, EQUAL, PRECISE_SIM), configure=_one_tier) as running:
        running.gateway.wait_until_ready()
        yield running


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _ratio(stack: Stack) -> float:
    """The slower replica's ms_per_token over the faster's (1.0 while one is unknown)."""
    view = httpx.get(
        stack.gateway.url + "/admin/backends",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    ).json()
    speeds = [r["ms_per_token"] for r in view["tiers"]["fast"]["replicas"]]
    return 1.0 if None in speeds else max(speeds) / min(speeds)


def _received(stack: Stack) -> list[int]:
    return [
        int(httpx.get(s.url + "/sim/stats", timeout=5).json()["requests_total"])
        for s in stack.sims[:2]
    ]


def test_long_prompts_with_short_answers_leave_equal_replicas_equal(stack: Stack) -> None:
    """Streamed chats on both replicas, then a long document asked 1-token questions
    (streamed and whole) between more chats: the speed ratio
    stays under the margin, and every question on the document lands on one replica."""
    chats = [f"Assistant {i}: " + _text(100 + i, 200) for i in range(6)]
    document = "Document: " + _text(7, 3000)
    ratios, doc_replicas = [], set()
    for i in range(36):
        chat = {"role": "system", "content": chats[i % len(chats)]}
        body: dict[str, Any] = {"model": "fast", "max_tokens": 32, "stream": True}
        if i >= 12 and i % 3 == 0:  # the document, a 1-token answer, every other one whole
            body = {"model": "fast", "max_tokens": 1, "stream": i % 2 == 0}
            chat = {"role": "system", "content": document}
        body["messages"] = [chat, {"role": "user", "content": f"Question {i}?"}]
        before = _received(stack)
        answer = stack.post(body, timeout=30)
        assert answer.status_code == 200, answer.text
        if body["max_tokens"] == 1:
            doc_replicas.add(tuple(b - a for a, b in zip(before, _received(stack), strict=True)))
        ratios.append(round(_ratio(stack), 2))
    assert max(ratios) < 1.5, ratios
    assert len(doc_replicas) == 1, doc_replicas
