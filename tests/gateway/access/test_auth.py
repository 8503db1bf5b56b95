"""The authentication stage over real key stores: verdicts, cache, and Redis outages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.access.auth import EVENT_STORE_DOWN, EVENT_STORE_UP, KeyAuthenticator
from gateway.access.keystore_file import FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from gateway.config.redis_client import BackendHealth, open_redis
from gateway.config.settings import RedisSettings
from policies.errors import AuthenticationFailed
from policies.keys import (
    DamagedRecord,
    KeyRecord,
    KeyStoreUnavailable,
    create_key,
    issue_key,
    revoke_key,
)
from policies.principal import KeyPolicy
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def file_store(tmp_path: Path) -> FileKeyStore:
    """An empty key file store."""
    return FileKeyStore(tmp_path / "keys.yaml", reload_interval_s=0)


async def test_valid_key_yields_its_principal(file_store: FileKeyStore) -> None:
    """A good key authenticates as its id, tenant and policy."""
    policy = KeyPolicy(allowed_tiers=frozenset({"fast"}), rpm=7)
    record, token = await create_key(file_store, "team-a", policy, now=1.0)
    principal = await KeyAuthenticator(file_store).authenticate(f"Bearer {token}")
    assert (principal.key_id, principal.tenant, principal.policy) == (
        record.key_id,
        "team-a",
        policy,
    )


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("Basic x", "invalid_api_key"),
        ("Bearer sk-x", "invalid_api_key"),
        ("Bearer tg-unknownid-" + "x" * 43, "invalid_api_key"),
    ],
)
async def test_bad_headers_are_401(file_store: FileKeyStore, header: str | None, code: str) -> None:
    """Missing, malformed and unknown keys are refused with 401."""
    await create_key(file_store, "t", KeyPolicy(), now=1.0)
    with pytest.raises(AuthenticationFailed) as info:
        await KeyAuthenticator(file_store).authenticate(header)
    assert info.value.status == 401
    assert info.value.code == code


async def test_wrong_secret_for_a_real_id_is_401(file_store: FileKeyStore) -> None:
    """Knowing a key id (it is logged) does not help without the secret."""
    record, token = await create_key(file_store, "t", KeyPolicy(), now=1.0)
    forged = f"tg-{record.key_id}-" + "A" * 43
    with pytest.raises(AuthenticationFailed) as info:
        await KeyAuthenticator(file_store).authenticate(f"Bearer {forged}")
    assert info.value.code == "invalid_api_key"
    assert token not in info.value.message


async def test_revoked_and_expired_keys_are_401(file_store: FileKeyStore) -> None:
    """Disabled and expired keys are refused and say why."""
    revoked, revoked_token = await create_key(file_store, "t", KeyPolicy(), now=1.0)
    await revoke_key(file_store, revoked.key_id)
    _, expired_token = await create_key(file_store, "t", KeyPolicy(expires_at=50.0), now=1.0)
    auth = KeyAuthenticator(file_store, wall_clock=lambda: 100.0)
    for token, code in ((revoked_token, "api_key_revoked"), (expired_token, "api_key_expired")):
        with pytest.raises(AuthenticationFailed) as info:
            await auth.authenticate(f"Bearer {token}")
        assert info.value.code == code


async def test_revocation_reaches_a_cached_replica_within_the_ttl(
    file_store: FileKeyStore,
) -> None:
    """A cached key keeps working until cache_ttl_s, then the revocation applies."""
    clock = Clock()
    record, token = await create_key(file_store, "t", KeyPolicy(), now=1.0)
    auth = KeyAuthenticator(file_store, cache_ttl_s=30.0, clock=clock)
    await auth.authenticate(f"Bearer {token}")
    await revoke_key(file_store, record.key_id)
    clock.now += 29.0
    assert (await auth.authenticate(f"Bearer {token}")).key_id == record.key_id
    clock.now += 2.0
    with pytest.raises(AuthenticationFailed):
        await auth.authenticate(f"Bearer {token}")


class HeldStore:
    """A key store whose ``get`` reads at once but answers only when ``release`` is set.

    Models a slow Redis round trip: the answer is what the store held when the lookup began.
    """

    def __init__(self, inner: FileKeyStore) -> None:
        self.inner = inner
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record as of now, handed over once released."""
        record = await self.inner.get(key_id)
        self.reading.set()
        await self.release.wait()
        return record

    async def put(self, record: KeyRecord) -> None:
        """Store in the inner store."""
        await self.inner.put(record)

    async def all(self) -> list[KeyRecord]:
        """Every record of the inner store."""
        return await self.inner.all()

    async def damaged(self) -> list[DamagedRecord]:
        """Damaged entries of the inner store."""
        return await self.inner.damaged()


def _announce(auth: KeyAuthenticator, how: str) -> Callable[[str], None]:
    """How a change reaches the cache: one id forgotten, or the whole cache revalidated."""
    if how == "forget":
        return auth.forget
    return lambda _key_id: auth.cache.revalidate()


@pytest.mark.parametrize("how", ["forget", "revalidate"])
async def test_a_revocation_announced_during_a_lookup_is_not_lost(
    file_store: FileKeyStore, how: str
) -> None:
    """A record read before a revocation announced mid-lookup is not cached for cache_ttl_s."""
    record, token = await create_key(file_store, "t", KeyPolicy(), now=1.0)
    store = HeldStore(file_store)
    auth = KeyAuthenticator(store, cache_ttl_s=30.0, unknown_ttl_s=10.0, clock=Clock())
    auth.cache.feed_live = True
    in_flight = asyncio.create_task(auth.authenticate(f"Bearer {token}"))
    await store.reading.wait()
    await revoke_key(file_store, record.key_id)
    _announce(auth, how)(record.key_id)  # the change feed's message arrives mid-lookup
    store.release.set()
    assert (await in_flight).key_id == record.key_id  # read before the revocation
    with pytest.raises(AuthenticationFailed) as info:
        await auth.authenticate(f"Bearer {token}")
    assert info.value.code == "api_key_revoked"


@pytest.mark.parametrize("how", ["forget", "revalidate"])
async def test_a_key_created_during_a_lookup_is_not_remembered_as_unknown(
    file_store: FileKeyStore, how: str
) -> None:
    """An id the store did not know when asked, created and announced mid-lookup, works next."""
    await create_key(file_store, "t", KeyPolicy(), now=1.0)
    record, token = issue_key("t", KeyPolicy(), now=1.0)
    store = HeldStore(file_store)
    auth = KeyAuthenticator(store, cache_ttl_s=30.0, unknown_ttl_s=10.0, clock=Clock())
    auth.cache.feed_live = True
    in_flight = asyncio.create_task(auth.authenticate(f"Bearer {token}"))
    await store.reading.wait()
    await file_store.put(record)
    _announce(auth, how)(record.key_id)
    store.release.set()
    with pytest.raises(AuthenticationFailed):
        await in_flight
    assert (await auth.authenticate(f"Bearer {token}")).key_id == record.key_id


async def test_new_key_works_at_once_on_another_replica(redis_server: RedisServer) -> None:
    """Unknown ids are not cached: a key created elsewhere works on the next request."""
    one, two = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    try:
        auth = KeyAuthenticator(RedisKeyStore(two), cache_ttl_s=60.0)
        missing = "tg-abcdefghij-" + "x" * 43
        with pytest.raises(AuthenticationFailed):
            await auth.authenticate(f"Bearer {missing}")
        _, token = await create_key(RedisKeyStore(one), "t", KeyPolicy(), now=1.0)
        assert (await auth.authenticate(f"Bearer {token}")).tenant == "t"
    finally:
        await one.aclose()
        await two.aclose()


async def test_cached_keys_survive_a_redis_outage(redis_server: RedisServer) -> None:
    """While Redis is down known keys still work from cache, unknown ones get 503."""
    client = open_redis(RedisSettings(url=redis_server.url))
    clock = Clock()
    try:
        store = RedisKeyStore(client)
        _, token = await create_key(store, "t", KeyPolicy(), now=1.0)
        health = BackendHealth(
            "redis", down_event=EVENT_STORE_DOWN, up_event=EVENT_STORE_UP, retry_interval_s=0.0
        )
        auth = KeyAuthenticator(store, cache_ttl_s=1.0, health=health, clock=clock)
        await auth.authenticate(f"Bearer {token}")
        redis_server.kill()
        clock.now += 5.0
        with capture_logs() as logs:
            for _ in range(3):
                assert (await auth.authenticate(f"Bearer {token}")).tenant == "t"
            with pytest.raises(KeyStoreUnavailable) as info:
                await auth.authenticate("Bearer tg-otherkeyid-" + "y" * 43)
            assert info.value.status == 503
            redis_server.start()
            _, token2 = await create_key(store, "t2", KeyPolicy(), now=2.0)
            assert (await auth.authenticate(f"Bearer {token2}")).tenant == "t2"
        events = [entry["event"] for entry in logs]
        assert events == [EVENT_STORE_DOWN, EVENT_STORE_UP]
    finally:
        await client.aclose()
