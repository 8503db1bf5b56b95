"""The Redis key store: records shared by every gateway replica.

One JSON string per key at ``<prefix>key:<id>`` and a set of ids at ``<prefix>keys``; every
write also publishes the id on ``<prefix>keys:changed``, which each gateway replica listens to
(gateway/access/key_feed.py) so a creation, revocation or rotation applies everywhere at once.
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from policies.keys import DamagedRecord, KeyRecord, KeyStoreUnavailable, valid_key_id

EVENT_RECORD_DAMAGED = "auth.key_record_damaged"
_log = structlog.get_logger("tiergate.auth")
_UNAVAILABLE = "The API key store is unavailable; try again shortly."


class RedisKeyStore:
    """Key records in Redis."""

    def __init__(self, client: Redis, prefix: str = "tiergate:") -> None:
        self.client = client
        self._prefix = prefix
        self._index = prefix + "keys"
        self.channel = prefix + "keys:changed"  # every write publishes the key id here

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}key:{key_id}"

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record with this id, if any (a damaged one is logged and treated as absent)."""
        try:
            raw = await self.client.get(self._key(key_id))
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc
        try:
            record = _decode(raw)
            if record is not None and record.key_id != key_id:
                raise ValueError(f"the record stored under {key_id} has another id")  # noqa: TRY301  # one path for every damaged record
        except ValueError as exc:
            _log.warning(EVENT_RECORD_DAMAGED, key_id=key_id, error=str(exc)[:200])
            return None
        return record

    async def put(self, record: KeyRecord) -> None:
        """Create or replace a record (atomically with the id index), and announce the change.

        The id is published on ``channel`` in the same transaction, so every subscribed replica
        has been sent it before this returns (gateway/access/key_feed.py).
        """
        data = json.dumps(record.to_dict(), separators=(",", ":"))
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(self._key(record.key_id), data)
                pipe.sadd(self._index, record.key_id)
                pipe.publish(self.channel, record.key_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc

    async def all(self) -> list[KeyRecord]:
        """Every valid record, sorted by creation time."""
        records, _ = await self._survey()
        return records

    async def damaged(self) -> list[DamagedRecord]:
        """Every indexed entry that is not a valid record."""
        _, damaged = await self._survey()
        return damaged

    async def _survey(self) -> tuple[list[KeyRecord], list[DamagedRecord]]:
        try:
            ids = sorted(
                m.decode(errors="replace") if isinstance(m, bytes) else str(m)
                for m in await self.client.smembers(self._index)
            )
            raws = await self.client.mget([self._key(i) for i in ids]) if ids else []
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc
        records: list[KeyRecord] = []
        damaged: list[DamagedRecord] = []
        for key_id, raw in zip(ids, raws, strict=True):
            # The index is shared storage: never print what it holds unless it is a plain id.
            ref = key_id if valid_key_id(key_id) else "index entry " + ascii(key_id)[:80]
            try:
                record = _decode(raw)
            except ValueError as exc:
                damaged.append(DamagedRecord(ref, str(exc)))
                continue
            if record is not None and record.key_id != key_id:
                damaged.append(
                    DamagedRecord(ref, f"the record stored under {ref} has id {record.key_id}")
                )
            elif record is not None:
                records.append(record)
        return sorted(records, key=lambda r: (r.created_at, r.key_id)), damaged


def _decode(raw: Any) -> KeyRecord | None:
    """The record stored as ``raw``; ValueError for anything that is not a valid record."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"the stored value is not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError("a stored key record is not a JSON object")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    return KeyRecord.from_dict(data)
