"""The Redis rate limiter: one Lua script per admission, one per reconciliation.

Both run on one pipelined connection (gateway/limits/redis.py). An admission is written at
once; a reconciliation is *lazy*: it goes out in the same write as the next admission (one
round trip for both), or after ``LINGER_S`` when no admission comes. Commands run in the order
they were written, so this replica's next admission always sees its earlier settlements; other
replicas see a settlement at most ``LINGER_S`` (plus one round trip) after it was made. Until
then a refund is simply not yet given back (the safe side: never more admitted than the
limits allow, only briefly less); a slot is freed that much later.

The scripts do policies/ratelimit.py's GCRA arithmetic inside Redis, on Redis' own clock
(``TIME``), so every gateway replica shares one exact budget per key whatever their clocks say.
Per key (``{id}`` is a hash tag, so a key's data stays on one cluster slot):

- ``<prefix>rl:{id}``   hash: ``r`` request debt, ``t`` token debt, ``s`` stamp (µs);
  expires once fully drained;
- ``<prefix>rl:{id}:c`` sorted set of in-flight request slots scored by lease expiry (µs).

A slot's lease is short (``SLOT_LEASE_S``) and renewed by its holder every third of it while
the request runs (up to ``max_hold_s``, the longest request), so a gateway that dies
mid-request (SIGKILL, OOM kill, a lost node) frees its keys' slots within one lease, and a
Redis that lost them (restarted empty) gets them back within a third of one.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from gateway.limits.redis import LuaScript, ScriptRunner, script_runner
from gateway.pipeline.tasks import stop_tasks
from policies.ratelimit import PERIOD_S, Limit, LimitSpec, Quota, Verdict

# Shared by both scripts: read both buckets and drain them to Redis' ``now``.
_DRAIN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rl, tl, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'r', 't', 's')
local elapsed = now - (tonumber(v[3]) or now)
local function drain(debt, limit)
  if limit <= 0 or not debt then return 0 end
  local level = tonumber(debt) - elapsed * limit / period
  if level < 0 then return 0 end
  return level
end
local r, tk = drain(v[1], rl), drain(v[2], tl)
local function ms(units, limit) return math.ceil(units * period / limit / 1000) end
local function store()
  redis.call('HSET', KEYS[1], 'r', r, 't', tk, 's', now)
  local ttl = 0
  if rl > 0 then ttl = ms(r, rl) end
  if tl > 0 then ttl = math.max(ttl, ms(tk, tl)) end
  redis.call('PEXPIRE', KEYS[1], ttl + 1000)
end
"""

# KEYS: bucket, slots. ARGV: rpm, tpm, period_us (0 = no limit), tokens, concurrency, slot,
# lease_us. Returns {exceeded (0 none, 1 requests, 2 tokens, 3 concurrency), wait_ms (-1:
# never fits), requests remaining, requests reset ms, tokens remaining, tokens reset ms}.
_ACQUIRE = (
    _DRAIN
    + """
local cost, cl = tonumber(ARGV[4]), tonumber(ARGV[5])
local exceeded, wait = 0, 0
if rl > 0 and r + 1 > rl then
  exceeded, wait = 1, ms(r + 1 - rl, rl)
elseif tl > 0 and tk + cost > tl then
  exceeded = 2
  if cost > tl then wait = -1 else wait = ms(tk + cost - tl, tl) end
elseif cl > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= cl then exceeded, wait = 3, 1000 end
end
if exceeded == 0 then
  if rl > 0 then r = r + 1 end
  if tl > 0 then tk = tk + cost end
  if rl > 0 or tl > 0 then store() end
  if cl > 0 then
    local lease = tonumber(ARGV[7])
    redis.call('ZADD', KEYS[2], now + lease, ARGV[6])
    redis.call('PEXPIRE', KEYS[2], math.ceil(lease / 1000) + 1000)
  end
end
local rrem, rreset, trem, treset = 0, 0, 0, 0
if rl > 0 then rrem, rreset = math.max(0, math.floor(rl - r)), ms(r, rl) end
if tl > 0 then trem, treset = math.max(0, math.floor(tl - tk)), ms(tk, tl) end
return {exceeded, wait, rrem, rreset, trem, treset}
"""
)

# KEYS: bucket, slots. ARGV: rpm, tpm, period_us, token delta, slot, request delta. Refunds
# never go below 0, and a bucket that already drained away is not recreated by a refund.
_RELEASE = (
    _DRAIN
    + """
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[2], ARGV[5]) end
local delta, rdelta = tonumber(ARGV[4]), tonumber(ARGV[6])
local changed = false
if tl > 0 and delta ~= 0 and (v[3] or delta > 0) then
  tk = math.max(0, tk + delta)
  changed = true
end
if rl > 0 and rdelta ~= 0 and (v[3] or rdelta > 0) then
  r = math.max(0, r + rdelta)
  changed = true
end
if changed then store() end
return 1
"""
)

# KEYS: slots. ARGV: lease_us, slot ids joined by ','. Every slot's lease starts again now
# (one that expired or that Redis lost is added back: its request still runs).
_RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
for slot in string.gmatch(ARGV[2], '[^,]+') do
  redis.call('ZADD', KEYS[1], expiry, slot)
end
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
return 1
"""

ACQUIRE = LuaScript(_ACQUIRE, keys=2, args=7)
RELEASE = LuaScript(_RELEASE, keys=2, args=6)
RENEW = LuaScript(_RENEW, keys=1, args=2)
# A concurrency slot's lease in Redis; its holder renews it every third of that.
SLOT_LEASE_S = 15.0
# Keys whose renewals are in flight at once (one write on the pipelined connection; at most
# this many pooled connections where redis-py itself runs the scripts, and at most half the
# pool's cap, the rest left to admissions: redis-py refuses a command over it).
RENEW_BATCH = 128
# How long a settlement may wait for the next admission to carry it to Redis.
LINGER_S = 0.005
_MAX_CACHED_KEYS = 10_000
# Slots of admissions nobody settles are freed by retrying, this often, this many times.
_ORPHAN_RETRY_S = 0.5
_ORPHAN_TRIES = 120
_MAX_ORPHANS = 10_000
_NO_LIMITS = LimitSpec()  # a slot's release alone: no bucket touched
_EXCEEDED = {1: Limit.REQUESTS, 2: Limit.TOKENS, 3: Limit.CONCURRENCY}


class RateLimitBackendUnavailable(Exception):
    """Redis could not be reached or answered in time; the caller applies the failure policy."""


def _quota(limit: int | None, remaining: int, reset_ms: int) -> Quota | None:
    return Quota(limit, remaining, reset_ms) if limit is not None else None


class RedisRateLimiter:
    """Exact limits shared by every replica connected to one Redis."""

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "tiergate:",
        period_s: float = PERIOD_S,
        lease_s: float = 900.0,
        max_hold_s: float | None = None,
        runner: ScriptRunner | None = None,
    ) -> None:
        """``lease_s``: a slot's lease in Redis, renewed while its request runs, for at most
        ``max_hold_s`` (default ``lease_s``: never renewed)."""
        self.client = client
        self._prefix = prefix
        self._period_us = int(period_s * 1_000_000)
        self._lease_s = lease_s
        self._lease_us = int(lease_s * 1_000_000)
        self._max_hold_s = lease_s if max_hold_s is None else max(max_hold_s, lease_s)
        self._runner = runner or script_runner(client, linger_s=LINGER_S)
        self._key_names: dict[str, tuple[str, str]] = {}
        self._orphans: set[asyncio.Task[None]] = set()
        # Slots this process holds in Redis, per key id: slot -> when it was taken (monotonic).
        self._held: dict[str, dict[str, float]] = {}
        self._renewer: asyncio.Task[None] | None = None

    def _keys(self, key_id: str) -> tuple[str, str]:
        keys = self._key_names.get(key_id)
        if keys is None:
            if len(self._key_names) >= _MAX_CACHED_KEYS:
                self._key_names.clear()
            bucket = f"{self._prefix}rl:{{{key_id}}}"
            keys = self._key_names[key_id] = (bucket, bucket + ":c")
        return keys

    async def acquire(self, key_id: str, spec: LimitSpec, tokens: int, slot: str) -> Verdict:
        """Check every limit and record the request, atomically, in one round trip."""
        args = (
            spec.rpm or 0,
            spec.tpm or 0,
            self._period_us,
            tokens,
            spec.concurrency or 0,
            slot,
            self._lease_us,
        )
        try:
            reply = await self._runner.run(ACQUIRE, self._keys(key_id), args)
        except (RedisError, OSError) as exc:
            if slot and not isinstance(exc, ResponseError):
                self._free_orphan(key_id, spec, slot)  # it may run once Redis wakes up
            raise RateLimitBackendUnavailable(type(exc).__name__) from exc
        except asyncio.CancelledError:
            if slot:
                self._free_orphan(key_id, spec, slot)
            raise
        code, wait, rrem, rreset, trem, treset = (int(x) for x in reply)
        if code == 0 and slot and spec.concurrency:
            self._hold(key_id, slot)
        return Verdict(
            exceeded=_EXCEEDED.get(code),
            retry_after_ms=None if wait < 0 else wait,
            requests=_quota(spec.rpm, rrem, rreset),
            tokens=_quota(spec.tpm, trem, treset),
        )

    def _hold(self, key_id: str, slot: str) -> None:
        """Remember a slot taken, and keep its lease renewed while it is held."""
        if self._max_hold_s <= self._lease_s:
            return  # never renewed: the lease alone bounds it
        self._held.setdefault(key_id, {})[slot] = time.monotonic()
        loop = asyncio.get_running_loop()
        if self._renewer is None or self._renewer.done() or self._renewer.get_loop() is not loop:
            self._renewer = loop.create_task(self._renew_held())

    def _drop(self, key_id: str, slot: str) -> None:
        held = self._held.get(key_id)
        if held is not None and held.pop(slot, None) is not None and not held:
            del self._held[key_id]

    async def _renew_held(self) -> None:
        """Every third of a lease, start the lease of each slot still held again, so that
        only a dead process's slots run out. A slot held past ``max_hold_s`` is let go (its
        lease bounds it)."""
        while self._held:
            await asyncio.sleep(self._lease_s / 3)
            await self._renew_round()

    async def _renew_round(self) -> None:
        """Renew every held key once: one script per key (a key's slots share its hash tag,
        so each script stays on one Redis Cluster slot), ``RENEW_BATCH`` keys at once (fewer
        over a capped pool: ``_renew_batch``). On the
        pipelined connection a batch goes out in one write and costs one round trip, so a
        round's time grows with the keys over ``RENEW_BATCH``, not with one round trip per
        key. Redis not answering: the rest waits for the next round. A key whose script
        Redis refuses (an error reply: Redis answered) does not stop the others'."""
        keys, size = list(self._held), self._renew_batch()
        for start in range(0, len(keys), size):
            batch = keys[start : start + size]
            outcomes = await asyncio.gather(
                *(self._renew(key_id) for key_id in batch), return_exceptions=True
            )
            failed = False
            for outcome in outcomes:
                if isinstance(outcome, ResponseError):
                    continue  # that key's own: the next key may renew
                if isinstance(outcome, RedisError | OSError):
                    failed = True
                elif isinstance(outcome, BaseException):
                    raise outcome
            if failed:
                return

    def _renew_batch(self) -> int:
        """Keys renewed at once: ``RENEW_BATCH``, within half a capped pool."""
        cap = self._runner.connections
        return RENEW_BATCH if cap is None else max(1, min(RENEW_BATCH, cap // 2))

    async def _renew(self, key_id: str) -> None:
        held = self._held.get(key_id)
        if not held:
            return
        oldest = time.monotonic() - self._max_hold_s + self._lease_s
        for slot in [slot for slot, since in held.items() if since < oldest]:
            self._drop(key_id, slot)
        if key_id not in self._held:
            return
        slots = list(held)
        try:
            await self._runner.run(
                RENEW, self._keys(key_id)[1:], (self._lease_us, ",".join(slots)), retry=False
            )
        except (RedisError, OSError):
            for slot in self._released(key_id, slots):
                self._free_orphan(key_id, _NO_LIMITS, slot)  # the renewal may have run
            raise
        for slot in self._released(key_id, slots):
            try:
                await self._send_release(key_id, _NO_LIMITS, 0, slot, 0, lazy=False)
            except (RedisError, OSError):
                self._free_orphan(key_id, _NO_LIMITS, slot)
                raise

    def _released(self, key_id: str, slots: list[str]) -> list[str]:
        """The slots of a renewal released while it was on its way: their release may have
        reached Redis first (written while the renewal waited for a new connection; over
        redis-py's pool, on another connection), and the renewal put them back."""
        held = self._held.get(key_id, {})
        return [slot for slot in slots if slot not in held]

    def _free_orphan(self, key_id: str, spec: LimitSpec, slot: str) -> None:
        """An admission nobody will settle (its caller gave up, or Redis did not answer in
        time) may still run in Redis, and a settlement Redis did not answer may not have run:
        free the slot either may hold, so that it does not hold one of the key's concurrency
        slots for the whole lease. Its request and tokens stay charged (the safe side; they
        drain within a period)."""
        if len(self._orphans) >= _MAX_ORPHANS:
            return  # a long outage: the lease bounds what is left
        task = asyncio.get_running_loop().create_task(self._release_orphan(key_id, spec, slot))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def _release_orphan(self, key_id: str, spec: LimitSpec, slot: str) -> None:
        """``ZREM`` the slot until Redis has answered it twice: the admission may sit unread
        on a connection given up on; once a later connection's command was answered, Redis
        has read what was sent before it, so the second answered ``ZREM`` comes after it."""
        answered = 0
        for _ in range(_ORPHAN_TRIES):
            try:
                await self._send_release(key_id, spec, 0, slot, 0, lazy=answered == 0)
            except (RedisError, OSError):
                await asyncio.sleep(_ORPHAN_RETRY_S)
                continue
            answered += 1
            if answered == 2:
                return

    async def release(
        self,
        key_id: str,
        spec: LimitSpec,
        token_delta: int,
        slot: str,
        request_delta: int = 0,
        *,
        lazy: bool = False,
    ) -> None:
        """Reconcile the buckets with real usage and free the slot, in one round trip.

        ``lazy``: the command waits (up to ``LINGER_S``) for the next admission's write. When
        Redis does not answer, the slot is freed in the background once it does (as for an
        orphaned admission): otherwise it would hold one of the key's concurrency slots for
        the whole lease. The token and request deltas are not retried (a refund may have
        been applied already; a charge left out is the safe side of a refund left out).
        """
        if slot:
            self._drop(key_id, slot)  # no renewal written after this release
        try:
            await self._send_release(key_id, spec, token_delta, slot, request_delta, lazy=lazy)
        except (RedisError, OSError) as exc:
            if slot and not isinstance(exc, ResponseError):
                self._free_orphan(key_id, spec, slot)
            raise RateLimitBackendUnavailable(type(exc).__name__) from exc
        except asyncio.CancelledError:
            if slot:
                self._free_orphan(key_id, spec, slot)
            raise

    async def _send_release(
        self,
        key_id: str,
        spec: LimitSpec,
        token_delta: int,
        slot: str,
        request_delta: int,
        *,
        lazy: bool,
    ) -> None:
        """Run the release script once; RedisError / OSError when Redis does not answer."""
        args = (spec.rpm or 0, spec.tpm or 0, self._period_us, token_delta, slot, request_delta)
        # Never sent twice: a refund applied once already must not be given again.
        await self._runner.run(RELEASE, self._keys(key_id), args, lazy=lazy, retry=False)

    async def aclose(self) -> None:
        """Send the settlements still lingering, then close the pipelined connection."""
        self._held.clear()
        await stop_tasks(self._renewer)
        if self._orphans:
            _, late = await asyncio.wait(self._orphans, timeout=_ORPHAN_RETRY_S)
            await stop_tasks(*late)  # ended, not only asked once: redis-py can lose a cancel
        await self._runner.aclose()
