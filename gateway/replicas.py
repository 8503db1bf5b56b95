"""The replicas of each tier: their state, their concurrency caps, and leases on them.

A lease is taken before an attempt and returned after it, so the gateway always knows its own
in-flight count per replica. When every eligible replica is at its cap the request waits a
bounded time for a slot, then is shed with 503 + Retry-After instead of queueing without limit.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from policies.errors import Overloaded


@dataclass(slots=True, eq=False)
class Replica:
    """One backend replica as the gateway sees it."""

    tier: str
    url: str
    max_concurrency: int
    in_flight: int = 0
    healthy: bool = True
    ejected_until: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    consecutive_failures: int = 0
    ejections: int = 0
    recent_errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """host:port, safe to use as a metric label."""
        parts = urlsplit(self.url)
        return parts.netloc or self.url

    def available(self, now: float) -> bool:
        """Healthy, not ejected."""
        return self.healthy and now >= self.ejected_until

    @property
    def has_capacity(self) -> bool:
        """Below its concurrency cap."""
        return self.in_flight < self.max_concurrency


class ReplicaPool:
    """The replicas of one tier with a bounded wait for a free slot."""

    def __init__(
        self, tier: str, urls: Iterable[str], max_concurrency: int, max_queue_wait_s: float
    ) -> None:
        self.tier = tier
        self.replicas = [Replica(tier, url, max_concurrency) for url in urls]
        self.max_queue_wait_s = max_queue_wait_s
        self._freed = asyncio.Event()
        self._rr = itertools.count()

    def usable(self, now: float, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        """Replicas that are up and not excluded (already tried by this request)."""
        return [r for r in self.replicas if r.url not in exclude and r.available(now)]

    def next_index(self) -> int:
        """A shared round-robin counter."""
        return next(self._rr)

    def lease(self, replica: Replica) -> None:
        """Count one more request in flight on ``replica``."""
        replica.in_flight += 1

    def release(self, replica: Replica) -> None:
        """Return a lease and wake one waiter."""
        replica.in_flight -= 1
        self._freed.set()

    async def wait_for_slot(self, deadline_s: float) -> None:
        """Wait (bounded) until some lease is returned; raise Overloaded when none comes."""
        wait = min(self.max_queue_wait_s, deadline_s)
        if wait <= 0:
            raise self.overloaded()
        self._freed.clear()
        try:
            async with asyncio.timeout(wait):
                await self._freed.wait()
        except TimeoutError:
            raise self.overloaded() from None

    def overloaded(self) -> Overloaded:
        """The error a caller sees when the tier is saturated."""
        return Overloaded(
            f"The '{self.tier}' tier is at capacity; retry shortly.",
            headers={"Retry-After": "1"},
        )
