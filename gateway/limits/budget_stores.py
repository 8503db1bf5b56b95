"""Where budget spend is kept: per key, per UTC day and calendar month (issue 17).

``MemoryBudgetStore`` serves one process; ``RedisBudgetStore`` is shared by every gateway
replica: one Lua script checks both windows and reserves, so the total charged is exact across
replicas, and a spend that Redis lost is put back from what the writers saw (the comment
below). ``gateway/limits/budgets.py`` decides what a request reserves and settles.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.limits.redis import LuaScript, ScriptRunner, script_runner

_log = structlog.get_logger("tiergate.budgets")

# Every charge carries its writer (a gateway process) and a sequence number that grows with
# each charge the writer sends; KEYS[3] holds, per writer, the highest number that charged.
# A charge whose answer was lost (Redis died) is judged by it once Redis is back: a writer's
# charges run in the order it numbered them (one connection, never retried), so one numbered
# at or below the mark ran.
# A window's spend that Redis lost (restarted empty, no persistence) is put back, before
# anything is charged, from what each process last saw spent there (its *floor*): the key
# does not get its budget again, and a refund of a reservation made before the loss does not
# take the spend below zero. (A window's key outlives its window by an hour: while the window
# runs, a missing key with a floor above zero is a loss.) The process that charges first may
# have seen little or nothing of the key (another worker or replica served it), so the
# window's record (KEYS[4] for the day, KEYS[5] for the month: a hash with its window's TTL)
# keeps the floor put back (``put``) and which writers charged since the window was
# (re)created: a writer's first charge there adds what its floor is above ``put``, once.
# A record missing beside a window present (older data) has ``put`` -1: nothing is added.
_MARK = """
local function mark(writer, seq)
  if seq <= 0 then return end
  if seq > tonumber(redis.call('HGET', KEYS[3], writer) or '0') then
    redis.call('HSET', KEYS[3], writer, seq)
  end
  redis.call('EXPIRE', KEYS[3], 172800)
end
local function restore(key, record, writer, floor, ttl)
  floor = tonumber(floor)
  if redis.call('EXISTS', key) == 0 then
    if floor > 0 then redis.call('SET', key, tostring(floor), 'EX', ttl) end
    redis.call('DEL', record)
    redis.call('HSET', record, 'put', tostring(floor), 'w:' .. writer, 1)
    redis.call('EXPIRE', record, ttl)
  elseif redis.call('HSETNX', record, 'w:' .. writer, 1) == 1 then
    local put = tonumber(redis.call('HGET', record, 'put') or '-1')
    if put < 0 then
      redis.call('HSET', record, 'put', -1)
    elseif floor > put then
      redis.call('INCRBYFLOAT', key, floor - put)
      redis.call('HSET', record, 'put', tostring(floor))
    end
    redis.call('EXPIRE', record, ttl)
  end
end
"""
# KEYS: day, month, marks, day record, month record. ARGV: day budget, month budget (-1:
# none), amount, day ttl, month ttl, writer, seq, day floor, month floor. Returns {charged
# (0/1), refused window name or '', day, month}.
_RESERVE = (
    _MARK
    + """
restore(KEYS[1], KEYS[4], ARGV[6], ARGV[8], ARGV[4])
restore(KEYS[2], KEYS[5], ARGV[6], ARGV[9], ARGV[5])
local day = tonumber(redis.call('GET', KEYS[1]) or '0')
local month = tonumber(redis.call('GET', KEYS[2]) or '0')
local reserve = tonumber(ARGV[3])
local day_budget, month_budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local writer, seq = ARGV[6], tonumber(ARGV[7])
if day_budget >= 0 and day + reserve > day_budget then
  return {0, 'daily', tostring(day), tostring(month)}
end
if month_budget >= 0 and month + reserve > month_budget then
  return {0, 'monthly', tostring(day), tostring(month)}
end
redis.call('INCRBYFLOAT', KEYS[1], reserve)
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBYFLOAT', KEYS[2], reserve)
redis.call('EXPIRE', KEYS[2], ARGV[5])
mark(writer, seq)
return {1, '', tostring(day + reserve), tostring(month + reserve)}
"""
)
_RESERVE_SCRIPT = LuaScript(_RESERVE, keys=5, args=9)
# KEYS: day, month, marks, day record, month record. ARGV: delta, day ttl, month ttl, writer,
# seq, day floor, month floor. A settlement, or spend owed since an outage (the keys may be
# gone: a Redis that lost its data); a spend never goes below zero.
_ADD = (
    _MARK
    + """
local writer, seq = ARGV[4], tonumber(ARGV[5])
local function add(key, record, floor, ttl)
  restore(key, record, writer, floor, ttl)
  local spent = redis.call('INCRBYFLOAT', key, ARGV[1])
  if tonumber(spent) < 0 then
    spent = '0'
    redis.call('SET', key, spent)
  end
  redis.call('EXPIRE', key, ttl)
  return spent
end
local day = add(KEYS[1], KEYS[4], ARGV[6], ARGV[2])
local month = add(KEYS[2], KEYS[5], ARGV[7], ARGV[3])
mark(writer, seq)
return {day, month}
"""
)
ADD_SCRIPT = LuaScript(_ADD, keys=5, args=7)
_MAX_SEEN = 100_000
LINGER_S = 0.005  # how long a settlement may wait for the next command to carry it


@dataclass(frozen=True, slots=True)
class Windows:
    """The day and month a moment falls in (UTC), their keys and seconds left."""

    day: str
    month: str
    day_left_s: int
    month_left_s: int

    @classmethod
    def at(cls, now: float) -> Windows:
        """The windows of epoch second ``now``."""
        moment = dt.datetime.fromtimestamp(now, dt.UTC)
        tomorrow = (moment + dt.timedelta(days=1)).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        first = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        next_month = (first + dt.timedelta(days=32)).replace(day=1)
        return cls(
            moment.strftime("%Y%m%d"),
            moment.strftime("%Y%m"),
            max(1, int((tomorrow - moment).total_seconds())),
            max(1, int((next_month - moment).total_seconds())),
        )


class BudgetStore(Protocol):
    """Reserve-then-settle spending per key and window."""

    async def reserve(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
    ) -> tuple[str | None, float]:
        """Reserve ``amount``; ``(None, spent_today)`` or ``(budget_name, spent)`` if refused."""
        ...

    async def adjust(
        self, key_id: str, windows: Windows, delta: float, *, lazy: bool = True
    ) -> float | None:
        """Add ``delta`` (negative: give back) to both windows; the day's spend after it
        (``None``: not known). ``lazy``: a remote store may send it with its next command."""
        ...


class MemoryBudgetStore:
    """One process's budgets (single-node setups; not shared between gateways)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    async def reserve(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
    ) -> tuple[str | None, float]:
        """Check both windows, then charge both."""
        day_key, month_key = f"{key_id}:d:{windows.day}", f"{key_id}:m:{windows.month}"
        day, month = self.spent.get(day_key, 0.0), self.spent.get(month_key, 0.0)
        if day_budget is not None and day + amount > day_budget:
            return "budget_daily", day
        if month_budget is not None and month + amount > month_budget:
            return "budget_monthly", month
        self.spent[day_key] = day + amount
        self.spent[month_key] = month + amount
        return None, day + amount

    async def adjust(
        self, key_id: str, windows: Windows, delta: float, *, lazy: bool = True
    ) -> float | None:
        """Apply a settlement; the day's spend after it."""
        for key in (f"{key_id}:d:{windows.day}", f"{key_id}:m:{windows.month}"):
            self.spent[key] = self.spent.get(key, 0.0) + delta
        return self.spent[f"{key_id}:d:{windows.day}"]


class RedisBudgetStore:
    """Budgets shared by every gateway replica (hash-tagged keys: Redis Cluster safe).

    Commands go over the limiter's kind of pipelined connection (gateway/limits/redis.py);
    a settlement is lazy: it rides on the next command, or goes alone after ``LINGER_S``.
    """

    def __init__(self, client: Redis, prefix: str, *, runner: ScriptRunner | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self._runner = runner or script_runner(client, linger_s=LINGER_S)
        self._orphans: set[asyncio.Task[None]] = set()
        # This process's charges are numbered: whether a lost one ran is known after (_MARK).
        self.writer = secrets.token_hex(8)
        self._seq = itertools.count(1)
        # (key id, day) -> day spend and (key id, month) -> month spend as Redis last said:
        # what a replica enforces against while Redis is unreachable
        # (gateway/limits/budget_outage.py). The month has its own entry, so an outage that
        # crosses midnight still knows what the month spent.
        self.seen: dict[tuple[str, str], float] = {}

    def _saw(self, key_id: str, windows: Windows, day: float, month: float) -> None:
        if len(self.seen) >= _MAX_SEEN:
            self.seen.clear()
        self.seen[(key_id, windows.day)] = day
        self.seen[(key_id, windows.month)] = month

    def _floors(self, key_id: str, windows: Windows) -> tuple[float, float]:
        """The day's and the month's spend as Redis last told this process (0: never)."""
        seen = self.seen
        return seen.get((key_id, windows.day), 0.0), seen.get((key_id, windows.month), 0.0)

    def _keys(self, key_id: str, windows: Windows) -> list[str]:
        base = f"{self.prefix}budget:{{{key_id}}}"
        day, month = f"{base}:d:{windows.day}", f"{base}:m:{windows.month}"
        records = f"{base}:rd:{windows.day}", f"{base}:rm:{windows.month}"
        return [day, month, f"{base}:w", *records]

    def next_seq(self) -> int:
        """A number for this process's next charge (higher than every earlier one)."""
        return next(self._seq)

    async def charged(self, key_id: str, seq: int) -> bool:
        """Whether this process's charge ``seq`` on ``key_id`` was applied (its answer may
        have been lost); raises RedisError / OSError when Redis does not answer."""
        marks = f"{self.prefix}budget:{{{key_id}}}:w"
        top = await self._runner.command("HGET", marks, self.writer)
        return top is not None and int(top) >= seq

    async def reserve(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
        *,
        seq: int = 0,
    ) -> tuple[str | None, float]:
        """One script: check both windows and charge both, atomically (``seq``: the charge's
        number, :meth:`next_seq`; 0: a new one).

        A caller that gives up (cancelled) while the script may run gets its charge given back
        once Redis answers: a reservation nobody holds would stay spent for the whole window.
        """
        call = asyncio.ensure_future(
            self._runner.run(
                _RESERVE_SCRIPT,
                self._keys(key_id, windows),
                (
                    -1 if day_budget is None else day_budget,
                    -1 if month_budget is None else month_budget,
                    amount,
                    windows.day_left_s + 3600,
                    windows.month_left_s + 86400,
                    self.writer,
                    seq or self.next_seq(),
                    *self._floors(key_id, windows),
                ),
                retry=False,  # never after a later charge: the marks would say it ran
            )
        )
        try:
            result = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._give_back(done, key_id, windows, amount))
            raise
        day, month = float(result[2]), float(result[3])
        self._saw(key_id, windows, day, month)
        if int(result[0]) == 1:
            return None, day
        which = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        return f"budget_{which}", day if which == "daily" else month

    async def adjust(
        self, key_id: str, windows: Windows, delta: float, *, lazy: bool = True, seq: int = 0
    ) -> float | None:
        """Add ``delta`` to both windows (recreating them if Redis lost them), sent with the
        next command when ``lazy``; the day's spend after it. ``seq`` as for ``reserve``;
        raises RedisError / OSError when Redis does not answer."""
        keys = self._keys(key_id, windows)
        args = (
            delta,
            windows.day_left_s + 3600,
            windows.month_left_s + 86400,
            self.writer,
            seq or self.next_seq(),
            *self._floors(key_id, windows),
        )
        day, month = await self._runner.run(ADD_SCRIPT, keys, args, lazy=lazy, retry=False)
        self._saw(key_id, windows, float(day), float(month))
        return float(day)

    def _give_back(
        self, done: asyncio.Future[Any], key_id: str, windows: Windows, amount: float
    ) -> None:
        """An orphaned reservation's reply: refund it if it was charged."""
        if done.cancelled() or done.exception() is not None or int(done.result()[0]) != 1:
            return
        task = asyncio.get_running_loop().create_task(self._refund_quietly(key_id, windows, amount))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def _refund_quietly(self, key_id: str, windows: Windows, amount: float) -> None:
        try:
            await self.adjust(key_id, windows, -amount)
        except (RedisError, OSError):
            _log.warning("budget.settle_failed", key_id=key_id)

    async def aclose(self) -> None:
        """Send the settlements still held back; close the pipelined connection."""
        if self._orphans:
            await asyncio.gather(*self._orphans, return_exceptions=True)
        await self._runner.aclose()
