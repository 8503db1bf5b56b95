"""The live dial: target shares and artifact reloads, the same on every worker and replica.

``PUT /admin/router/share`` (or ``tiergate router dial``) writes a target to a store and
applies it at once on the worker that took the call; every other worker and replica reads the
store every ``router.dial_sync_interval_s`` (0.25 s) and applies what changed. The store is:

* Redis when the gateway has a Redis client (keys ``<prefix>dial:*``): every replica, and the
  targets outlive restarts (a Redis that lost them, restarted empty, gets them back from the
  first worker that finds the store behind what it applied: :meth:`DialStore.restore`);
* else, for ``--workers N``, a file (``dial.json``) in the workers' shared directory;
* else memory (one process: nothing to share).

A reload of the router artifact is shared the same way: a generation counter that each worker
follows by loading the artifact again (``gateway/routing/admin_routing.py`` re-seeds its dial
first).
Each change is logged once, by the worker that made it, as an audit event.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.pipeline.tasks import stop_tasks
from policies.dial import DialTargets, View, check_share, combine

DIAL_FILE = "dial.json"
AUDIT_EVENT = "router.dial_changed"
VIEW_TTL_S = 5.0  # a worker's view of its tenants counts for this long after it is published
ViewData = dict[str, Any]  # {"reload": generation, "tenants": {tenant: [threshold, n, target]}}


class SharedDial(Protocol):
    """What the sync drives: the per-tenant dial (``policies.dial.TenantDial`` / ``FixedDial``)."""

    targets: DialTargets

    def apply(self, targets: DialTargets) -> list[str]:
        """Take new targets."""
        ...

    def local_view(self) -> dict[str, View]:
        """This worker's tenants."""
        ...

    def set_fleet(self, thresholds: Mapping[str, float]) -> None:
        """The fleet's thresholds."""
        ...


_log = structlog.get_logger("tiergate.audit")


@dataclass(frozen=True, slots=True)
class DialState:
    """What the store holds: the targets (``default`` None: the configured one) and the
    artifact's reload generation."""

    default: float | None
    tenants: Mapping[str, float]
    version: int
    reload: int

    def targets(self, configured: float) -> DialTargets:
        """The targets in force, the configured share standing in for an unset default."""
        default = configured if self.default is None else self.default
        return DialTargets(default, dict(self.tenants), self.version)


EMPTY = DialState(None, {}, 0, 0)


class DialStore(Protocol):
    """Where the live dial's state is shared."""

    async def read(self) -> DialState:
        """The current state."""
        ...

    async def set_target(self, tenant: str | None, share: float | None) -> DialState:
        """Set (or with ``share`` None, clear) the default or a tenant's target."""
        ...

    async def bump_reload(self) -> DialState:
        """Ask every worker to load the artifact again."""
        ...

    async def exchange(self, worker: str, view: ViewData) -> list[ViewData]:
        """Publish this worker's view (it expires after ``VIEW_TTL_S``); the other live
        workers' views."""
        ...

    async def restore(self, applied: DialState) -> DialState:
        """The store is behind ``applied`` (it lost its data): put it back; the state now."""
        ...


class MemoryDialStore:
    """One process: the state lives here."""

    def __init__(self) -> None:
        self.state = EMPTY

    async def read(self) -> DialState:
        """The current state."""
        return self.state

    async def set_target(self, tenant: str | None, share: float | None) -> DialState:
        """Set or clear a target."""
        self.state = _with_target(self.state, tenant, share)
        return self.state

    async def bump_reload(self) -> DialState:
        """Count a reload."""
        s = self.state
        self.state = DialState(s.default, s.tenants, s.version, s.reload + 1)
        return self.state

    async def exchange(self, worker: str, view: ViewData) -> list[ViewData]:
        """One process: no other worker."""
        return []

    async def restore(self, applied: DialState) -> DialState:
        """Never behind: the state lives here."""
        return self.state


def _with_target(state: DialState, tenant: str | None, share: float | None) -> DialState:
    tenants = dict(state.tenants)
    default = state.default
    if tenant is None:
        default = share
    elif share is None:
        tenants.pop(tenant, None)
    else:
        tenants[tenant] = share
    return DialState(default, tenants, state.version + 1, state.reload)


def _state_of(data: Mapping[str, Any]) -> DialState:
    default = data.get("default")
    tenants = data.get("tenants") or {}
    return DialState(
        None if default is None else check_share(default),
        {str(t): check_share(v) for t, v in tenants.items()},
        int(data.get("version", 0)),
        int(data.get("reload", 0)),
    )


class FileDialStore:
    """The workers of one gateway without Redis: ``dial.json`` in their shared directory,
    changed under an exclusive lock and replaced atomically."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / DIAL_FILE
        self._lock = directory / f".{DIAL_FILE}.lock"
        self._views = directory / "dial-views"

    def _read(self) -> DialState:
        try:
            return _state_of(json.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return EMPTY

    def _change(self, change: Callable[[DialState], DialState]) -> DialState:
        with self._lock.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = change(self._read())
            data = {
                "default": state.default,
                "tenants": dict(state.tenants),
                "version": state.version,
                "reload": state.reload,
            }
            tmp = self.path.with_name(f".{DIAL_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data), encoding="utf-8")
            tmp.replace(self.path)
            return state

    async def read(self) -> DialState:
        """The file's state (empty before the first change)."""
        return await asyncio.to_thread(self._read)

    async def set_target(self, tenant: str | None, share: float | None) -> DialState:
        """Set or clear a target."""
        return await asyncio.to_thread(self._change, lambda s: _with_target(s, tenant, share))

    async def bump_reload(self) -> DialState:
        """Count a reload."""

        def bump(s: DialState) -> DialState:
            return DialState(s.default, s.tenants, s.version, s.reload + 1)

        return await asyncio.to_thread(self._change, bump)

    def _exchange(self, worker: str, view: ViewData) -> list[ViewData]:
        self._views.mkdir(exist_ok=True)
        own = self._views / f"{worker}.json"
        tmp = own.with_name(f".{own.name}.tmp")
        tmp.write_text(json.dumps({"at": time.time(), "view": view}), encoding="utf-8")
        tmp.replace(own)
        out = []
        for path in self._views.glob("*.json"):
            if path == own:
                continue
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_bytes())
                if time.time() - float(data["at"]) <= VIEW_TTL_S:
                    out.append(data["view"])
        return out

    async def exchange(self, worker: str, view: ViewData) -> list[ViewData]:
        """Views as files in the shared directory; a file older than the TTL is ignored."""
        return await asyncio.to_thread(self._exchange, worker, view)

    async def restore(self, applied: DialState) -> DialState:
        """Not put back: the file is only lost with the directory the workers share."""
        return await self.read()


_DEFAULT_FIELD = "*default"  # not a tenant: tenant fields are "t:<name>"
# Marks targets put back by a worker, not dialled since: a worker that applied a later
# version puts its own back over them (the first worker back may have been a stale one).
_RESTORED_FIELD = "*restored"
# KEYS: targets, version, reload. ARGV: the version and reload generation a worker applied,
# then its targets as field, value pairs. Counters behind them mean Redis lost the dial: with
# nothing written since (version 0), or only another worker's older targets put back, the
# worker's targets and version are put back; after a change made since, the version moves
# past the worker's so that every worker reads the targets again. A reload generation behind
# is raised to the worker's, so the next reload counts above what every worker followed.
_RESTORE = """
local version, mine = tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(ARGV[1])
if version < mine then
  if version == 0 or redis.call('HEXISTS', KEYS[1], '*restored') == 1 then
    redis.call('DEL', KEYS[1])
    for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
    redis.call('HSET', KEYS[1], '*restored', 1)
    redis.call('SET', KEYS[2], mine)
  else
    redis.call('SET', KEYS[2], mine + 1)
  end
end
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[3], ARGV[2])
end
return 1
"""


class RedisDialStore:
    """Every replica: a hash of targets and two counters under ``<prefix>dial:``."""

    def __init__(self, client: Redis, key_prefix: str) -> None:
        self.client = client
        self.targets_key = f"{key_prefix}dial:targets"
        self.version_key = f"{key_prefix}dial:version"
        self.reload_key = f"{key_prefix}dial:reload"
        self.views_key = f"{key_prefix}dial:views"
        self.view_prefix = f"{key_prefix}dial:view:"
        self._cached = EMPTY

    async def read(self) -> DialState:
        """One round trip for the counters; the hash only when the version moved."""
        version, reload = await self.client.mget(self.version_key, self.reload_key)
        version_n, reload_n = int(version or 0), int(reload or 0)
        cached = self._cached
        if version_n != cached.version:
            cached = self._parse(await self.client.hgetall(self.targets_key), version_n)
        self._cached = DialState(cached.default, cached.tenants, version_n, reload_n)
        return self._cached

    @staticmethod
    def _parse(fields: Mapping[Any, Any], version: int) -> DialState:
        default: float | None = None
        tenants: dict[str, float] = {}
        for name, value in fields.items():
            key = name.decode() if isinstance(name, bytes) else str(name)
            if key == _DEFAULT_FIELD:
                default = check_share(float(value))
            elif key.startswith("t:"):
                tenants[key[2:]] = check_share(float(value))
        return DialState(default, tenants, version, 0)

    async def set_target(self, tenant: str | None, share: float | None) -> DialState:
        """Change the hash and count a version, in one transaction."""
        field = _DEFAULT_FIELD if tenant is None else f"t:{tenant}"
        async with self.client.pipeline(transaction=True) as pipe:
            if share is None:
                pipe.hdel(self.targets_key, field)
            else:
                pipe.hset(self.targets_key, field, repr(share))
            pipe.hdel(self.targets_key, _RESTORED_FIELD)  # dialled: no restore goes over it
            pipe.incr(self.version_key)
            await pipe.execute()
        return await self.read()

    async def bump_reload(self) -> DialState:
        """Count a reload."""
        await self.client.incr(self.reload_key)
        return await self.read()

    async def restore(self, applied: DialState) -> DialState:
        """Put back what Redis lost (``_RESTORE``), atomically; the state now."""
        fields: list[str] = []
        if applied.default is not None:
            fields += [_DEFAULT_FIELD, repr(applied.default)]
        for tenant, share in applied.tenants.items():
            fields += [f"t:{tenant}", repr(share)]
        keys = (self.targets_key, self.version_key, self.reload_key)
        await self.client.eval(_RESTORE, 3, *keys, applied.version, applied.reload, *fields)
        return await self.read()

    async def exchange(self, worker: str, view: ViewData) -> list[ViewData]:
        """``SET`` this worker's view with a TTL and list it; ``MGET`` the others (ids whose
        view expired are dropped from the list)."""
        key = self.view_prefix + worker
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(key, json.dumps(view), ex=max(1, int(VIEW_TTL_S)))
            pipe.sadd(self.views_key, worker)
            pipe.smembers(self.views_key)
            *_, members = await pipe.execute()
        others = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        others = [w for w in others if w != worker]
        if not others:
            return []
        values = await self.client.mget([self.view_prefix + w for w in others])
        gone = [w for w, v in zip(others, values, strict=True) if v is None]
        if gone:
            await self.client.srem(self.views_key, *gone)
        return [json.loads(v) for v in values if v is not None]


def _view(data: Any) -> View:
    threshold, scores, target = data
    return View(float(threshold), int(scores), float(target))


def dial_store(client: Redis | None, key_prefix: str, share_dir: Path | None) -> DialStore:
    """Redis when there is a client, else the workers' shared file, else memory."""
    if client is not None:
        return RedisDialStore(client, key_prefix)
    if share_dir is not None:
        return FileDialStore(share_dir)
    return MemoryDialStore()


class DialSync:
    """Applies the store's targets to this worker's dial, and its reloads to this worker's
    artifact, every ``interval_s``; ``set_target`` and ``reloaded`` write a change."""

    def __init__(
        self,
        store: DialStore,
        dial: SharedDial,
        reload: Callable[[], Awaitable[object]],
        configured: float,
        interval_s: float = 0.25,
    ) -> None:
        self.store = store
        self.dial = dial
        self.worker = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._reload = reload
        self.configured = configured
        self.interval_s = interval_s
        self.applied = EMPTY
        self.applied_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def _take(self, state: DialState) -> None:
        if state.version != self.applied.version:
            self.dial.apply(state.targets(self.configured))
            self.applied_at = time.time()
        self.applied = DialState(state.default, state.tenants, state.version, self.applied.reload)

    async def startup(self) -> None:
        """Apply what the store holds (targets dialled before this process started; the
        artifact loaded at start-up is already the current one), then follow it."""
        with contextlib.suppress(RedisError, OSError, ValueError):
            state = await self.store.read()
            self._take(state)
            self.applied = state
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="tiergate-dial")

    async def shutdown(self) -> None:
        """Stop following."""
        task, self._task = self._task, None
        await stop_tasks(task)

    async def poll(self) -> None:
        """Read the store once and apply a change of target or a reload; then trade views
        with the other workers and set each tenant's fleet threshold."""
        state = await self.store.read()
        if state.version < self.applied.version or state.reload < self.applied.reload:
            _log.warning(
                "router.dial_restored", version=self.applied.version, reload=self.applied.reload
            )  # Redis lost the dial (restarted empty): put back what this worker applied
            state = await self.store.restore(self.applied)
        self._take(state)
        if state.reload > self.applied.reload:
            await self._reload()
            self.applied = state
        await self.share_views()

    async def share_views(self) -> None:
        """Publish this worker's view and set the fleet thresholds from every live worker's
        (only views of the same artifact generation count)."""
        generation = self.applied.reload
        own = self.dial.local_view()
        data: ViewData = {"reload": generation, "tenants": {t: list(v) for t, v in own.items()}}
        others = await self.store.exchange(self.worker, data)
        views: list[Mapping[str, View]] = [own]
        for other in others:
            if other.get("reload") == generation:
                with contextlib.suppress(TypeError, ValueError):
                    views.append({t: _view(v) for t, v in other["tenants"].items()})
        self.dial.set_fleet(combine(views, self.dial.targets))

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except (RedisError, OSError, ValueError) as exc:
                if not self._failing:
                    _log.warning("router.dial_sync_failed", error=type(exc).__name__)
                self._failing = True
                self.dial.set_fleet({})  # no fresh views: each worker decides on its own
            else:
                self._failing = False

    async def set_target(self, tenant: str | None, share: float | None, actor: str) -> DialTargets:
        """Write a target, apply it here now, and log the audit event."""
        before = self.applied.targets(self.configured)
        state = await self.store.set_target(tenant, share)
        self._take(state)
        after = state.targets(self.configured)
        _log.info(
            AUDIT_EVENT,
            audit=True,
            actor=actor,
            tenant=tenant,
            before=before.target_for(tenant) if tenant is not None else before.default,
            after=after.target_for(tenant) if tenant is not None else after.default,
            cleared=share is None,
            version=state.version,
        )
        return after

    async def reloaded(self) -> None:
        """This worker reloaded the artifact: count it so the others follow."""
        state = await self.store.bump_reload()
        self._take(state)
        self.applied = state
