"""Every retry the gateway makes lives here (house convention 7).

Rules (REFERENCE §5): retry only before the first byte reached the client, always on another
replica; connection refused/reset, connect or first-byte timeouts and 429/502/503/504 are
retried (honouring ``Retry-After``), a 500 at most once, 4xx never. Backoff is jittered and
exponential, every attempt has its own timeout, the request has one overall deadline, and a
retry budget caps retries at a share of the requests in flight so a sick tier cannot start a
retry storm.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from gateway.upstream import RETRYABLE_STATUSES, AttemptFailed

T = TypeVar("T")

_NEVER_RETRY_KINDS = frozenset({"no_replica"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Knobs of the retry loop."""

    max_attempts: int = 3
    backoff_base_s: float = 0.02
    backoff_max_s: float = 0.5
    max_retry_after_s: float = 2.0
    budget_ratio: float = 0.2
    budget_min: int = 3


class RetryBudget:
    """Allows retries only while they stay under ``ratio`` of the requests in flight."""

    def __init__(self, ratio: float, minimum: int) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.in_flight = 0
        self.retrying = 0
        self.refused = 0

    def allows(self) -> bool:
        """True when one more concurrent retry fits the budget."""
        cap = max(self.minimum, int(self.in_flight * self.ratio))
        if self.retrying >= cap:
            self.refused += 1
            return False
        return True


def is_retryable(failure: AttemptFailed, five_hundreds_seen: int) -> bool:
    """Whether ``failure`` may be retried on another replica."""
    if failure.kind in _NEVER_RETRY_KINDS:
        return False
    if failure.status is None:
        return True
    if failure.status in RETRYABLE_STATUSES:
        return True
    return failure.status == 500 and five_hundreds_seen <= 1


class _Retry(retry_base):
    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        if not isinstance(exc, AttemptFailed):
            return False
        if exc.status == 500:
            self.loop.five_hundreds += 1
        return is_retryable(exc, self.loop.five_hundreds) and self.loop.budget.allows()


class _Stop(stop_base):
    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop

    def __call__(self, retry_state: RetryCallState) -> bool:
        if retry_state.attempt_number >= self.loop.policy.max_attempts:
            return True
        return self.loop.remaining() <= 0


class _Wait(wait_base):
    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop

    def __call__(self, retry_state: RetryCallState) -> float:
        policy = self.loop.policy
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, AttemptFailed) and exc.retry_after is not None:
            delay = min(exc.retry_after, policy.max_retry_after_s)
        else:
            growth = policy.backoff_base_s * 2**retry_state.attempt_number
            ceiling = min(policy.backoff_max_s, growth)
            delay = random.uniform(0, ceiling)  # noqa: S311  # jitter, not cryptography
        return max(0.0, min(delay, self.loop.remaining()))


class RetryLoop:
    """One request's attempts: tenacity drives, this object keeps the request's own state."""

    def __init__(self, policy: RetryPolicy, budget: RetryBudget, deadline: float) -> None:
        self.policy = policy
        self.budget = budget
        self.deadline = deadline
        self.five_hundreds = 0
        self.attempts = 0
        self.failures: list[AttemptFailed] = []

    def remaining(self) -> float:
        """Seconds left before the request's overall deadline."""
        return self.deadline - time.monotonic()

    async def run(self, attempt: Callable[[int], Awaitable[T]]) -> T:
        """Call ``attempt(n)`` until it succeeds or the rules say stop; re-raise the last error."""
        retrying = AsyncRetrying(
            retry=_Retry(self),
            stop=_Stop(self),
            wait=_Wait(self),
            reraise=True,
        )
        self.budget.in_flight += 1
        try:
            async for try_ in retrying:
                with try_:
                    self.attempts += 1
                    if self.attempts > 1:
                        self.budget.retrying += 1
                    try:
                        return await attempt(self.attempts)
                    except AttemptFailed as failure:
                        self.failures.append(failure)
                        raise
                    finally:
                        if self.attempts > 1:
                            self.budget.retrying -= 1
        finally:
            self.budget.in_flight -= 1
        raise AssertionError("unreachable: tenacity re-raises the last failure")
