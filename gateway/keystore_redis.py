"""The Redis key store: records shared by every gateway replica.

One JSON string per key at ``<prefix>key:<id>`` and a set of ids at ``<prefix>keys``. A key
created on one replica is found by all of them at once (lookups of unknown ids are never
cached); a revocation reaches the others within their ``auth.cache_ttl_s``.
"""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from policies.keys import KeyRecord, KeyStoreUnavailable

_UNAVAILABLE = "The API key store is unavailable; try again shortly."


class RedisKeyStore:
    """Key records in Redis."""

    def __init__(self, client: Redis, prefix: str = "tiergate:") -> None:
        self.client = client
        self._prefix = prefix
        self._index = prefix + "keys"

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}key:{key_id}"

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record with this id, if any."""
        try:
            raw = await self.client.get(self._key(key_id))
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc
        return _decode(raw)

    async def put(self, record: KeyRecord) -> None:
        """Create or replace a record (atomically with the id index)."""
        data = json.dumps(record.to_dict(), separators=(",", ":"))
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(self._key(record.key_id), data)
                pipe.sadd(self._index, record.key_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc

    async def all(self) -> list[KeyRecord]:
        """Every record, sorted by creation time."""
        try:
            ids = sorted(m.decode() if isinstance(m, bytes) else str(m)
                         for m in await self.client.smembers(self._index))
            raws = await self.client.mget([self._key(i) for i in ids]) if ids else []
        except (RedisError, OSError) as exc:
            raise KeyStoreUnavailable(_UNAVAILABLE) from exc
        records = [r for r in (_decode(raw) for raw in raws) if r is not None]
        return sorted(records, key=lambda r: (r.created_at, r.key_id))


def _decode(raw: Any) -> KeyRecord | None:
    if raw is None:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a stored key record is not a JSON object")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    return KeyRecord.from_dict(data)
