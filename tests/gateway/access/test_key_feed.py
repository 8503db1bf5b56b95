"""Key changes pushed over Redis pub/sub: revocation, rotation and creation apply at once."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.access.auth import KeyAuthenticator
from gateway.access.key_feed import EVENT_FEED_DOWN, EVENT_FEED_UP, KeyChangeFeed
from gateway.access.keystore_redis import RedisKeyStore
from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from policies.errors import AuthenticationFailed
from policies.keys import (
    KeyStoreUnavailable,
    create_key,
    issue_key,
    revoke_key,
    rotate_stored_key,
)
from policies.principal import KeyPolicy
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


@dataclass
class Replica:
    """One gateway's authenticator, with its own Redis client and change feed."""

    client: Redis
    auth: KeyAuthenticator
    feed: KeyChangeFeed

    async def accepts(self, token: str) -> bool:
        """True when ``token`` authenticates here."""
        try:
            await self.auth.authenticate(f"Bearer {token}")
        except AuthenticationFailed:
            return False
        return True


async def until(check: Callable[[], Awaitable[bool]], within: float = 2.0) -> float:
    """Seconds until ``check()`` is true; fails after ``within`` seconds."""
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < within, "condition not reached in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def _subscribed(feed: KeyChangeFeed) -> bool:
    return feed.subscriptions > 0


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[list[Replica]]:
    """Two replicas with long cache TTLs: only the feed can make a change visible quickly."""
    made: list[Replica] = []
    for _ in range(2):
        client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
        store = RedisKeyStore(client)
        auth = KeyAuthenticator(store, cache_ttl_s=600.0, unknown_ttl_s=600.0)
        feed = KeyChangeFeed(
            client, store.channel, auth.cache, retry_interval_s=0.05, ping_interval_s=0.5
        )
        feed.start()
        made.append(Replica(client, auth, feed))
    for replica in made:
        await until(functools.partial(_subscribed, replica.feed))
    yield made
    for replica in made:
        await replica.feed.stop()
        await replica.client.aclose()


def store_of(replica: Replica) -> RedisKeyStore:
    """The replica's key store."""
    store = replica.auth.store
    assert isinstance(store, RedisKeyStore)
    return store


async def test_revocation_on_one_replica_applies_on_another_within_a_second(
    replicas: list[Replica],
) -> None:
    """A key cached by replica B stops working there within 1 s of a revoke through A."""
    one, two = replicas
    record, token = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    assert await two.accepts(token)  # cached on B for up to 600 s without the feed
    await revoke_key(store_of(one), record.key_id)
    elapsed = await until(lambda: _refused(two, token), within=1.0)
    assert elapsed < 1.0


async def _refused(replica: Replica, token: str) -> bool:
    return not await replica.accepts(token)


async def test_rotation_swaps_secrets_everywhere(replicas: list[Replica]) -> None:
    """After rotate, the new secret works and the old one fails on every replica."""
    one, two = replicas
    record, old = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    assert await one.accepts(old)
    assert await two.accepts(old)
    result = await rotate_stored_key(store_of(one), record.key_id)
    assert result is not None
    _, new = result
    for replica in replicas:
        await until(functools.partial(replica.accepts, new), within=1.0)
        assert not await replica.accepts(old)


async def test_unknown_ids_are_cached_until_the_key_is_created(
    replicas: list[Replica], redis_server: RedisServer
) -> None:
    """Repeated unknown ids cost one GET, and creating that key elsewhere makes it work."""
    one, two = replicas
    record, token = issue_key("t", KeyPolicy(), now=time.time())
    probe = Redis.from_url(redis_server.url)
    try:
        assert not await two.accepts(token)
        before = await _gets(probe)
        for _ in range(50):
            assert not await two.accepts(token)
        assert await _gets(probe) == before  # answered from the unknown-id cache
        await store_of(one).put(record)
        assert await until(lambda: two.accepts(token), within=1.0) < 1.0
    finally:
        await probe.aclose()


async def _gets(client: Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def test_cache_serves_through_an_outage_and_revalidates_on_reconnect(
    replicas: list[Replica], redis_server: RedisServer
) -> None:
    """Redis down: cached keys work; back up: the feed resubscribes and missed revokes apply."""
    one, two = replicas
    record, token = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    assert await two.accepts(token)
    subscribed = two.feed.subscriptions
    with capture_logs() as logs:
        redis_server.kill()
        await until(lambda: asyncio.sleep(0, two.auth.cache.feed_live is False))
        for _ in range(3):
            assert await two.accepts(token)  # stale but served: the store is unreachable
        with pytest.raises(KeyStoreUnavailable):
            await two.auth.authenticate("Bearer tg-neverseen0-" + "z" * 43)
        redis_server.start()
        # Redis came back empty; the record returns already revoked, written without a
        # publish: a change B never heard of, which only revalidation can apply.
        revoked = json.dumps(replace(record, disabled=True).to_dict())
        await one.client.set(f"tiergate:key:{record.key_id}", revoked)
        await until(lambda: asyncio.sleep(0, two.feed.subscriptions > subscribed), within=3.0)
        assert not await two.accepts(token)
    events = [entry["event"] for entry in logs if entry["event"].startswith("auth.key_feed")]
    assert events.count(EVENT_FEED_DOWN) == 2  # one line per replica, not per retry
    assert events.count(EVENT_FEED_UP) == 2


async def test_without_a_live_feed_records_are_trusted_for_a_second_at_most(
    redis_server: RedisServer,
) -> None:
    """A feed that cannot subscribe leaves a 1 s bound on cached records, not cache_ttl_s."""
    client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
    try:
        store = RedisKeyStore(client)
        auth = KeyAuthenticator(store, cache_ttl_s=600.0)
        auth.cache.feed_live = False  # as KeyChangeFeed leaves it until Redis confirms
        record, token = await create_key(store, "t", KeyPolicy(), now=time.time())
        await auth.authenticate(f"Bearer {token}")
        await revoke_key(store, record.key_id)
        replica = Replica(client, auth, KeyChangeFeed(client, store.channel, auth.cache))
        elapsed = await until(lambda: _refused(replica, token), within=2.0)
        assert 0.5 < elapsed < 1.5
    finally:
        await client.aclose()


async def test_a_resubscription_revalidates_changes_missed_meanwhile(
    redis_server: RedisServer,
) -> None:
    """Pub/sub connections killed: the feed resubscribes and an unpublished change applies.

    The authenticator's clock is frozen, so no TTL can expire: only the revalidation that
    follows each confirmed subscription can make the replica ask Redis again.
    """
    client = open_redis(RedisSettings(url=redis_server.url, socket_timeout_s=0.5))
    store = RedisKeyStore(client)
    auth = KeyAuthenticator(store, cache_ttl_s=600.0, clock=lambda: 1000.0)
    feed = KeyChangeFeed(client, store.channel, auth.cache, retry_interval_s=0.05)
    replica = Replica(client, auth, feed)
    feed.start()
    try:
        await until(lambda: asyncio.sleep(0, feed.subscriptions > 0))
        record, token = await create_key(store, "t", KeyPolicy(), now=time.time())
        assert await replica.accepts(token)
        revoked = json.dumps(replace(record, disabled=True).to_dict())
        await client.set(f"tiergate:key:{record.key_id}", revoked)  # no publish: missed
        assert await replica.accepts(token)  # the cache has not heard of it
        await client.client_kill_filter(_type="pubsub")
        await until(lambda: asyncio.sleep(0, feed.subscriptions > 1))
        assert not await replica.accepts(token)
    finally:
        await feed.stop()
        await client.aclose()


async def test_a_key_changed_then_unanswered_is_refused_with_503_not_served_stale(
    replicas: list[Replica], redis_server: RedisServer
) -> None:
    """A key changed (its id published) and then Redis out of reach: the replica has no
    record it may serve (the cached one predates the change, maybe a revocation), so the key
    gets 503 ``auth_unavailable``, by design, while a key not changed is still served."""
    one, two = replicas
    changed, changed_token = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    _, kept_token = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    assert await two.accepts(changed_token)
    assert await two.accepts(kept_token)
    await store_of(one).put(replace(changed, name="renamed"))  # published: B drops it
    await until(lambda: asyncio.sleep(0, two.auth.cache.entry(changed.key_id) is None))
    redis_server.kill()
    with pytest.raises(KeyStoreUnavailable) as refused:
        await two.auth.authenticate(f"Bearer {changed_token}")
    assert refused.value.status == 503
    assert refused.value.code == "auth_unavailable"
    assert await two.accepts(kept_token)


async def test_a_store_that_answers_too_late_is_unavailable_for_an_uncached_key(
    replicas: list[Replica], redis_server: RedisServer
) -> None:
    """Redis that does not answer within ``redis.socket_timeout_s`` (stopped here; starved of
    CPU on a loaded host alike): a key the replica never cached gets 503
    ``auth_unavailable`` after that timeout, a cached key is still served."""
    one, two = replicas
    _, cached = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    _, fresh = await create_key(store_of(one), "t", KeyPolicy(), now=time.time())
    assert await two.accepts(cached)
    os.kill(redis_server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(KeyStoreUnavailable):
            await two.auth.authenticate(f"Bearer {fresh}")
        assert time.monotonic() - started >= 0.5  # the replicas' socket_timeout_s
        assert await two.accepts(cached)
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)
