"""One contract for both key stores: the YAML file and Redis."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.access.auth import KeyAuthenticator, KeyFileDamaged, require_keys_now
from gateway.access.keystore_file import EVENT_KEYS_DROPPED, FileKeyStore
from gateway.access.keystore_redis import RedisKeyStore
from gateway.config.redis_client import open_redis
from gateway.config.settings import RedisSettings
from policies.errors import AuthenticationFailed
from policies.keys import (
    KeyStore,
    KeyStoreUnavailable,
    create_key,
    issue_key,
    revoke_key,
    rotate_stored_key,
)
from policies.principal import KeyPolicy
from tests.processes import free_port
from tests.redis_server import RedisServer, redis_server

__all__ = ["redis_server"]
NOW = 1_700_000_000.0


@pytest.fixture(params=["file", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    """Each key store in turn, empty."""
    if request.param == "file":
        yield FileKeyStore(tmp_path / "keys.yaml", reload_interval_s=0)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = Redis.from_url(server.url)
    try:
        yield RedisKeyStore(client, "test:")
    finally:
        await client.aclose()


async def test_empty_store_has_no_keys(store: KeyStore) -> None:
    """A new store lists nothing and finds nothing."""
    assert await store.all() == []
    assert await store.get("abc") is None


async def test_created_key_is_found_by_id(store: KeyStore) -> None:
    """A stored record comes back equal, by id and in the listing."""
    policy = KeyPolicy(allowed_tiers=frozenset({"fast"}), rpm=3, scopes=frozenset({"downgrade"}))
    record, token = await create_key(store, "team-a", policy, now=NOW, name="bot")
    found = await store.get(record.key_id)
    assert found == record
    assert found is not None
    assert found.matches(token, None)
    assert await store.all() == [record]
    assert await store.damaged() == []


async def test_listing_is_sorted_by_creation(store: KeyStore) -> None:
    """all() returns records oldest first."""
    first, _ = await create_key(store, "a", KeyPolicy(), now=NOW)
    second, _ = await create_key(store, "b", KeyPolicy(), now=NOW + 1)
    assert [r.key_id for r in await store.all()] == [first.key_id, second.key_id]


async def test_revoke_disables_but_keeps_the_record(store: KeyStore) -> None:
    """A revoked key stays listed, disabled; unknown ids are reported."""
    record, _ = await create_key(store, "a", KeyPolicy(), now=NOW)
    revoked = await revoke_key(store, record.key_id)
    assert revoked is not None
    assert revoked.disabled
    stored = await store.get(record.key_id)
    assert stored is not None
    assert stored.disabled
    assert await revoke_key(store, "nosuchkey") is None


async def test_rotate_replaces_the_secret(store: KeyStore) -> None:
    """After rotation the stored digest matches the new key only."""
    record, old = await create_key(store, "a", KeyPolicy(rpm=1), now=NOW)
    result = await rotate_stored_key(store, record.key_id)
    assert result is not None
    _, new = result
    stored = await store.get(record.key_id)
    assert stored is not None
    assert stored.matches(new, None)
    assert not stored.matches(old, None)
    assert stored.policy == record.policy


async def test_rotating_a_revoked_key_is_refused(store: KeyStore) -> None:
    """A revoked key cannot be brought back by rotation."""
    record, _ = await create_key(store, "a", KeyPolicy(), now=NOW)
    await revoke_key(store, record.key_id)
    with pytest.raises(ValueError, match="revoked"):
        await rotate_stored_key(store, record.key_id)


async def test_store_never_holds_the_key(store: KeyStore, tmp_path: Path) -> None:
    """Neither the file nor Redis contains the key or its secret."""
    record, token = await create_key(store, "a", KeyPolicy(), now=NOW)
    secret = token.rsplit("-", 1)[1]
    if isinstance(store, FileKeyStore):
        content = store.path.read_text()
    else:
        assert isinstance(store, RedisKeyStore)
        raw = await store.client.get(f"test:key:{record.key_id}")
        assert isinstance(raw, bytes)
        content = raw.decode()
    assert record.key_id in content
    assert secret not in content


async def test_file_is_private_and_shared_between_instances(tmp_path: Path) -> None:
    """The key file is mode 0600, and a second instance (another process) sees changes."""
    path = tmp_path / "keys.yaml"
    writer = FileKeyStore(path)
    reader = FileKeyStore(path, reload_interval_s=0)
    record, _ = await create_key(writer, "a", KeyPolicy(), now=NOW)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await reader.get(record.key_id) == record
    other, _ = await create_key(reader, "b", KeyPolicy(), now=NOW + 1)
    assert {r.key_id for r in await writer.all()} == {record.key_id, other.key_id}


def test_malformed_file_is_refused_with_its_path(tmp_path: Path) -> None:
    """A key file with an invalid entry stops start-up with a clear message naming it."""
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - id: abc\n    tenant: t\n    digest: md5:00\n")
    with pytest.raises(KeyFileDamaged, match=r"keys\.yaml.*abc.*digest"):
        require_keys_now(FileKeyStore(path))


async def test_damaged_file_entries_are_listed_kept_and_never_served(tmp_path: Path) -> None:
    """Damaged entries are listed, survive a rewrite unchanged, and no key is served from them."""
    path = tmp_path / "keys.yaml"
    good, _ = issue_key("t", KeyPolicy(), now=NOW)
    twin, _ = issue_key("t", KeyPolicy(), now=NOW)
    twin_entry = twin.to_dict()
    bad_policy = {**good.to_dict(), "id": "badexpiry", "policy": {"expires_at": ".inf"}}
    body = {"keys": [good.to_dict(), bad_policy, twin_entry, twin_entry, "junk"]}
    path.write_text(yaml.safe_dump(body).replace("'.inf'", ".inf"))
    store = FileKeyStore(path, reload_interval_s=0)
    assert await store.get(good.key_id) == good
    assert await store.get("badexpiry") is None
    assert await store.get(twin.key_id) is None  # an id written twice: neither copy counts
    damaged = {d.ref: d.reason for d in await store.damaged()}
    assert set(damaged) == {"badexpiry", twin.key_id, "entry 5"}
    assert "expires_at" in damaged["badexpiry"]
    other, _ = await create_key(store, "u", KeyPolicy(), now=NOW + 1)
    reread = FileKeyStore(path)
    assert {r.key_id for r in reread.records()} == {good.key_id, other.key_id}
    refs = {d.ref for d in reread.damaged_now()}
    assert len(refs) == 3
    assert {"badexpiry", twin.key_id} < refs
    assert any(ref.startswith("entry ") for ref in refs)


async def test_redis_damaged_records_are_listed_and_never_served(
    redis_server: RedisServer,
) -> None:
    """Garbage under a key's Redis name is absent for get, listed by damaged(), kept by all()."""
    client = Redis.from_url(redis_server.url)
    try:
        store = RedisKeyStore(client)
        record, _ = await create_key(store, "a", KeyPolicy(), now=NOW)
        garbage: dict[str, bytes | str] = {
            "notjson": b"\xff{",
            "inf": json.dumps(
                {**record.to_dict(), "id": "inf", "policy": {"expires_at": 1e308 * 10}}
            ),
            "list": b"[1, 2]",
            "other": json.dumps(record.to_dict()),
            "\x1b[31mred": b"{}",
        }
        for key_id, raw in garbage.items():
            await client.set(f"tiergate:key:{key_id}", raw)
            await client.sadd("tiergate:keys", key_id)
        for key_id in garbage:
            assert await store.get(key_id) is None
        assert await store.all() == [record]
        refs = {d.ref for d in await store.damaged()}
        assert refs == set(garbage) - {"\x1b[31mred"} | {"index entry '\\x1b[31mred'"}
        assert not any("\x1b" in d.ref + d.reason for d in await store.damaged())
    finally:
        await client.aclose()


async def test_redis_store_down_raises_unavailable() -> None:
    """With Redis unreachable the store raises KeyStoreUnavailable, never a raw error."""
    client = open_redis(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0"))
    try:
        store = RedisKeyStore(client)
        with pytest.raises(KeyStoreUnavailable):
            await store.get("abc")
        with pytest.raises(KeyStoreUnavailable):
            await store.all()
    finally:
        await client.aclose()


async def test_redis_key_created_by_one_replica_is_seen_by_another(
    redis_server: RedisServer,
) -> None:
    """A key stored through one client is found at once through another."""
    one, two = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    try:
        record, _ = await create_key(RedisKeyStore(one), "a", KeyPolicy(), now=NOW)
        found = await asyncio.wait_for(RedisKeyStore(two).get(record.key_id), 5)
        assert found == record
    finally:
        await one.aclose()
        await two.aclose()


async def test_file_store_keeps_last_good_records_when_the_file_breaks(tmp_path: Path) -> None:
    """A half-edited key file keeps the previous keys working instead of locking all out."""
    path = tmp_path / "keys.yaml"
    store = FileKeyStore(path, reload_interval_s=0)
    record, _ = await create_key(store, "a", KeyPolicy(), now=NOW)
    path.write_text("keys: [this is: not valid")
    with capture_logs() as logs:
        assert await store.get(record.key_id) == record
    unreadable = [log for log in logs if log["event"] == "auth.keys_file_unreadable"]
    assert [log["path"] for log in unreadable] == [str(path)]


async def test_unwritable_key_file_is_a_clean_error(tmp_path: Path) -> None:
    """A key file that cannot be written raises KeyStoreUnavailable, not a raw OSError."""
    path = tmp_path / "keys.yaml"
    store = FileKeyStore(path)
    path.mkdir()  # the path now names a folder: reading and replacing it fail, even for root
    with pytest.raises(KeyStoreUnavailable, match="cannot be written"):
        await create_key(store, "a", KeyPolicy(), now=NOW)


@pytest.mark.parametrize("how", ["delete", "empty"])
async def test_a_key_file_emptied_while_running_is_logged_once(tmp_path: Path, how: str) -> None:
    """Deleting or emptying the key file logs a warning naming it and the keys dropped, once."""
    path = tmp_path / "keys.yaml"
    store = FileKeyStore(path, reload_interval_s=0)
    for tenant in ("a", "b"):
        await create_key(store, tenant, KeyPolicy(), now=1.0)
    if how == "delete":
        path.unlink()
    else:
        written = path.stat().st_mtime_ns
        path.write_text("keys: []\n", encoding="utf-8")
        os.utime(path, ns=(written + 10**9, written + 10**9))  # mtime ticks may be coarse
    with capture_logs() as logs:
        for _ in range(3):
            assert await store.get("abcdefghij") is None
    dropped = [log for log in logs if log["event"] == EVENT_KEYS_DROPPED]
    assert len(dropped) == 1, logs
    assert dropped[0]["path"] == str(path)
    assert dropped[0]["dropped"] == 2
    assert dropped[0]["log_level"] == "warning"
    why = {"delete": "the file is gone", "empty": "the file has no valid key"}[how]
    assert dropped[0]["reason"] == why
    await create_key(store, "c", KeyPolicy(), now=2.0)  # keys came back, then went again
    path.unlink()
    with capture_logs() as again:
        assert await store.get("abcdefghij") is None
    assert [log["dropped"] for log in again if log["event"] == EVENT_KEYS_DROPPED] == [1]


async def test_a_damaged_file_entry_is_logged_once_per_change_of_the_file(tmp_path: Path) -> None:
    """docs/key-revocation.md: auth.key_record_damaged names the id and why, never the record;
    the key file logs it when the file is read after a change, not on every lookup."""
    path = tmp_path / "keys.yaml"
    good, _ = issue_key("t", KeyPolicy(), now=NOW)
    bad = {**good.to_dict(), "id": "badexpiry", "policy": {"expires_at": ".inf"}}
    path.write_text(yaml.safe_dump({"keys": [bad]}).replace("'.inf'", ".inf"))
    with capture_logs() as logs:
        store = FileKeyStore(path, reload_interval_s=0)
        for _ in range(3):
            assert await store.get("badexpiry") is None
    damaged = [log for log in logs if log["event"] == "auth.key_record_damaged"]
    assert len(damaged) == 1
    assert set(damaged[0]) == {"event", "log_level", "key_id", "error"}
    assert damaged[0]["key_id"] == "badexpiry"
    assert good.digest not in str(damaged[0])


async def test_a_damaged_redis_record_is_logged_per_lookup_the_unknown_cache_spares(
    redis_server: RedisServer,
) -> None:
    """The Redis store logs a damaged record at each read; the authenticator remembers the id
    as unknown while its change feed is live, so a replica asks (and logs) once per
    unknown_key_cache_ttl_s."""
    client = Redis.from_url(redis_server.url)
    try:
        store = RedisKeyStore(client)
        record, token = await create_key(store, "a", KeyPolicy(), now=NOW)
        await client.set(f"tiergate:key:{record.key_id}", b"\xff{")
        with capture_logs() as logs:
            for _ in range(2):
                assert await store.get(record.key_id) is None
            auth = KeyAuthenticator(store, unknown_ttl_s=10.0)
            auth.cache.feed_live = True  # as with its change feed subscribed
            for _ in range(3):
                with pytest.raises(AuthenticationFailed):
                    await auth.authenticate(f"Bearer {token}")
        damaged = [log for log in logs if log["event"] == "auth.key_record_damaged"]
        assert len(damaged) == 3  # two direct reads, one for the three requests
        assert token not in str(damaged)
    finally:
        await client.aclose()
