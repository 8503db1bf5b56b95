"""The authenticator's local cache of key records: verified records and recently unknown ids.

A record is kept for ``ttl_s`` and an unknown id for ``unknown_ttl_s``, but neither has to
wait that long to change: a change feed (Redis pub/sub, gateway/access/key_feed.py) or the admin API
``forget``s an id the moment it changes, and a feed that (re)subscribes ``revalidate``s
everything, since changes may have been missed while it was away. Revalidation marks records
stale rather than dropping them, so a known key still works from the cache while the store is
unreachable.

Unknown ids are remembered only while a change feed is live (otherwise a key created on another
replica could be refused until the entry expires); while a feed is attached but down, records
are trusted for at most ``DEGRADED_TTL_S``, so a revocation still applies within a second as
long as the store answers. The unknown-id memory is bounded (``max_unknown``, oldest first).

A lookup takes time (a Redis round trip), and a change may be announced while it is under way:
the record it read may then predate the change. Every ``forget`` and ``revalidate`` bumps
``generation``; a lookup notes it before asking the store and passes it to ``put`` /
``put_unknown``, which do not remember an answer read across a change (the request still gets
it, since it was the store's answer when the request arrived, but the next request asks again).
The counter is global, not per id: a change to another key during a lookup only costs that
lookup's caching.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.keys import KeyRecord
from policies.principal import Principal

DEGRADED_TTL_S = 1.0
_NEVER = float("-inf")


@dataclass(slots=True)
class CachedKey:
    """A verified record, its principal, and when it was fetched (monotonic seconds)."""

    record: KeyRecord
    principal: Principal
    fetched_at: float


class KeyCache:
    """Records by id, and ids the store said it does not know."""

    def __init__(self, *, ttl_s: float, unknown_ttl_s: float, max_unknown: int = 10_000) -> None:
        self._ttl = ttl_s
        self._unknown_ttl = unknown_ttl_s
        self._max_unknown = max_unknown
        self._records: dict[str, CachedKey] = {}
        self._unknown: dict[str, float] = {}  # id -> when the store said "no such key"
        self.feed_live: bool | None = None  # None: no change feed attached
        self.generation = 0  # bumped by every forget and revalidate

    def _record_ttl(self) -> float:
        return self._ttl if self.feed_live is not False else min(self._ttl, DEGRADED_TTL_S)

    def entry(self, key_id: str) -> CachedKey | None:
        """The cached record of ``key_id``, fresh or stale (the caller decides)."""
        return self._records.get(key_id)

    def fresh(self, entry: CachedKey, now: float) -> bool:
        """True while ``entry`` may be used without asking the store."""
        return now - entry.fetched_at < self._record_ttl()

    def known_unknown(self, key_id: str, now: float) -> bool:
        """True when the store said recently that it has no such key (and a feed is live)."""
        since = self._unknown.get(key_id)
        if since is None:
            return False
        if self.feed_live and now - since < self._unknown_ttl:
            return True
        del self._unknown[key_id]
        return False

    def put(self, record: KeyRecord, now: float, generation: int | None = None) -> CachedKey:
        """Remember a record the store returned to a lookup begun at ``generation``.

        A record read across a change (``generation`` is no longer current) is returned to
        the caller but not remembered.
        """
        if generation is not None and generation != self.generation:
            return CachedKey(record, record.principal(), now)
        self._unknown.pop(record.key_id, None)
        entry = self._records.get(record.key_id)
        if entry is not None and entry.record is record:  # the file store's unchanged record
            entry.fetched_at = now
            return entry
        entry = CachedKey(record, record.principal(), now)
        self._records[record.key_id] = entry
        return entry

    def put_unknown(self, key_id: str, now: float, generation: int | None = None) -> None:
        """Remember that the store has no such key (only useful while a feed is live).

        Not when the lookup began before a change (``generation`` is no longer current): the
        key may have been created meanwhile.
        """
        if generation is not None and generation != self.generation:
            return
        self._records.pop(key_id, None)
        if not self.feed_live or self._unknown_ttl <= 0:
            return
        if len(self._unknown) >= self._max_unknown:
            del self._unknown[next(iter(self._unknown))]  # the oldest entry
        self._unknown[key_id] = now

    def forget(self, key_id: str) -> None:
        """``key_id`` changed (created, revoked, rotated, re-scoped): ask the store next time."""
        self.generation += 1
        self._records.pop(key_id, None)
        self._unknown.pop(key_id, None)

    def revalidate(self) -> None:
        """Changes may have been missed: every record is stale, every unknown id forgotten."""
        self.generation += 1
        for entry in self._records.values():
            entry.fetched_at = _NEVER
        self._unknown.clear()

    def __len__(self) -> int:
        return len(self._records) + len(self._unknown)
