"""Shadow answers against the bill: what a shadow costs is counted, and never to the caller.

A real ``tiergate serve`` (keys, budgets and usage in a real redis-server) shadows every
answered request on the other tier; both tiers are the scripted backend of
``tests.adversarial.bill_upstream``, which can answer the shadow's tier (model ``m2``)
differently from the caller's (``m``). Each test compares a fresh key's budget and rows with
the report's ``shadow`` block before and after one request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.adversarial.bill_upstream import ANSWER_TOKENS, PROMPT
from tests.adversarial.test_attack_bill import ADMIN, PRECISE_PER_TOKEN, Bill, billed_gateway, post

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

FAST_PER_TOKEN = PRECISE_PER_TOKEN / 4  # the fast tier's default price
CAP = 50  # the callers' max_tokens, so the shadows' too


class Shadowed(Bill):
    """The billing world with every answer shadowed."""

    def outcomes(self) -> dict[str, int]:
        """The shadow outcomes ``/admin/routing`` counted so far (one worker)."""
        answer = httpx.get(
            self.gateway.url + "/admin/routing",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=5,
        )
        counts: dict[str, int] = answer.json()["shadow"]["outcomes"]
        return counts

    def report(self) -> dict[str, Any]:
        """``/admin/usage?window=1h&by=key``."""
        answer = httpx.get(
            self.gateway.url + "/admin/usage?window=1h&by=key",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=5,
        )
        assert answer.status_code == 200, answer.text
        report: dict[str, Any] = answer.json()
        return report

    def shadowed(self, token: str, body: dict[str, Any], outcome: str) -> dict[str, Any]:
        """Send ``body``, wait for its shadow's ``outcome``; the report's shadow rows before
        and after, by (tier, purpose)."""
        before, counted = _shadow_rows(self.report()), self.outcomes().get(outcome, 0)
        assert post(self, token, body).status_code == 200
        deadline = time.monotonic() + 8
        while self.outcomes().get(outcome, 0) == counted:
            assert time.monotonic() < deadline, f"no shadow {outcome}"
            time.sleep(0.05)
        return {"before": before, "after": _shadow_rows(self.report())}


def _shadow_rows(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["tier"], row["purpose"]): row for row in report["shadow"]["rows"]}


def _added(seen: dict[str, Any], at: tuple[str, str]) -> tuple[int, int, int, float]:
    """What the shadow rows at ``at`` gained: requests, input and output tokens, cost."""
    zero = {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cost": 0.0}
    old, new = seen["before"].get(at, zero), seen["after"].get(at, zero)
    return (
        new["requests"] - old["requests"],
        new["input_tokens"] - old["input_tokens"],
        new["output_tokens"] - old["output_tokens"],
        round(new["cost"] - old["cost"], 6),
    )


@pytest.fixture(scope="module")
def world() -> Iterator[Shadowed]:
    """redis-server, the scripted backend behind both tiers, one gateway shadowing every
    answer (a shadow waits 1 s at most)."""
    shadow = {"fast_ratio": 1.0, "precise_ratio": 1.0, "max_waiting": 1000, "timeout_s": 1.0}
    with billed_gateway(router={"shadow": shadow}) as stack:
        yield Shadowed(stack.redis, stack.backend, stack.gateway)


def _chat(model: str, scenario: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": CAP, "messages": [{"role": "user", "content": scenario}]}


@pytest.mark.parametrize(
    ("model", "shadow_tier", "caller_price", "shadow_price"),
    [
        ("fast", "precise", FAST_PER_TOKEN, PRECISE_PER_TOKEN),
        ("precise", "fast", PRECISE_PER_TOKEN, FAST_PER_TOKEN),
    ],
)
def test_a_shadow_costs_the_caller_nothing_and_is_counted_on_its_tier(
    world: Shadowed, model: str, shadow_tier: str, caller_price: float, shadow_price: float
) -> None:
    """One answer of 20 + 10 tokens shadowed on the other tier (20 + 10 again): the key's
    budget and its row show its own answer only; the shadow block gains the shadow, priced on
    the tier that served it, and the metrics export it."""
    key_id, token = world.key()
    direction = "fast_on_precise" if model == "fast" else "precise_on_fast"
    seen = world.shadowed(token, _chat(model, "whole"), f"{direction}:compared")
    tokens = PROMPT + ANSWER_TOKENS
    assert world.settled_spend(key_id) == pytest.approx(tokens * caller_price)
    row = world.usage(key_id)
    assert row is not None
    assert (row["requests"], row["input_tokens"], row["output_tokens"]) == (1, 20, 10)
    assert _added(seen, (shadow_tier, "answer")) == (1, 20, 10, round(tokens * shadow_price, 6))
    assert not any(r["key_id"] == "" or r["tenant"] == "" for r in world.report()["rows"])
    metrics = httpx.get(
        world.gateway.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5
    ).text
    assert f'tiergate_shadow_cost_total{{purpose="answer",tier="{shadow_tier}"}}' in metrics


def test_a_shadow_answered_with_an_error_counts_nothing(world: Shadowed) -> None:
    """The shadow's tier answers 500: nothing was generated that the gateway can know of, so
    the report adds nothing (the outcome is counted ``failed``); the caller pays its own."""
    key_id, token = world.key()
    seen = world.shadowed(token, _chat("fast", "m2_fails"), "fast_on_precise:failed")
    assert _added(seen, ("precise", "answer")) == (0, 0, 0, 0.0)
    assert world.settled_spend(key_id) == pytest.approx(30 * FAST_PER_TOKEN)


def test_a_shadow_that_times_out_counts_its_worst_case(world: Shadowed) -> None:
    """The shadow's tier takes 3 s and the shadow gives up after 1 s: the backend may have
    generated up to the cap, so the shadow counts its prompt estimate and ``max_tokens``, as a
    caller who leaves a forwarded non-streaming request is charged; never to that caller."""
    key_id, token = world.key()
    seen = world.shadowed(token, _chat("fast", "m2_slow"), "fast_on_precise:failed")
    requests, inputs, outputs, cost = _added(seen, ("precise", "answer"))
    assert (requests, outputs) == (1, CAP)
    assert inputs > 0
    assert cost == pytest.approx((inputs + CAP) * PRECISE_PER_TOKEN)
    assert world.settled_spend(key_id) == pytest.approx(30 * FAST_PER_TOKEN)


def test_a_shadow_answer_without_usage_counts_its_worst_case(world: Shadowed) -> None:
    """Both tiers answer with ``"usage": null``: the caller is charged its reservation (as
    without shadows), and the shadow counts its own worst case, the prompt estimate and the
    cap, on its tier; the caller's budget does not see it."""
    key_id, token = world.key()
    seen = world.shadowed(token, _chat("fast", "whole_usage_null"), "fast_on_precise:compared")
    requests, inputs, outputs, cost = _added(seen, ("precise", "answer"))
    assert (requests, outputs) == (1, CAP)
    assert cost == pytest.approx((inputs + CAP) * PRECISE_PER_TOKEN)
    assert world.settled_spend(key_id) == pytest.approx((inputs + CAP) * FAST_PER_TOKEN)
