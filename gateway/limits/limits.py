"""The rate-limit stage: per-key rpm + tpm + concurrency, headers, reconciliation, Redis policy.

``KeyLimiter`` implements the ``RequestLimiter`` port over a ``RateLimitBackend`` (memory or
Redis). Tokens are reserved at admission (prompt estimate + ``max_tokens``) and reconciled with
the real usage when the answer ends (``settle``), streaming included.

Redis failure policy (``ratelimit.on_redis_error``):

- ``open`` (default): while Redis is unreachable each process enforces the key's limits locally,
  divided by the number of live gateway processes it last read from Redis
  (:mod:`gateway.limits.census`), or by ``ratelimit.degraded_replicas`` times the workers when
  that is set;
- ``closed``: requests of rate-limited keys get 503 with ``Retry-After``.

Either way: one log line per transition (``ratelimit.redis_unavailable`` /
``ratelimit.redis_recovered``), the ``tiergate_ratelimit_backend_degraded`` gauge, the
``tiergate_ratelimit_degraded_decisions_total{outcome}`` counter, and a probe of Redis at most
every ``ratelimit.redis_retry_interval_s`` while degraded; recovery is automatic. Nothing here
raises anything but RateLimited / RateLimitUnavailable to the caller. (Admitted/rejected counts
per limit, ``tiergate_ratelimit_decisions_total``, come from the request telemetry, which reads
``KeyRateLimited.limit``.)
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.asyncio import Redis

from gateway.config.redis_client import BackendHealth
from gateway.config.settings import RateLimitSettings
from gateway.config.tier_settings import TierSettings
from gateway.limits.census import LocalShare, ReplicaCensus
from gateway.limits.limiter_redis import (
    SLOT_LEASE_S,
    RateLimitBackendUnavailable,
    RedisRateLimiter,
)
from policies.errors import RateLimited, TierGateError
from policies.principal import Principal
from policies.ratelimit import (
    Limit,
    LimitSpec,
    MemoryRateLimiter,
    RateLimitBackend,
    Verdict,
    format_reset,
)

EVENT_REDIS_DOWN = "ratelimit.redis_unavailable"
EVENT_REDIS_UP = "ratelimit.redis_recovered"
METRIC_DEGRADED_DECISIONS = "tiergate_ratelimit_degraded_decisions"
METRIC_DEGRADED = "tiergate_ratelimit_backend_degraded"
ALL_LIMITS = "all"
_DEGRADED_OUTCOMES = ("allowed_local", "rejected_local", "unavailable")
_log = structlog.get_logger("tiergate.ratelimit")
# On a refusal no wait can cure: the official OpenAI clients retry every 429 unless told not to.
NO_RETRY: Mapping[str, str] = MappingProxyType({"x-should-retry": "false"})


class RateLimitUnavailable(TierGateError):
    """Fail-closed policy while the shared limiter is unreachable (503)."""

    status = 503
    error_type = "server_error"
    default_code = "ratelimit_unavailable"


class KeyRateLimited(RateLimited):
    """A 429 that names the limit it hit (``requests``, ``tokens``, ``concurrency``)."""

    def __init__(self, message: str, *, limit: str, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.limit = limit


class LimitMetrics:
    """In-process counters, exportable as a prometheus_client collector (``registry.register``).

    ``decisions[(limit, outcome)]``: limit is ``all`` (admitted), ``requests``, ``tokens``,
    ``concurrency`` or ``backend``; outcome is ``allowed`` / ``rejected`` (shared limiter),
    ``allowed_local`` / ``rejected_local`` (per-replica fallback) or ``unavailable``
    (fail-closed). ``degraded`` is 1 while a backend is unreachable. Exported: the gauge, and
    the decisions taken while degraded (the request telemetry already counts the others).
    """

    def __init__(self) -> None:
        self.decisions: Counter[tuple[str, str]] = Counter()
        self.degraded: dict[str, int] = {}

    def decision(self, limit: str, outcome: str) -> None:
        """Count one admission decision."""
        self.decisions[(limit, outcome)] += 1

    def set_degraded(self, backend: str, degraded: bool) -> None:
        """Set the degraded gauge of ``backend``."""
        self.degraded[backend] = int(degraded)

    def collect(self) -> Iterator[Metric]:
        """The prometheus_client collector protocol."""
        decisions = CounterMetricFamily(
            METRIC_DEGRADED_DECISIONS,
            "Rate-limit decisions taken while the shared backend was unreachable.",
            labels=["outcome"],
        )
        degraded_counts: Counter[str] = Counter()
        for (_, outcome), count in self.decisions.items():
            if outcome in _DEGRADED_OUTCOMES:
                degraded_counts[outcome] += count
        for outcome in _DEGRADED_OUTCOMES:
            decisions.add_metric([outcome], degraded_counts[outcome])
        degraded = GaugeMetricFamily(
            METRIC_DEGRADED, "1 while the shared limit backend is unreachable.", labels=["backend"]
        )
        for backend, value in sorted(self.degraded.items()):
            degraded.add_metric([backend], value)
        yield decisions
        yield degraded


def rate_headers(verdict: Verdict) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the limits a key has."""
    headers: dict[str, str] = {}
    for kind, quota in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if quota is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(quota.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(quota.remaining)
            headers[f"x-ratelimit-reset-{kind}"] = format_reset(quota.reset_ms)
    return headers


def _rejection(
    principal: Principal,
    spec: LimitSpec,
    tokens: int,
    verdict: Verdict,
    *,
    whole: LimitSpec,
    share: str = "",
    degraded_retry_s: float | None = None,
) -> KeyRateLimited:
    """The 429 for ``verdict`` on ``spec`` (the limits applied); ``whole``: the most this
    process ever grants the key (its share of the key's limits when they are divided among
    workers). ``x-should-retry: false`` only where no wait cures the request: above
    ``whole``'s tpm, whichever limit refused it first. ``share`` says which processes divide
    the key's limits when ``spec`` is a share of them (the message states the key's own
    limits, then the share); ``degraded_retry_s``: set while a share of the key's limits is
    enforced locally (the backend unreachable)."""
    headers = rate_headers(verdict)
    wait_ms = verdict.retry_after_ms
    kid = principal.key_id
    key = LimitSpec.of(principal.policy)
    if whole.tpm is not None and tokens > whole.tpm:
        headers.update(NO_RETRY)
        part = f", {whole.tpm} {share}" if share and whole.tpm != key.tpm else ""
        return KeyRateLimited(
            f"Request too large for key {kid}: it reserves {tokens} tokens (prompt estimate + "
            f"max_tokens) but the key allows {key.tpm} tokens per minute{part}. "
            "Lower max_tokens.",
            limit=Limit.TOKENS.value,
            headers=headers,
        )
    if wait_ms is None:  # above this process's share only: fits once the backend is back
        wait_ms = math.ceil((degraded_retry_s or 1.0) * 1000)
    headers["retry-after"] = str(max(1, math.ceil(wait_ms / 1000)))
    headers["retry-after-ms"] = str(wait_ms)
    later = f" Please try again in {format_reset(wait_ms)}."

    def applied(mine: int | None, keys: int | None) -> str:
        return f"; {mine} {share}" if share and mine != keys else ""

    if verdict.exceeded is Limit.REQUESTS:
        message = (
            f"Rate limit reached for requests per minute on key {kid}: limit {key.rpm}"
            f"{applied(spec.rpm, key.rpm)}."
        )
    elif verdict.exceeded is Limit.CONCURRENCY:
        message = (
            f"Too many concurrent requests on key {kid}: limit {key.concurrency} in flight"
            f"{applied(spec.concurrency, key.concurrency)}."
        )
    else:
        message = (
            f"Rate limit reached for tokens per minute on key {kid}: limit {key.tpm}"
            f"{applied(spec.tpm, key.tpm)}, requested {tokens}."
        )
    exceeded = verdict.exceeded or Limit.REQUESTS
    return KeyRateLimited(message + later, limit=exceeded.value, headers=headers)


class _Unlimited:
    headers: Mapping[str, str] = MappingProxyType({})
    settles = False
    settle_first = False

    async def settle(self, used_tokens: int | None) -> None:
        """Nothing was reserved."""

    async def withdraw(self) -> None:
        """Nothing was taken."""


_UNLIMITED = _Unlimited()


class KeyAdmission:
    """One admitted request: its headers, and the reservation ``settle`` reconciles once."""

    __slots__ = (
        "_backend",
        "_key_id",
        "_limiter",
        "_reserved",
        "_settled",
        "_slot",
        "_spec",
        "headers",
    )
    settles = True  # a reservation to reconcile (class attribute; instances share it)

    def __init__(
        self,
        limiter: KeyLimiter,
        backend: RateLimitBackend,
        *,
        key_id: str,
        spec: LimitSpec,
        reserved: int,
        slot: str,
        headers: Mapping[str, str],
    ) -> None:
        self._limiter, self._backend, self._key_id = limiter, backend, key_id
        self._spec, self._reserved, self._slot = spec, reserved, slot
        self._settled = False
        self.headers = headers

    @property
    def settle_first(self) -> bool:
        """It holds a concurrency slot: settled before the answer's last byte is written, so
        the slot is free by the time the caller has the whole answer."""
        return bool(self._slot)

    async def settle(self, used_tokens: int | None) -> None:
        """Refund or charge the difference from the reservation; free the concurrency slot.

        Nothing is sent for a key with only a request limit (settled at admission). A slot's
        release is sent at once and returns once the backend applied it; without a slot the
        release is lazy: it rides on this replica's next admission to Redis (one round trip
        for both), or goes alone after ``limiter_redis.LINGER_S``.
        """
        delta = 0
        if self._spec.tpm is not None and used_tokens is not None:
            delta = used_tokens - self._reserved
        await self._release(delta, 0, lazy=not self._slot)

    async def withdraw(self) -> None:
        """Refused before forwarding: give back the request, every reserved token and the slot."""
        tokens = -self._reserved if self._spec.tpm is not None else 0
        await self._release(tokens, -1 if self._spec.rpm is not None else 0, lazy=False)

    async def _release(self, token_delta: int, request_delta: int, *, lazy: bool) -> None:
        if self._settled:
            return
        self._settled = True
        if token_delta == 0 and request_delta == 0 and not self._slot:
            return
        try:
            await self._backend.release(
                self._key_id, self._spec, token_delta, self._slot, request_delta, lazy=lazy
            )
        except RateLimitBackendUnavailable as exc:
            # The backend frees the slot once Redis answers again (RedisRateLimiter.release);
            # the reservation stays charged (safe side).
            self._limiter.backend_failed(str(exc))


class KeyLimiter:
    """The ``RequestLimiter``: a key's limits on a shared backend, with a failure policy."""

    def __init__(
        self,
        backend: RateLimitBackend,
        *,
        metrics: LimitMetrics,
        health: BackendHealth | None = None,
        fallback: RateLimitBackend | None = None,
        fallback_share: Callable[[], int] | int = 1,
        share: int = 1,
        census: ReplicaCensus | None = None,
    ) -> None:
        self._backend = backend
        self._in_process = isinstance(backend, MemoryRateLimiter) and health is None
        self._primary_share = share
        self._metrics = metrics
        self._health = health
        self._fallback = fallback
        self.local_share: Callable[[], int] = (
            fallback_share if callable(fallback_share) else lambda: fallback_share
        )
        self._census = census
        # Slot ids: unique per process (random prefix) and cheap per request (a counter).
        self._slot_prefix = secrets.token_hex(6) + "-"
        self._slot_numbers = itertools.count()

    async def start(self) -> None:
        """Start-up: join the census of live gateway processes (when there is one)."""
        if self._census is not None:
            await self._census.start()

    async def aclose(self) -> None:
        """Shutdown: leave the census, send the settlements still held back, close the
        backend's connection."""
        if self._census is not None:
            await self._census.stop()
        close = getattr(self._backend, "aclose", None)
        if close is not None:
            await close()

    def backend_failed(self, reason: str) -> None:
        """Record a failed call to the shared backend."""
        if self._health is not None:
            self._health.failed(reason)

    def admits_at_once(self, principal: Principal) -> bool:
        """No round trip: the key has no limits, or its counters live in this process."""
        return self._in_process or not LimitSpec.of(principal.policy).active

    async def admit(self, principal: Principal, reserve_tokens: int) -> KeyAdmission | _Unlimited:
        """Reserve one request and ``reserve_tokens``; raises RateLimited when over a limit."""
        spec = LimitSpec.of(principal.policy)
        if not spec.active:
            return _UNLIMITED
        if self._primary_share > 1:
            spec = spec.shared(self._primary_share)  # per-worker memory counters
        whole = spec
        slot = ""
        if spec.concurrency is not None:
            slot = self._slot_prefix + str(next(self._slot_numbers))
        backend, spec, verdict = await self._acquire(principal.key_id, spec, reserve_tokens, slot)
        suffix = "" if backend is self._backend else "_local"
        if verdict.exceeded is not None:
            self._metrics.decision(verdict.exceeded.value, "rejected" + suffix)
            raise self._refusal(
                principal, spec, reserve_tokens, verdict, whole=whole, backend=backend
            )
        self._metrics.decision(ALL_LIMITS, "allowed" + suffix)
        return KeyAdmission(
            self,
            backend,
            key_id=principal.key_id,
            spec=spec,
            reserved=reserve_tokens,
            slot=slot,
            headers=rate_headers(verdict),
        )

    def _refusal(
        self,
        principal: Principal,
        spec: LimitSpec,
        tokens: int,
        verdict: Verdict,
        *,
        whole: LimitSpec,
        backend: RateLimitBackend,
    ) -> KeyRateLimited:
        """The 429 for a refused request; its message names the key's limits, and the share
        of them that refused it when this process enforces a share."""
        share, degraded = "", None
        if backend is not self._backend:
            degraded = self._health.retry_interval_s if self._health is not None else 1.0
            share = (
                f"in each of {self.local_share()} gateway processes while the shared limiter "
                "is unreachable"
            )
        elif self._primary_share > 1:
            share = (
                f"in each of {self._primary_share} worker processes "
                "(ratelimit.memory_divide_per_worker)"
            )
        return _rejection(
            principal,
            spec,
            tokens,
            verdict,
            whole=whole,
            share=share,
            degraded_retry_s=degraded,
        )

    async def _acquire(
        self, key_id: str, spec: LimitSpec, tokens: int, slot: str
    ) -> tuple[RateLimitBackend, LimitSpec, Verdict]:
        health = self._health
        if health is None or health.should_try():
            try:
                verdict = await self._backend.acquire(key_id, spec, tokens, slot)
            except RateLimitBackendUnavailable as exc:
                self.backend_failed(str(exc))
            else:
                if health is not None:
                    health.succeeded()
                return self._backend, spec, verdict
        if self._fallback is None:
            self._metrics.decision("backend", "unavailable")
            retry = math.ceil(health.retry_interval_s) if health is not None else 1
            raise RateLimitUnavailable(
                "Rate limiting is temporarily unavailable; try again shortly.",
                headers={"retry-after": str(max(1, retry))},
            )
        local = spec.shared(self.local_share())
        return self._fallback, local, await self._fallback.acquire(key_id, local, tokens, slot)


def limiter_lease_s(tiers: Mapping[str, TierSettings]) -> float:
    """How long a concurrency slot may stay held: past the longest possible request, then free."""
    return max(tier.timeouts.total_s for tier in tiers.values()) + 60.0


def build_limiter(
    rl: RateLimitSettings,
    *,
    key_prefix: str,
    lease_s: float,
    workers: int,
    client: Redis | None,
    metrics: LimitMetrics,
) -> KeyLimiter:
    """The limiter ``rl`` asks for (``client`` is needed for Redis), for ``workers`` processes.

    ``lease_s`` bounds a concurrency slot's life (:func:`limiter_lease_s`; in Redis a slot's
    lease is ``SLOT_LEASE_S``, renewed by its live holder up to that); ``key_prefix``
    namespaces the Redis keys.
    """
    if rl.backend == "memory":
        share = workers if rl.memory_divide_per_worker else 1
        return KeyLimiter(MemoryRateLimiter(lease_s=lease_s), metrics=metrics, share=share)
    if client is None:
        raise ValueError("ratelimit.backend 'redis' needs a Redis client")
    census = ReplicaCensus(client, key_prefix) if rl.on_redis_error == "open" else None
    metrics.set_degraded("redis", False)
    health = BackendHealth(
        "redis",
        down_event=EVENT_REDIS_DOWN,
        up_event=EVENT_REDIS_UP,
        retry_interval_s=rl.redis_retry_interval_s,
        on_change=lambda up: metrics.set_degraded("redis", not up),
        policy=rl.on_redis_error,
    )
    return KeyLimiter(
        RedisRateLimiter(client, prefix=key_prefix, lease_s=SLOT_LEASE_S, max_hold_s=lease_s),
        metrics=metrics,
        health=health,
        fallback=MemoryRateLimiter(lease_s=lease_s) if rl.on_redis_error == "open" else None,
        fallback_share=LocalShare(census, rl.degraded_replicas, workers),
        census=census,
    )
