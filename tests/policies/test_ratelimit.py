"""GCRA arithmetic and the in-memory limiter, driven by a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.principal import KeyPolicy
from policies.ratelimit import (
    Gcra,
    Limit,
    LimitSpec,
    MemoryRateLimiter,
    format_reset,
)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock."""
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> MemoryRateLimiter:
    """A memory limiter on the fake clock."""
    return MemoryRateLimiter(clock=clock)


def test_gcra_burst_equals_limit_then_refills_continuously() -> None:
    """A full bucket takes exactly `limit` units, then one unit per period/limit."""
    bucket = Gcra(limit=6, period_s=60.0)
    level = 0.0
    for _ in range(6):
        assert bucket.fits(level, 1)
        level += 1
    assert not bucket.fits(level, 1)
    assert bucket.wait_ms(level, 1) == 10_000
    assert bucket.fits(bucket.level(level, 10.0), 1)
    assert not bucket.fits(bucket.level(level, 9.999), 1)


def test_gcra_cost_above_limit_never_fits() -> None:
    """A cost larger than the whole budget has no waiting time."""
    assert Gcra(limit=100).wait_ms(0.0, 101) is None


def test_gcra_quota_reports_remaining_and_time_to_full() -> None:
    """Remaining counts whole units; reset is the time until the debt drains."""
    quota = Gcra(limit=60).quota(2.5)
    assert (quota.limit, quota.remaining, quota.reset_ms) == (60, 57, 2500)


@given(limit=st.integers(1, 10_000), costs=st.lists(st.integers(1, 50), max_size=40))
def test_gcra_never_admits_more_than_the_limit_at_one_instant(limit: int, costs: list[int]) -> None:
    """Within one instant the admitted total never exceeds the limit."""
    bucket, level, admitted = Gcra(limit), 0.0, 0
    for cost in costs:
        if bucket.fits(level, cost):
            level += cost
            admitted += cost
    assert admitted <= limit


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (20, "20ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (61_250, "1m1.25s"),
    ],
)
def test_format_reset_matches_openai_style(ms: int, text: str) -> None:
    """Reset durations read like OpenAI's: 20ms, 1.5s, 6m0s."""
    assert format_reset(ms) == text


def test_spec_from_policy_and_shared_split() -> None:
    """A policy's limits become a spec; sharing divides them, keeping at least one."""
    spec = LimitSpec.of(KeyPolicy(rpm=10, tpm=1000, max_concurrency=2))
    assert spec == LimitSpec(10, 1000, 2)
    assert spec.shared(3) == LimitSpec(3, 333, 1)
    assert not LimitSpec().active


async def test_memory_requests_refill_with_the_clock(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    """Three per minute: three pass, the fourth waits 20 s, and passes 20 s later."""
    spec = LimitSpec(rpm=3)
    for _ in range(3):
        assert (await limiter.acquire("k", spec, 0, "")).allowed
    refused = await limiter.acquire("k", spec, 0, "")
    assert refused.exceeded is Limit.REQUESTS
    assert refused.retry_after_ms == 20_000
    clock.now += 20.0
    assert (await limiter.acquire("k", spec, 0, "")).allowed


async def test_memory_token_reconciliation_refunds_and_charges(limiter: MemoryRateLimiter) -> None:
    """Unused reserved tokens come back; usage above the reservation is charged."""
    spec = LimitSpec(tpm=100)
    first = await limiter.acquire("k", spec, 80, "")
    assert first.tokens is not None
    assert first.tokens.remaining == 20
    assert not (await limiter.acquire("k", spec, 30, "")).allowed
    await limiter.release("k", spec, -50, "")
    after_refund = await limiter.acquire("k", spec, 30, "")
    assert after_refund.allowed
    assert after_refund.tokens is not None
    assert after_refund.tokens.remaining == 40
    await limiter.release("k", spec, 40, "")
    assert not (await limiter.acquire("k", spec, 1, "")).allowed


async def test_memory_refund_never_exceeds_a_full_budget(limiter: MemoryRateLimiter) -> None:
    """Refunding more than is owed leaves the budget full, not larger."""
    spec = LimitSpec(tpm=100)
    await limiter.acquire("k", spec, 10, "")
    await limiter.release("k", spec, -500, "")
    verdict = await limiter.acquire("k", spec, 100, "")
    assert verdict.allowed
    assert not (await limiter.acquire("k", spec, 1, "")).allowed


async def test_memory_concurrency_slots_are_released(limiter: MemoryRateLimiter) -> None:
    """Two slots: the third request waits until one is released."""
    spec = LimitSpec(concurrency=2)
    assert (await limiter.acquire("k", spec, 0, "a")).allowed
    assert (await limiter.acquire("k", spec, 0, "b")).allowed
    refused = await limiter.acquire("k", spec, 0, "c")
    assert refused.exceeded is Limit.CONCURRENCY
    await limiter.release("k", spec, 0, "a")
    assert (await limiter.acquire("k", spec, 0, "c")).allowed


async def test_memory_refusal_consumes_nothing(limiter: MemoryRateLimiter) -> None:
    """A request refused by one limit charges none of the others."""
    spec = LimitSpec(rpm=10, tpm=100)
    assert not (await limiter.acquire("k", spec, 500, "")).allowed
    verdict = await limiter.acquire("k", spec, 100, "")
    assert verdict.allowed
    assert verdict.requests is not None
    assert verdict.requests.remaining == 9


async def test_memory_keys_are_independent(limiter: MemoryRateLimiter) -> None:
    """One key's spending never touches another key's budget."""
    spec = LimitSpec(rpm=1)
    assert (await limiter.acquire("a", spec, 0, "")).allowed
    assert (await limiter.acquire("b", spec, 0, "")).allowed
    assert not (await limiter.acquire("a", spec, 0, "")).allowed
