"""The retry rules: what is retried, how often, how long it waits, and the retry budget."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import pytest

from gateway.upstream.attempt import AttemptFailed
from gateway.upstream.retry import RetryBudget, RetryLoop, RetryPolicy, is_retryable

FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_max_s=0.002)


def failure(
    status: int | None = None, kind: str = "", retry_after: float | None = None
) -> AttemptFailed:
    """An attempt failure with ``status`` (None: a connection-level failure)."""
    return AttemptFailed(
        kind or f"status_{status}", "failed", status=status, retry_after=retry_after
    )


class Script:
    """An attempt function that fails with the given errors, then succeeds."""

    def __init__(self, *failures: AttemptFailed) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self, number: int) -> str:
        self.calls += 1
        assert number == self.calls
        if self.failures:
            raise self.failures.pop(0)
        return "answer"


def loop(
    policy: RetryPolicy = FAST,
    budget: RetryBudget | None = None,
    deadline_s: float = 5.0,
    ready_in: float | None = 0.0,
) -> RetryLoop:
    """A retry loop with a fresh budget and a fixed answer for 'when is a replica ready'."""
    return RetryLoop(
        policy,
        budget or RetryBudget(policy.budget_ratio, policy.budget_min),
        time.monotonic() + deadline_s,
        ready_in=lambda: ready_in,
    )


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_client_errors_are_never_retried(status: int) -> None:
    """Upstream 4xx other than 429, 401 and 403 are the caller's problem: never retried."""
    assert not is_retryable(failure(status), 0)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_gateway_credentials_are_retried_elsewhere(status: int) -> None:
    """An upstream 401/403 refuses the gateway's key: another replica may hold the right one."""
    assert is_retryable(failure(status), 0)


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_busy_and_gateway_errors_are_retried(status: int) -> None:
    """429/502/503/504 before the first byte go to another replica."""
    assert is_retryable(failure(status), 0)


@pytest.mark.parametrize(
    "kind", ["connect", "connect_timeout", "reset", "timeout", "first_byte_timeout"]
)
def test_connection_failures_are_retried(kind: str) -> None:
    """Refused, reset and timed-out attempts are retried."""
    assert is_retryable(failure(kind=kind), 0)


def test_no_replica_is_not_retried() -> None:
    """With no replica to try there is nothing to retry."""
    assert not is_retryable(failure(kind="no_replica"), 0)


async def test_recovers_after_connection_failures() -> None:
    """Two refused connections, then an answer on the third attempt."""
    script = Script(failure(kind="connect"), failure(kind="reset"))
    assert await loop().run(script) == "answer"
    assert script.calls == 3


async def test_stops_after_max_attempts() -> None:
    """The last failure is re-raised once max_attempts is reached."""
    script = Script(*(failure(502) for _ in range(5)))
    with pytest.raises(AttemptFailed) as caught:
        await loop().run(script)
    assert caught.value.status == 502
    assert script.calls == 3


async def test_500_is_retried_at_most_once() -> None:
    """A 500 gets one more try; a second 500 ends the request."""
    script = Script(failure(500), failure(500))
    with pytest.raises(AttemptFailed):
        await loop().run(script)
    assert script.calls == 2


async def test_400_is_not_retried() -> None:
    """A 400 ends the request at once."""
    script = Script(failure(400))
    with pytest.raises(AttemptFailed):
        await loop().run(script)
    assert script.calls == 1


async def test_retry_after_with_another_replica_ready_does_not_wait() -> None:
    """A 503 with Retry-After: 5 goes straight to another ready replica."""
    script = Script(failure(503, retry_after=5.0))
    started = time.monotonic()
    assert await loop(ready_in=0.0).run(script) == "answer"
    assert time.monotonic() - started < 0.5


async def test_retry_after_waits_when_no_replica_is_ready() -> None:
    """When every replica is cooling down the retry waits for the first to come back."""
    script = Script(failure(429, retry_after=0.3))
    started = time.monotonic()
    assert await loop(ready_in=0.3).run(script) == "answer"
    assert 0.25 <= time.monotonic() - started < 1.0


async def test_retry_after_longer_than_allowed_is_not_waited_for() -> None:
    """A pause beyond max_retry_after_s ends the request instead of hanging it."""
    policy = RetryPolicy(max_retry_after_s=0.5)
    script = Script(failure(503, retry_after=30.0))
    started = time.monotonic()
    with pytest.raises(AttemptFailed):
        await loop(policy, ready_in=30.0).run(script)
    assert script.calls == 1
    assert time.monotonic() - started < 0.5


async def test_deadline_stops_retrying() -> None:
    """No new attempt starts after the request's deadline."""

    async def slow(number: int) -> str:
        await asyncio.sleep(0.15)
        raise failure(kind="timeout")

    started = time.monotonic()
    with pytest.raises(AttemptFailed):
        await loop(RetryPolicy(max_attempts=10), deadline_s=0.2).run(slow)
    assert time.monotonic() - started < 0.5


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_budget_allows_a_share_of_recent_requests_to_retry() -> None:
    """With 10 requests started and a 20 % budget (no floor), only 2 of them are retried."""
    policy = RetryPolicy(max_attempts=2, backoff_base_s=0.0, budget_ratio=0.2, budget_min=0)
    budget = RetryBudget(policy.budget_ratio, policy.budget_min)
    all_in, release = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []

    async def attempt(number: int) -> str:
        attempts.append(number)
        if number == 1:
            await all_in.wait()  # ten requests in flight, then every first attempt fails
            raise failure(503)
        await release.wait()
        return "answer"

    tasks = [asyncio.create_task(loop(policy, budget).run(attempt)) for _ in range(10)]
    await asyncio.sleep(0.05)
    all_in.set()
    await asyncio.sleep(0.1)
    assert budget.retrying == 2
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert attempts.count(2) == 2
    assert sum(r == "answer" for r in results) == 2
    assert budget.refused == 8
    assert budget.in_flight == 0
    assert budget.retrying == 0


def test_budget_absorbs_a_burst_after_steady_traffic_and_forgets_old_requests() -> None:
    """A replica dying under load: 300 requests in the window pay for 60 retries at once."""
    clock = Clock()
    budget = RetryBudget(0.2, 0, window_s=10, clock=clock)
    for _ in range(300):
        budget.started()
        clock.now += 0.01  # 3 s of steady traffic
    assert sum(budget.allows() for _ in range(100)) == 60
    clock.now += 10.5  # those requests left the window: nothing pays for retries any more
    assert not budget.allows()


def test_budget_floor_allows_retries_per_second_without_traffic() -> None:
    """The floor: ``min_per_s`` retries a second over the window, even with no requests."""
    clock = Clock()
    budget = RetryBudget(0.0, 2, window_s=5, clock=clock)
    assert sum(budget.allows() for _ in range(20)) == 10
    assert budget.refused == 10


async def test_refused_connections_are_retried_free_of_the_budget_and_of_max_attempts() -> None:
    """Nothing reached a replica that refused: another one is tried, budget or not."""
    policy = RetryPolicy(max_attempts=1, backoff_base_s=0.0, budget_ratio=0.0, budget_min=0)
    budget = RetryBudget(0.0, 0)
    script = Script(failure(kind="connect"), failure(kind="connect_timeout"))
    retry_loop = RetryLoop(policy, budget, time.monotonic() + 5, ready_in=lambda: 0.0, replicas=3)
    assert await retry_loop.run(script) == "answer"
    assert script.calls == 3
    assert budget.refused == 0


async def test_free_retries_stop_once_every_replica_refused() -> None:
    """With two replicas both refusing, the request fails after trying each once."""
    policy = RetryPolicy(max_attempts=1, backoff_base_s=0.0, budget_ratio=0.0, budget_min=0)
    script = Script(*(failure(kind="connect") for _ in range(5)))
    retry_loop = RetryLoop(
        policy, RetryBudget(0.0, 0), time.monotonic() + 5, ready_in=lambda: 0.0, replicas=2
    )
    with pytest.raises(AttemptFailed):
        await retry_loop.run(script)
    assert script.calls == 2


async def test_a_maybe_started_request_is_charged_to_the_budget() -> None:
    """A reset may have reached the backend: with the budget spent, it is not retried."""
    policy = RetryPolicy(max_attempts=3, backoff_base_s=0.0, budget_ratio=0.0, budget_min=0)
    script = Script(failure(kind="reset"))
    retry_loop = RetryLoop(
        policy, RetryBudget(0.0, 0), time.monotonic() + 5, ready_in=lambda: 0.0, replicas=3
    )
    with pytest.raises(AttemptFailed):
        await retry_loop.run(script)
    assert script.calls == 1


async def test_a_retried_request_leaves_no_reference_cycles() -> None:
    """Retrying hands over to tenacity, whose state and the loop hold each other: the loop
    drops it, so nothing of a retried request waits for a full garbage collection (which a
    busy server defers: gateway/http/collector.py)."""
    gc.collect()
    gc.disable()
    try:
        recovered, given_up = loop(), loop()
        assert await recovered.run(Script(failure(kind="connect"), failure(503))) == "answer"
        with contextlib.suppress(AttemptFailed):
            await given_up.run(Script(*(failure(502) for _ in range(5))))
        for done in (recovered, given_up):  # as the forwarder does once it handled the outcome
            done.forget_tracebacks()
        del recovered, given_up
        gc.set_debug(gc.DEBUG_SAVEALL)
        found = gc.collect()
        kinds = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found == 0, kinds
