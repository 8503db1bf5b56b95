"""The file key store: one YAML file of digests and policies, for static deployments.

The file is written atomically (temporary file + rename, mode 0600) under an exclusive lock on
a sidecar ``.lock`` file, so ``tiergate keys`` and the admin API can both change it. A running
gateway notices changes (mtime) at most ``reload_interval_s`` after they happen.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
import yaml

from policies.keys import DamagedRecord, KeyRecord, KeyStoreUnavailable, valid_key_id

FORMAT_VERSION = 1
EVENT_RELOAD_FAILED = "auth.keys_file_unreadable"
EVENT_RECORD_DAMAGED = "auth.key_record_damaged"
# Every key gone at once (file deleted or emptied): every request is refused from now on.
EVENT_KEYS_DROPPED = "auth.keys_file_emptied"
_log = structlog.get_logger("tiergate.auth")


class _Parsed:
    """A key file read entry by entry: valid records, damaged entries (kept as written)."""

    def __init__(self) -> None:
        self.records: dict[str, KeyRecord] = {}
        self.damaged: list[DamagedRecord] = []
        self.raw_damaged: list[tuple[str, Any]] = []  # (ref, entry), written back unchanged


def _parse(path: Path, text: str) -> _Parsed:
    """The valid records of a key file and its damaged entries (served by no one).

    An entry that is not a valid record, and every entry of an id that appears twice, is
    damaged; the others still load. A file that is not YAML at all raises ValueError.
    """
    try:
        data: Any = yaml.safe_load(text) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: not valid YAML ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping with a 'keys' list")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    items = data.get("keys") or []
    if not isinstance(items, list):
        raise ValueError(f"{path}: 'keys' must be a list")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    result = _Parsed()
    parsed: list[tuple[KeyRecord, Any]] = []
    for number, item in enumerate(items, start=1):
        try:
            if not isinstance(item, dict):
                raise ValueError("the entry is not a mapping")  # noqa: TRY004, TRY301  # one ValueError path for every malformed entry
            parsed.append((KeyRecord.from_dict(item), item))
        except ValueError as exc:
            ref = _entry_ref(item, number)
            result.damaged.append(DamagedRecord(ref, str(exc)))
            result.raw_damaged.append((ref, item))
    counts = Counter(record.key_id for record, _ in parsed)
    for record, item in parsed:
        kid = record.key_id
        if counts[kid] == 1:
            result.records[kid] = record
            continue
        result.raw_damaged.append((kid, item))
        if all(d.ref != kid for d in result.damaged):
            result.damaged.append(
                DamagedRecord(kid, f"key {kid}: the id appears {counts[kid]} times in the file")
            )
    return result


def _entry_ref(item: Any, number: int) -> str:
    key_id = item.get("id") if isinstance(item, dict) else None
    return key_id if isinstance(key_id, str) and valid_key_id(key_id) else f"entry {number}"


def _render(records: dict[str, KeyRecord], raw_damaged: list[tuple[str, Any]]) -> str:
    ordered = sorted(records.values(), key=lambda r: (r.created_at, r.key_id))
    damaged = [item for ref, item in raw_damaged if ref not in records]
    body = {"version": FORMAT_VERSION, "keys": [r.to_dict() for r in ordered] + damaged}
    header = "# TierGate API keys: digests and policies only (no key can be recovered).\n"
    return header + yaml.safe_dump(body, sort_keys=False)


class FileKeyStore:
    """Key records in a YAML file; reads are served from memory."""

    def __init__(
        self,
        path: Path,
        *,
        reload_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._reload_interval_s = reload_interval_s
        self._clock = clock
        self._parsed = _Parsed()
        self._mtime_ns: int | None = None
        self._checked_at = clock()
        self._reload()

    def _reload(self) -> None:
        before = len(self._parsed.records)
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._parsed, self._mtime_ns = _Parsed(), None
            self._warn_if_emptied(before, "the file is gone")
            return
        if stat.st_mtime_ns != self._mtime_ns:
            self._parsed = _parse(self.path, self.path.read_text(encoding="utf-8"))
            self._mtime_ns = stat.st_mtime_ns
            for entry in self._parsed.damaged:
                _log.warning(EVENT_RECORD_DAMAGED, key_id=entry.ref, error=entry.reason[:200])
            self._warn_if_emptied(before, "the file has no valid key")

    def _warn_if_emptied(self, before: int, reason: str) -> None:
        """Log once when a reload drops every key (not again until keys came back)."""
        if before and not self._parsed.records:
            _log.warning(EVENT_KEYS_DROPPED, path=str(self.path), dropped=before, reason=reason)

    async def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at >= self._reload_interval_s:
            self._checked_at = now
            try:
                await asyncio.to_thread(self._reload)
            except (OSError, ValueError) as exc:
                # A half-edited or unreadable file must not lock everyone out: keep serving
                # the last good records, loudly, until the file is fixed.
                _log.warning(EVENT_RELOAD_FAILED, path=str(self.path), error=str(exc)[:200])

    def records(self) -> list[KeyRecord]:
        """Every record, as last read (synchronous, for start-up checks)."""
        return sorted(self._parsed.records.values(), key=lambda r: (r.created_at, r.key_id))

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record with this id, if any."""
        await self._refresh()
        return self._parsed.records.get(key_id)

    async def all(self) -> list[KeyRecord]:
        """Every record, re-read from the file."""
        await asyncio.to_thread(self._reload)
        return self.records()

    def damaged_now(self) -> list[DamagedRecord]:
        """The damaged entries, as last read (synchronous, for start-up checks)."""
        return list(self._parsed.damaged)

    async def damaged(self) -> list[DamagedRecord]:
        """The entries of the file that are not valid records, re-read from the file."""
        await asyncio.to_thread(self._reload)
        return list(self._parsed.damaged)

    async def put(self, record: KeyRecord) -> None:
        """Create or replace a record in the file."""
        await asyncio.to_thread(self.put_sync, record)

    def _unwritable(self, exc: OSError) -> KeyStoreUnavailable:
        return KeyStoreUnavailable(
            f"The key file {self.path} cannot be written ({exc.strerror or type(exc).__name__})."
        )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def put_sync(self, record: KeyRecord) -> None:
        """``put`` for the command line: read, change and write under the lock."""
        try:
            with self._locked():
                self._mtime_ns = None
                self._reload()
                parsed = self._parsed
                records = dict(parsed.records)
                records[record.key_id] = record
                self._write(records, parsed.raw_damaged)
                parsed.records = records
                parsed.damaged = [d for d in parsed.damaged if d.ref != record.key_id]
                parsed.raw_damaged = [(r, i) for r, i in parsed.raw_damaged if r != record.key_id]
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _write(self, records: dict[str, KeyRecord], raw_damaged: list[tuple[str, Any]]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(_render(records, raw_damaged))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._mtime_ns = self.path.stat().st_mtime_ns
