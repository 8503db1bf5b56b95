"""The one Redis client factory, and the healthy/degraded state of a remote store.

Every part that talks to Redis (limits, budgets, keys, the key feed, the CLI) gets its client
from :func:`open_redis` and tracks outages with a :class:`BackendHealth`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.config.settings import RedisSettings

_log = structlog.get_logger("tiergate.limits")


def open_redis(settings: RedisSettings) -> Redis:
    """A client with its own connection pool; it connects lazily, on the first command.

    One quick retry (no backoff) replaces a pooled connection that died with a restarted
    server; anything slower must fail fast so the failure policy can act.
    """
    return Redis.from_url(
        settings.url,
        password=settings.read_password(),  # a password in the URL wins; settings refuse both
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.socket_timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=0,
    )


class BackendHealth:
    """healthy ⇄ degraded for one remote backend; one log line per transition, never per call."""

    def __init__(
        self,
        name: str,
        *,
        down_event: str,
        up_event: str,
        retry_interval_s: float = 1.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        **log_fields: str,
    ) -> None:
        self.name = name
        self.healthy = True
        self._down_event, self._up_event = down_event, up_event
        self._retry_interval_s = retry_interval_s
        self._on_change = on_change
        self._clock = clock
        self._since = 0.0
        self._retry_at = 0.0
        self._hastened_at: float | None = None
        self._fields = log_fields

    @property
    def retry_interval_s(self) -> float:
        """How often a degraded backend is probed."""
        return self._retry_interval_s

    def should_try(self) -> bool:
        """True when healthy, or when a degraded backend is due for a probe."""
        if self.healthy:
            return True
        now = self._clock()
        if now >= self._retry_at:
            self._retry_at = now + self._retry_interval_s
            return True
        return False

    def hasten(self) -> None:
        """News that the backend may answer again, heard elsewhere (another connection): a
        degraded backend gets one try at the next call, not after its interval; at most once
        per interval, so a stream of such news never makes every call a try."""
        if self.healthy:
            return
        now = self._clock()
        if self._hastened_at is None or now - self._hastened_at >= self._retry_interval_s:
            self._hastened_at = now
            self._retry_at = min(self._retry_at, now)

    def failed(self, reason: str) -> None:
        """A call failed: go degraded (logging once) and wait before probing again."""
        now = self._clock()
        self._retry_at = now + self._retry_interval_s
        if self.healthy:
            self.healthy = False
            self._since = now
            _log.warning(self._down_event, backend=self.name, error=reason, **self._fields)
            if self._on_change is not None:
                self._on_change(False)

    def succeeded(self) -> None:
        """A call worked: recover (logging once) if degraded."""
        if not self.healthy:
            self.healthy = True
            down_s = round(self._clock() - self._since, 3)
            _log.warning(self._up_event, backend=self.name, degraded_s=down_s, **self._fields)
            if self._on_change is not None:
                self._on_change(True)
