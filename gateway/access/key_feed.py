"""Key changes pushed to every gateway replica: Redis pub/sub on ``<prefix>keys:changed``.

The Redis key store publishes the id of every record it writes (create, revoke, rotate, policy
change) in the same transaction as the write, so by the time the writer gets its answer every
subscribed replica has been sent the id; each drops it from its cache (``KeyCache.forget``)
and asks the store on the next request. That is milliseconds, not ``auth.cache_ttl_s``.

When the subscription is lost (Redis down, a dead connection found by a PING every
``ping_interval_s`` of silence), the cache is told the feed is down: cached keys keep serving
but are trusted for at most a second while the store answers. Each (re)subscription confirmed
by Redis revalidates the whole cache, since changes may have been published while away. One log
line per transition, never per attempt.

A confirmed subscription or a published id is Redis answering on this connection, so the feed
hastens the key lookups' next try (``store_health``): a change published as Redis returns drops
the key's cached record, and without that news the lookups would keep backing off (one try per
``redis_retry_interval_s``), refusing the key with 503 ``auth_unavailable`` though Redis
answers. Only one try, at most once per interval: pub/sub answering does not prove that reads
do (anyone may publish on the channel), and only a read that works ends the back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.access.key_cache import KeyCache
from gateway.config.redis_client import BackendHealth
from gateway.pipeline.tasks import stop_tasks
from policies.keys import valid_key_id

EVENT_FEED_DOWN = "auth.key_feed_unavailable"
EVENT_FEED_UP = "auth.key_feed_subscribed"
EVERYTHING = "*"  # published to make every replica revalidate its whole cache
_log = structlog.get_logger("tiergate.auth")


def change_channel(prefix: str) -> str:
    """The pub/sub channel key changes are published on."""
    return prefix + "keys:changed"


class _Silent(Exception):
    """No answer to a PING: the connection is dead even if the socket is open."""


class KeyChangeFeed:
    """A background task that applies published key changes to a ``KeyCache``."""

    def __init__(
        self,
        client: Redis,
        channel: str,
        cache: KeyCache,
        *,
        retry_interval_s: float = 0.5,
        ping_interval_s: float = 5.0,
        store_health: BackendHealth | None = None,
    ) -> None:
        self._client = client
        self._store_health = store_health
        self._channel = channel
        self._cache = cache
        self._retry_s = retry_interval_s
        self._ping_s = ping_interval_s
        self._task: asyncio.Task[None] | None = None
        self._down_logged = False
        self.subscriptions = 0  # confirmed (re)subscriptions, for tests and diagnostics
        cache.feed_live = False

    def start(self) -> None:
        """Start listening (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tiergate-key-feed"
            )

    async def stop(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        await stop_tasks(task)

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except (RedisError, OSError, TimeoutError, _Silent) as exc:
                self._lost(type(exc).__name__)
            except Exception as exc:  # noqa: BLE001  # the task's top level: a bug must not leave the cache trusting a dead feed
                self._lost(type(exc).__name__)
                _log.exception(EVENT_FEED_DOWN, backend="redis", error=type(exc).__name__)
            await asyncio.sleep(self._retry_s)

    def _lost(self, reason: str) -> None:
        self._cache.feed_live = False
        if not self._down_logged:
            self._down_logged = True
            _log.warning(EVENT_FEED_DOWN, backend="redis", error=reason)

    async def _listen(self) -> None:
        pubsub = self._client.pubsub()
        loop = asyncio.get_running_loop()
        try:
            await pubsub.subscribe(self._channel)
            heard = loop.time()
            pinged: float | None = None
            while True:
                message = await pubsub.get_message(timeout=min(1.0, self._ping_s))
                now = loop.time()
                if message is not None:
                    heard, pinged = now, None
                    self._apply(message)
                elif pinged is not None and now - pinged > self._ping_s:
                    raise _Silent
                elif pinged is None and now - heard > self._ping_s:
                    await pubsub.ping()
                    pinged = now
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated

    def _apply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in ("subscribe", "message") and self._store_health is not None:
            self._store_health.hasten()  # Redis may answer reads again: the next lookup tries
        if kind == "subscribe":  # also after redis-py reconnected and resubscribed by itself
            self._cache.revalidate()
            self._cache.feed_live = True
            self.subscriptions += 1
            if self._down_logged:
                self._down_logged = False
                _log.warning(EVENT_FEED_UP, backend="redis")
            return
        if kind != "message":
            return
        data = message.get("data")
        key_id = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
        if valid_key_id(key_id):
            self._cache.forget(key_id)
        else:  # EVERYTHING, or anything we cannot read: the safe answer is to revalidate all
            self._cache.revalidate()
