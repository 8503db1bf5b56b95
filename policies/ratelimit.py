"""Rate-limit arithmetic (GCRA) and the in-memory limiter that applies it.

Each limit (requests or tokens per period) is a Generic Cell Rate Algorithm bucket. GCRA keeps
a theoretical arrival time (TAT); we keep the equivalent *debt*: how many units are still
draining at a stamp, ``debt = (TAT - stamp) * limit / period``. The decision is the same
(``allowed`` iff ``debt_now + cost <= limit``), but the numbers stay small, so the Redis Lua
script (gateway/limits/limiter_redis.py), which does the same arithmetic in doubles, stays exact.

A fresh key may spend its whole per-period budget at once (burst = limit) and then refills
continuously: ``limit`` units per ``period``. Nothing is a fixed window.

``MemoryRateLimiter`` applies rpm + tpm + concurrency atomically for one process; the Redis
limiter does the same for every replica sharing one Redis. Both pass one contract suite.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from policies.principal import KeyPolicy

Clock = Callable[[], float]
PERIOD_S = 60.0
# Waiting time for a request refused by the concurrency cap: slots free up as requests end.
CONCURRENCY_RETRY_S = 1.0


class Limit(StrEnum):
    """Which limit refused a request."""

    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENCY = "concurrency"


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """The limits of one key; ``None`` means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None

    @classmethod
    def of(cls, policy: KeyPolicy) -> LimitSpec:
        """The limits carried by a key policy."""
        return cls(policy.rpm, policy.tpm, policy.max_concurrency)

    @property
    def active(self) -> bool:
        """True when any limit applies."""
        return self.rpm is not None or self.tpm is not None or self.concurrency is not None

    def shared(self, replicas: int) -> LimitSpec:
        """This spec divided among ``replicas`` processes (each keeps at least 1)."""
        if replicas <= 1:
            return self

        def part(value: int | None) -> int | None:
            return None if value is None else max(1, value // replicas)

        return LimitSpec(part(self.rpm), part(self.tpm), part(self.concurrency))


@dataclass(frozen=True, slots=True)
class Quota:
    """One limit's state for the ``x-ratelimit-*`` headers."""

    limit: int
    remaining: int
    reset_ms: int  # until the budget is whole again


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one admission check over all of a key's limits."""

    exceeded: Limit | None
    retry_after_ms: int | None  # None when the request can never fit (cost above the limit)
    requests: Quota | None
    tokens: Quota | None

    @property
    def allowed(self) -> bool:
        """True when the request was admitted (and its cost recorded)."""
        return self.exceeded is None


@dataclass(frozen=True, slots=True)
class Gcra:
    """One bucket's arithmetic: ``limit`` units per ``period_s``."""

    limit: int
    period_s: float = PERIOD_S

    def level(self, debt: float, elapsed_s: float) -> float:
        """The debt left after ``elapsed_s`` of draining."""
        return max(0.0, debt - elapsed_s * self.limit / self.period_s)

    def fits(self, level: float, cost: int) -> bool:
        """True when ``cost`` more units fit now."""
        return level + cost <= self.limit

    def wait_ms(self, level: float, cost: int) -> int | None:
        """Milliseconds until ``cost`` fits; ``None`` if it never can."""
        if cost > self.limit:
            return None
        excess = level + cost - self.limit
        return max(0, math.ceil(excess * self.period_s * 1000.0 / self.limit))

    def quota(self, level: float) -> Quota:
        """Header values for a bucket at ``level``."""
        remaining = max(0, math.floor(self.limit - level))
        reset_ms = math.ceil(level * self.period_s * 1000.0 / self.limit)
        return Quota(self.limit, remaining, reset_ms)


def format_reset(ms: int) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = round(ms / 1000.0, 3)
    if seconds < 60:
        return f"{seconds:g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


class RateLimitBackend(Protocol):
    """Atomic admission against a key's limits; the memory and Redis adapters implement it."""

    async def acquire(self, key_id: str, spec: LimitSpec, tokens: int, slot: str) -> Verdict:
        """Check every limit; when all allow, record one request, ``tokens`` and ``slot``."""
        ...

    async def release(
        self,
        key_id: str,
        spec: LimitSpec,
        token_delta: int,
        slot: str,
        request_delta: int = 0,
        *,
        lazy: bool = False,
    ) -> None:
        """Add ``token_delta`` / ``request_delta`` (negative: refund) to the buckets; free ``slot``.

        Refunds never take a bucket below empty. ``lazy``: a remote backend may hold the
        release back briefly to send it with this replica's next admission (it still applies
        before that admission); a local one applies it at once.
        """
        ...


@dataclass(slots=True)
class _KeyState:
    requests: float = 0.0
    tokens: float = 0.0
    stamp: float = 0.0
    slots: dict[str, float] = field(default_factory=dict)  # slot -> lease expiry


class MemoryRateLimiter:
    """The single-process limiter: same arithmetic as Redis, with an injectable clock.

    Concurrency slots carry a lease, as in Redis: a slot never released frees itself after
    ``lease_s``.
    """

    def __init__(
        self, *, clock: Clock = time.monotonic, period_s: float = PERIOD_S, lease_s: float = 900.0
    ) -> None:
        self._clock = clock
        self._period_s = period_s
        self._lease_s = lease_s
        self._state: dict[str, _KeyState] = {}

    def _drained(self, key_id: str, spec: LimitSpec) -> tuple[_KeyState, float, float]:
        state = self._state.get(key_id)
        now = self._clock()
        if state is None:
            state = self._state[key_id] = _KeyState(stamp=now)
        elapsed = now - state.stamp
        state.stamp = now
        req = tok = 0.0
        if spec.rpm is not None:
            req = Gcra(spec.rpm, self._period_s).level(state.requests, elapsed)
        if spec.tpm is not None:
            tok = Gcra(spec.tpm, self._period_s).level(state.tokens, elapsed)
        return state, req, tok

    @staticmethod
    def _held(state: _KeyState) -> int:
        expired = [slot for slot, until in state.slots.items() if until <= state.stamp]
        for slot in expired:
            del state.slots[slot]
        return len(state.slots)

    async def acquire(self, key_id: str, spec: LimitSpec, tokens: int, slot: str) -> Verdict:
        """Check and record atomically (the event loop runs one coroutine step at a time)."""
        state, req, tok = self._drained(key_id, spec)
        rpm = Gcra(spec.rpm, self._period_s) if spec.rpm is not None else None
        tpm = Gcra(spec.tpm, self._period_s) if spec.tpm is not None else None
        exceeded: Limit | None = None
        wait: int | None = 0
        if rpm is not None and not rpm.fits(req, 1):
            exceeded, wait = Limit.REQUESTS, rpm.wait_ms(req, 1)
        elif tpm is not None and not tpm.fits(tok, tokens):
            exceeded, wait = Limit.TOKENS, tpm.wait_ms(tok, tokens)
        elif spec.concurrency is not None and self._held(state) >= spec.concurrency:
            exceeded, wait = Limit.CONCURRENCY, int(CONCURRENCY_RETRY_S * 1000)
        if exceeded is None:
            req = req + 1 if rpm is not None else 0.0
            tok = tok + tokens if tpm is not None else 0.0
            if spec.concurrency is not None:
                state.slots[slot] = state.stamp + self._lease_s
        state.requests, state.tokens = req, tok
        return Verdict(
            exceeded=exceeded,
            retry_after_ms=wait if exceeded is not None else 0,
            requests=rpm.quota(req) if rpm is not None else None,
            tokens=tpm.quota(tok) if tpm is not None else None,
        )

    async def release(
        self,
        key_id: str,
        spec: LimitSpec,
        token_delta: int,
        slot: str,
        request_delta: int = 0,
        *,
        lazy: bool = False,
    ) -> None:
        """Reconcile the buckets (a withdrawn request gives its request back); free the slot.

        Applied at once, ``lazy`` or not.
        """
        state, req, tok = self._drained(key_id, spec)
        state.requests = max(0.0, req + request_delta) if spec.rpm is not None else 0.0
        state.tokens = max(0.0, tok + token_delta) if spec.tpm is not None else 0.0
        state.slots.pop(slot, None)
        if not state.slots and state.requests == 0.0 and state.tokens == 0.0:
            del self._state[key_id]
