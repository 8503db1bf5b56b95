"""The authentication stage: ``Authorization: Bearer tg-…`` → a Principal with its key policy.

With the Redis store, verified records (and ids Redis does not know) are kept in a local cache
(gateway/access/key_cache.py): that keeps the hot path free of store round trips, and keeps known
keys working while Redis is down (the stale record is used until Redis answers again). Every
change is pushed to every replica over Redis pub/sub (gateway/access/key_feed.py) and applied
at once;
``auth.cache_ttl_s`` is only the backstop. A change made through this replica's admin API is
applied here before the answer is sent. The file store is read from memory and re-read at most
every ``auth.keys_reload_interval_s``, which is then the bound. Failures are closed: no branch
builds a principal without a matching, usable record.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from gateway.access.admin_keys import admin_key_handlers
from gateway.access.key_cache import CachedKey, KeyCache
from gateway.access.key_feed import KeyChangeFeed
from gateway.access.keystore_file import FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from gateway.access.passthrough import OpenAuthenticator
from gateway.config.redis_client import BackendHealth, open_redis
from gateway.config.settings import AuthSettings, Settings
from policies.errors import AuthenticationFailed
from policies.keys import (
    KEY_PREFIX,
    KeyRecord,
    KeyStore,
    KeyStoreUnavailable,
    bearer_token,
    key_digest,
    new_key_id,
    parse_key,
)
from policies.ports import Authenticator, RequestLimiter
from policies.principal import Principal

EVENT_STORE_DOWN = "auth.keystore_unavailable"
EVENT_STORE_UP = "auth.keystore_recovered"
_log = structlog.get_logger("tiergate.auth")
_BAD_KEY = "Incorrect API key provided. Find or create your TierGate key with `tiergate keys`."


class NoKeysConfigured(RuntimeError):
    """Authentication is on but the key store holds no usable key: refuse to start."""


class KeyFileDamaged(NoKeysConfigured):
    """The key file has entries that are not valid records: refuse to start until fixed.

    (A running gateway instead keeps serving the valid entries and refuses the damaged ones.)
    """


class KeyAuthenticator:
    """The ``Authenticator`` port over a key store, with a local cache of verified records.

    Rejection takes the same time whether or not the key id exists: the key's digest is always
    computed and compared, against a dummy digest when there is no record, and ids the store
    does not know are cached like known ones (``KeyCache``), so neither costs a store round
    trip more than the other.
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        pepper: bytes | None = None,
        cache_ttl_s: float = 30.0,
        unknown_ttl_s: float = 10.0,
        health: BackendHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._pepper = pepper
        self.cache = KeyCache(ttl_s=cache_ttl_s, unknown_ttl_s=unknown_ttl_s)
        self._health = health
        self._clock = clock
        self._wall = wall_clock
        # What a missing record is compared against: same algorithm and length as a real one.
        self._dummy = key_digest(f"{KEY_PREFIX}-{new_key_id()}-{secrets.token_urlsafe(32)}", pepper)

    @property
    def health(self) -> BackendHealth | None:
        """The store's health: lookups back off while it is degraded."""
        return self._health

    def forget(self, key_id: str) -> None:
        """``key_id`` was changed here (admin API): the next request asks the store."""
        self.cache.forget(key_id)

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of a valid, enabled, unexpired key; 401 otherwise."""
        token = bearer_token(authorization)
        key_id = parse_key(token)
        if key_id is None:
            raise AuthenticationFailed(_BAD_KEY)
        entry = await self._entry(key_id)
        expected = entry.record.digest if entry is not None else self._dummy
        matched = hmac.compare_digest(key_digest(token, self._pepper), expected)
        if entry is None or not matched:
            raise AuthenticationFailed(_BAD_KEY)
        record = entry.record
        if record.disabled:
            raise AuthenticationFailed(
                f"The API key {key_id} has been revoked.", code="api_key_revoked"
            )
        if not record.usable(self._wall()):
            raise AuthenticationFailed(f"The API key {key_id} has expired.", code="api_key_expired")
        return entry.principal

    async def _entry(self, key_id: str) -> CachedKey | None:
        cache, now = self.cache, self._clock()
        cached = cache.entry(key_id)
        if cached is not None and cache.fresh(cached, now):
            return cached
        if cached is None and cache.known_unknown(key_id, now):
            return None
        health = self._health
        if health is not None and not health.should_try():
            return self._stale(cached)
        generation = cache.generation  # a change announced during the lookup voids its answer
        try:
            record = await self.store.get(key_id)
        except KeyStoreUnavailable as exc:
            if health is not None:
                health.failed(type(exc.__cause__ or exc).__name__)
            return self._stale(cached)
        if health is not None:
            health.succeeded()
        if record is None:
            cache.put_unknown(key_id, now, generation)
            return None
        return cache.put(record, now, generation)

    @staticmethod
    def _stale(cached: CachedKey | None) -> CachedKey:
        if cached is None:
            raise KeyStoreUnavailable(
                "The API key store is unavailable; try again shortly.", headers={"retry-after": "1"}
            )
        return cached


def key_store(auth: AuthSettings, client: Redis | None, key_prefix: str) -> KeyStore:
    """The key store ``auth.store`` names (Redis keys under ``key_prefix``)."""
    if auth.store == "redis":
        if client is None:
            raise ValueError("auth.store 'redis' needs a Redis client")
        return RedisKeyStore(client, key_prefix)
    if auth.keys_file is None:
        raise NoKeysConfigured(_NO_KEYS + " (auth.keys_file is not set)")
    return FileKeyStore(auth.keys_file, reload_interval_s=auth.keys_reload_interval_s)


def pepper_of(auth: AuthSettings) -> bytes | None:
    """The configured pepper as bytes."""
    return auth.pepper.encode("utf-8") if auth.pepper else None


_NO_KEYS = (
    "authentication is enabled but the key store has no usable API key. Create one with "
    "`tiergate keys create --keys-file PATH --tenant NAME` (and set auth.keys_file) or "
    "`tiergate keys create --redis-url URL ...`, or set auth.enabled: false for development"
)


def _any_usable(records: list[KeyRecord]) -> bool:
    now = time.time()
    return any(r.usable(now) for r in records)


def require_keys_now(store: KeyStore) -> None:
    """Synchronous start-up check for stores read at construction (the file store)."""
    if isinstance(store, FileKeyStore) and store.damaged_now():
        problems = "; ".join(f"{d.ref}: {d.reason}" for d in store.damaged_now()[:5])
        raise KeyFileDamaged(
            f"{store.path} has entries that are not valid key records "
            f"({problems}); fix or remove them (`tiergate keys list` shows "
            "them)"
        )
    if isinstance(store, FileKeyStore) and not _any_usable(store.records()):
        raise NoKeysConfigured(_NO_KEYS + f" ({store.path} has none)")


async def require_keys(store: KeyStore) -> bool:
    """Start-up check: raise when the store surely has no usable key.

    Returns ``False`` when the store cannot be reached: the gateway then starts and answers
    503 until it can, rather than refusing (Redis may come up after the gateway).
    """
    try:
        records = await store.all()
    except KeyStoreUnavailable:
        return False
    if not _any_usable(records):
        raise NoKeysConfigured(_NO_KEYS)
    return True


def preflight(settings: Settings) -> None:
    """Before serving: raise NoKeysConfigured when auth is on and no usable key exists."""
    if not settings.auth.enabled:
        return
    if settings.auth.store != "redis":
        require_keys_now(key_store(settings.auth, None, settings.redis.key_prefix))
        return

    async def check() -> None:
        client = open_redis(settings.redis)
        try:
            await require_keys(key_store(settings.auth, client, settings.redis.key_prefix))
        finally:
            await client.aclose()

    asyncio.run(check())


@dataclass
class Access:
    """Authentication, rate limiting and key admin, as :func:`build_access` made them.

    Owns the Redis client (one connection pool, connecting lazily on the event loop) when any
    part uses Redis; ``startup`` checks the key store, ``shutdown`` closes the pool.
    """

    authenticator: Authenticator
    limiter: RequestLimiter
    metrics: Collector  # the limiter's counters (gateway.limits.limits.LimitMetrics)
    client: Redis | None = None
    store: KeyStore | None = None
    feed: KeyChangeFeed | None = None
    handlers: list[Any] = field(default_factory=list)
    # Whether start-up checks that the store has a usable key (the gateway's own auth only).
    check_store: bool = False

    async def startup(self) -> None:
        """Refuse to start (NoKeysConfigured) when the key store surely has no usable key."""
        store = self.store
        if self.feed is not None:
            self.feed.start()
        start_limiter = getattr(self.limiter, "start", None)
        if start_limiter is not None:
            await start_limiter()
        if self.check_store and isinstance(store, RedisKeyStore) and not await require_keys(store):
            _log.warning(EVENT_STORE_DOWN, backend="redis", phase="startup")

    async def shutdown(self) -> None:
        """Stop the key feed; send the limiter's held-back settlements; close the Redis pool."""
        if self.feed is not None:
            await self.feed.stop()
        close_limiter = getattr(self.limiter, "aclose", None)
        if close_limiter is not None:
            await close_limiter()
        if self.client is not None:
            await self.client.aclose()


def _authenticator(
    cfg: AuthSettings, store: KeyStore | None, retry_interval_s: float
) -> Authenticator:
    if store is None:
        return OpenAuthenticator()
    if cfg.store != "redis":
        # The file store already serves from memory and re-reads the file at most every
        # keys_reload_interval_s: a second cache would only delay revocations.
        return KeyAuthenticator(store, pepper=pepper_of(cfg), cache_ttl_s=0, unknown_ttl_s=0)
    health = BackendHealth(
        "redis",
        down_event=EVENT_STORE_DOWN,
        up_event=EVENT_STORE_UP,
        retry_interval_s=retry_interval_s,
    )
    return KeyAuthenticator(
        store,
        pepper=pepper_of(cfg),
        cache_ttl_s=cfg.cache_ttl_s,
        unknown_ttl_s=cfg.unknown_key_cache_ttl_s,
        health=health,
    )


def _key_feed(
    authenticator: Authenticator,
    store: KeyStore | None,
    client: Redis | None,
    retry_interval_s: float,
) -> KeyChangeFeed | None:
    """Key changes pushed over Redis pub/sub, for the gateway's own cached authenticator."""
    if (
        isinstance(authenticator, KeyAuthenticator)
        and isinstance(store, RedisKeyStore)
        and client is not None
    ):
        return KeyChangeFeed(
            client,
            store.channel,
            authenticator.cache,
            retry_interval_s=retry_interval_s,
            store_health=authenticator.health,
        )
    return None


def build_access(
    cfg: AuthSettings,
    *,
    client: Redis | None,
    key_prefix: str,
    admin_token: str | None,
    tiers: tuple[str, ...],
    limiter: RequestLimiter,
    metrics: Collector,
    retry_interval_s: float,
    auth: Authenticator | None = None,
) -> Access:
    """The key store, authenticator, key feed and key admin routes over ``client``.

    ``auth`` replaces the key authenticator (tests); the key admin routes exist only with
    authentication on and an ``admin_token``. ``client`` is the Redis client when any part
    uses Redis (:func:`uses_redis`).
    """
    admin_token = admin_token if cfg.enabled else None
    store: KeyStore | None = None
    if cfg.enabled and (auth is None or admin_token is not None):
        store = key_store(cfg, client, key_prefix)
    check_store = auth is None and cfg.enabled
    if check_store and store is not None:
        require_keys_now(store)
    authenticator = auth or _authenticator(cfg, store, retry_interval_s)
    handlers: list[Any] = []
    if admin_token is not None and store is not None:
        # A change made here applies here at once, before the answer (the feed tells the
        # other replicas; for the file store they see it on their next reload).
        forget = authenticator.forget if isinstance(authenticator, KeyAuthenticator) else None
        handlers = admin_key_handlers(
            store, admin_token, tiers=tiers, pepper=pepper_of(cfg), on_change=forget
        )
    feed = _key_feed(authenticator, store, client, retry_interval_s)
    return Access(authenticator, limiter, metrics, client, store, feed, handlers, check_store)


def uses_redis(
    cfg: AuthSettings,
    admin_token: str | None,
    *,
    auth: Authenticator | None,
    redis_limiter: bool,
) -> bool:
    """Whether the key store or the limiter (``redis_limiter``) needs the Redis client."""
    admin_token = admin_token if cfg.enabled else None
    keys = cfg.enabled and cfg.store == "redis" and (auth is None or admin_token is not None)
    return keys or redis_limiter
