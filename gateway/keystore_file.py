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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
import yaml

from policies.keys import KeyRecord, KeyStoreUnavailable

FORMAT_VERSION = 1
EVENT_RELOAD_FAILED = "auth.keys_file_unreadable"
_log = structlog.get_logger("tiergate.auth")


def _parse(path: Path, text: str) -> dict[str, KeyRecord]:
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping with a 'keys' list")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    items = data.get("keys") or []
    if not isinstance(items, list):
        raise ValueError(f"{path}: 'keys' must be a list")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
    records: dict[str, KeyRecord] = {}
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"{path}: every entry of 'keys' must be a mapping")  # noqa: TRY004  # callers handle every malformed-input case as ValueError
        record = KeyRecord.from_dict(item)
        if record.key_id in records:
            raise ValueError(f"{path}: duplicate key id {record.key_id}")
        records[record.key_id] = record
    return records


def _render(records: dict[str, KeyRecord]) -> str:
    ordered = sorted(records.values(), key=lambda r: (r.created_at, r.key_id))
    body = {"version": FORMAT_VERSION, "keys": [r.to_dict() for r in ordered]}
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
        self._records: dict[str, KeyRecord] = {}
        self._mtime_ns: int | None = None
        self._checked_at = clock()
        self._reload()

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._records, self._mtime_ns = {}, None
            return
        if stat.st_mtime_ns != self._mtime_ns:
            self._records = _parse(self.path, self.path.read_text(encoding="utf-8"))
            self._mtime_ns = stat.st_mtime_ns

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
        return sorted(self._records.values(), key=lambda r: (r.created_at, r.key_id))

    async def get(self, key_id: str) -> KeyRecord | None:
        """The record with this id, if any."""
        await self._refresh()
        return self._records.get(key_id)

    async def all(self) -> list[KeyRecord]:
        """Every record, re-read from the file."""
        await asyncio.to_thread(self._reload)
        return self.records()

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
                records = dict(self._records)
                records[record.key_id] = record
                self._write(records)
                self._records = records
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _write(self, records: dict[str, KeyRecord]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(_render(records))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._mtime_ns = self.path.stat().st_mtime_ns
