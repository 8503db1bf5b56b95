"""Every retry the gateway makes lives here (house convention 7).

Rules (REFERENCE §5): retry only before the first byte reached the client, always on another
replica; connection refused/reset, connect or first-byte timeouts and 429/502/503/504 are
retried (honouring ``Retry-After``), a 500 at most once, 4xx never. Backoff is jittered and
exponential, every attempt has its own timeout, and the request has one overall deadline.

A connection that was refused (or not accepted in time) carried no request byte to the backend:
it is always retried on another replica, at once, and never charged to anything. Every other
retry is of a request the backend may have started, and those are capped by a retry budget:
at most ``ratio`` of the requests that started in the last ``window_s`` seconds, plus
``min_per_s`` a second, so a sick tier cannot start a retry storm while a replica that dies
under load (a burst of failures at once) is still absorbed.

``Retry-After`` is honoured per replica: the replica that sent it cools down for that long
(see ``ReplicaPool.record_failure``), and the retry goes at once to another replica; only when
no replica of the tier is ready does the retry wait, at most ``max_retry_after_s``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from gateway.pipeline.events import NOT_SENT, FailureKind
from gateway.upstream.attempt import AUTH_STATUSES, RETRYABLE_STATUSES, AttemptFailed

T = TypeVar("T")

# A bad answer (not JSON, too large, not SSE) would be generated again and fail the same way.
_NEVER_RETRY_KINDS = frozenset({FailureKind.NO_REPLICA, FailureKind.BAD_ANSWER})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Knobs of the retry loop."""

    max_attempts: int = 3
    backoff_base_s: float = 0.02
    backoff_max_s: float = 0.5
    max_retry_after_s: float = 2.0
    max_cooldown_s: float = 30.0
    budget_ratio: float = 0.2
    budget_min: float = 3.0
    budget_window_s: float = 10.0


class RetryBudget:
    """Retries allowed over a sliding window: ``ratio`` of the requests started, plus a floor.

    The window is ``window_s`` one-second slots; each slot counts the requests that started
    and the retries made in it. A retry is allowed while the window's retries stay below
    ``min_per_s * window_s + ratio * requests``. ``in_flight`` and ``retrying`` are gauges for
    ``/admin/backends``; ``refused`` counts retries the budget turned down.
    """

    def __init__(
        self,
        ratio: float,
        min_per_s: float,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.slots = max(1, math.ceil(window_s))
        self.clock = clock
        self._requests = [0] * self.slots
        self._retries = [0] * self.slots
        self._second = math.floor(clock())
        self.requests_in_window = 0
        self.retries_in_window = 0
        self.in_flight = 0
        self.retrying = 0
        self.refused = 0

    def _advance(self) -> int:
        """Expire the slots older than the window; the index of the current second's slot."""
        second = math.floor(self.clock())
        if second == self._second:  # the usual case: nothing to expire
            return second % self.slots
        if second - self._second >= self.slots:
            self._requests = [0] * self.slots
            self._retries = [0] * self.slots
            self.requests_in_window = self.retries_in_window = 0
        else:
            for s in range(self._second + 1, second + 1):
                index = s % self.slots
                self.requests_in_window -= self._requests[index]
                self.retries_in_window -= self._retries[index]
                self._requests[index] = self._retries[index] = 0
        self._second = max(self._second, second)
        return self._second % self.slots

    def started(self) -> None:
        """A request started (its first attempt)."""
        self._requests[self._advance()] += 1
        self.requests_in_window += 1

    def allows(self) -> bool:
        """Take one retry from the budget if it has one; False (and counted) when spent."""
        index = self._advance()
        cap = self.min_per_s * self.slots + self.ratio * self.requests_in_window
        if self.retries_in_window >= cap:
            self.refused += 1
            return False
        self._retries[index] += 1
        self.retries_in_window += 1
        return True


def is_retryable(failure: AttemptFailed, five_hundreds_seen: int) -> bool:
    """Whether ``failure`` may be retried on another replica."""
    if failure.kind in _NEVER_RETRY_KINDS:
        return False
    if failure.status is None:
        return True
    if failure.status in RETRYABLE_STATUSES or failure.status in AUTH_STATUSES:
        return True  # 401/403: another replica may hold the right key (this one is marked)
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
        if not is_retryable(exc, self.loop.five_hundreds):
            return False
        if exc.kind in NOT_SENT and self.loop.free_retries < self.loop.replicas - 1:
            self.loop.free_retries += 1  # nothing reached that replica: another one, for free
            return True
        if exc.retry_after is not None and self.loop.ready_in is not None:
            ready = self.loop.ready_in()
            if ready is None or ready > self.loop.policy.max_retry_after_s:
                return False  # every replica asked for a longer pause than a retry may wait
        return self.loop.reserve_retry()


class _Stop(stop_base):
    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop

    def __call__(self, retry_state: RetryCallState) -> bool:
        charged = retry_state.attempt_number - self.loop.free_retries
        if charged >= self.loop.policy.max_attempts:
            return True
        return self.loop.remaining() <= 0


class _Wait(wait_base):
    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop

    def __call__(self, retry_state: RetryCallState) -> float:
        policy = self.loop.policy
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, AttemptFailed) and exc.kind in NOT_SENT:
            return 0.0  # another replica, at once: this one never saw the request
        growth = policy.backoff_base_s * 2**retry_state.attempt_number
        ceiling = min(policy.backoff_max_s, growth)
        delay = random.uniform(0, ceiling)  # noqa: S311  # jitter, not cryptography
        if isinstance(exc, AttemptFailed) and exc.retry_after is not None:
            ready = self.loop.ready_in() if self.loop.ready_in is not None else None
            if ready is None:  # nothing else to try: wait as the replica asked
                ready = exc.retry_after
            delay = max(delay, min(ready, exc.retry_after, policy.max_retry_after_s))
        return max(0.0, min(delay, self.loop.remaining()))


class RetryLoop:
    """One request's attempts: tenacity drives, this object keeps the request's own state."""

    def __init__(
        self,
        policy: RetryPolicy,
        budget: RetryBudget,
        deadline: float,
        ready_in: Callable[[], float | None] | None = None,
        *,
        replicas: int = 1,
        counts_as_request: bool = True,
    ) -> None:
        self.policy = policy
        self.budget = budget
        self.deadline = deadline
        self.ready_in = ready_in
        self.replicas = replicas
        # A fallback tier's loop is the same client request: it must not pay the budget again.
        self.counts_as_request = counts_as_request
        self.free_retries = 0
        self.five_hundreds = 0
        self.attempts = 0
        self.failures: list[AttemptFailed] = []
        self._holding = False

    def reserve_retry(self) -> bool:
        """Take a retry from the budget for the next attempt (counted as retrying until it ends)."""
        if not self.budget.allows():
            return False
        self.budget.retrying += 1
        self._holding = True
        return True

    def _release_retry(self) -> None:
        if self._holding:
            self._holding = False
            self.budget.retrying -= 1

    def remaining(self) -> float:
        """Seconds left before the request's overall deadline."""
        return self.deadline - time.monotonic()

    async def run(self, attempt: Callable[[int], Awaitable[T]]) -> T:
        """Call ``attempt(n)`` until it succeeds or the rules say stop; re-raise the last error.

        The first attempt runs without tenacity (it costs ~25 µs a request to set up, and most
        requests succeed at once); a failure hands over to tenacity, which replays it as its
        attempt 1 so every rule sees exactly the same sequence as a pure tenacity loop.
        """
        self.budget.in_flight += 1
        if self.counts_as_request:
            self.budget.started()
        try:
            self.attempts = 1
            try:
                return await attempt(1)
            except AttemptFailed as failure:
                self.failures.append(failure)
                first = failure
            return await self._retries(attempt, first)
        finally:
            self._release_retry()  # reserved, then stopped by the deadline or max attempts
            self.budget.in_flight -= 1

    def forget_tracebacks(self) -> None:
        """Drop the frames the failures hold (and so the request body they reference).

        A caught exception's traceback references the frame that caught it, and that frame (or
        tenacity's retry state) references the exception again: a cycle that keeps every frame
        of the attempt alive, request body included, until a full garbage collection. Call it
        once the loop's outcome has been handled, from the frame that handled it.
        """
        for failure in self.failures:
            # Its causes too: an ``except TimeoutError as exc: raise AttemptFailed(...) from exc``
            # leaves ``exc`` in the frame its own traceback holds (and that frame the
            # cancellation it came from).
            error: BaseException | None = failure
            while error is not None:
                error.__traceback__ = None
                error = error.__cause__ or error.__context__
            failure.__context__ = None

    async def _retries(self, attempt: Callable[[int], Awaitable[T]], first: AttemptFailed) -> T:
        retrying = AsyncRetrying(
            retry=_Retry(self),
            stop=_Stop(self),
            wait=_Wait(self),
            reraise=True,
        )
        try:
            async for try_ in retrying:
                with try_:
                    number = try_.retry_state.attempt_number
                    if number == 1:
                        raise first
                    self.attempts = number
                    try:
                        return await attempt(number)
                    except AttemptFailed as failure:
                        self.failures.append(failure)
                        raise
                    finally:
                        self._release_retry()
        finally:
            # Tenacity's state (its retry state, its pending actions) and the loop object hold
            # each other: cycles a full garbage collection would have to find. Used once: drop it.
            vars(retrying).clear()
        raise AssertionError("unreachable: tenacity re-raises the last failure")
