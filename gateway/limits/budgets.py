"""Compute budgets: per-key cost quotas per UTC day and calendar month (issue 17).

A request reserves its worst-case cost (its prompt estimate and its completion cap, priced by
``policies/cost.py`` on the dearest tier it may be served on, fallbacks included; the routed
tier alone when that does not fit) before it is forwarded, and settles with
the real usage priced on the tier that served it. A key whose reservation does not fit gets a
429 naming the budget, with ``Retry-After`` until the window turns. The Redis store checks
and reserves in one Lua script, so several gateways share one exact budget: the total charged
never exceeds the budget plus the reservations in flight when it ran out (and the amount by
which real prompts exceeded their estimate). Keys without a budget cost nothing here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.limits.limits import NO_RETRY, KeyRateLimited
from gateway.limits.redis import LuaScript, ScriptRunner, script_runner
from gateway.pipeline.context import RequestContext
from policies.cost import CostModel, TierPrice
from policies.ports import Admission
from policies.principal import KeyPolicy, Principal

_log = structlog.get_logger("tiergate.budgets")


class BudgetSpent(KeyRateLimited):
    """A 429 for a spent budget, in OpenAI's words for a spent quota (``insufficient_quota``),
    so a caller tells it from a rate limit that a slower pace would cure."""

    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


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


@dataclass(slots=True)
class BudgetReservation:
    """What a request reserved; settled once with the real usage."""

    gate: BudgetGate
    principal: Principal
    windows: Windows
    reserved: float
    headers: dict[str, str] = field(default_factory=dict)
    # The tiers it may be served on: those the reservation pays for (BudgetGate.reserve).
    tiers: tuple[str, ...] = ()
    settled: bool = False

    async def settle(self, ctx: RequestContext) -> None:
        """Charge the real cost on the tier that served (nothing when nothing was served);
        at once, so that the remaining-budget header can show the settled spend."""
        usage, tier = ctx.usage, ctx.tier
        actual = 0.0
        if usage is not None and tier is not None:
            actual = self.gate.costs.cost(tier, usage.prompt_tokens, usage.completion_tokens)
        await self._charge(actual, lazy=False)

    async def refund(self) -> None:
        """Nothing was forwarded: give the whole reservation back."""
        await self._charge(0.0, lazy=True)

    async def _charge(self, actual: float, *, lazy: bool) -> None:
        if self.settled:
            return
        self.settled = True
        delta = actual - self.reserved
        if not delta:
            return
        try:
            spent = await self.gate.store.adjust(
                self.principal.key_id, self.windows, delta, lazy=lazy
            )
        except (RedisError, OSError):
            _log.warning("budget.settle_failed", key_id=self.principal.key_id)
            return
        if spent is not None and self.headers:
            self.headers.update(_headers(self.principal.policy.budget_daily, spent, self.windows))


class BudgetGate:
    """Reserves a request's worst-case cost against its key's budgets."""

    def __init__(
        self,
        store: BudgetStore,
        costs: CostModel,
        *,
        fail_open: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.costs = costs
        self.fail_open = fail_open
        self.clock = clock or time.time

    def final_refusal(
        self, principal: Principal, tiers: Sequence[str], prompt_tokens: int, completion_tokens: int
    ) -> BudgetSpent | None:
        """The 429 for a request dearer than its key's whole daily or monthly budget on every
        one of ``tiers`` (those it may still be routed to): no wait cures it
        (``x-should-retry: false``; ``Retry-After`` until the window turns, as every budget
        429). Arithmetic only, no store: the pipeline asks before it awaits the rate limits'
        verdict, so this verdict wins whichever limit refuses first."""
        policy = principal.policy
        if policy.budget_daily is None and policy.budget_monthly is None:
            return None
        amount = min(self.costs.cost(tier, prompt_tokens, completion_tokens) for tier in tiers)
        for window, cap in (("daily", policy.budget_daily), ("monthly", policy.budget_monthly)):
            if cap is not None and amount > cap:
                return BudgetSpent(
                    f"This request needs up to {amount:.4g} of compute, more than this key's "
                    f"whole {window} compute budget of {cap:g}: it can never fit. "
                    "Lower max_tokens.",
                    limit=f"budget_{window}",
                    headers={"Retry-After": str(_left_s(window, self.clock())), **NO_RETRY},
                )
        return None

    async def reserve(
        self,
        principal: Principal,
        tiers: Sequence[str],
        prompt_tokens: int,
        completion_tokens: int,
        *,
        movable: Sequence[str] = (),
    ) -> BudgetReservation | None:
        """``None`` for keys without budgets; raises a 429 when the reservation does not fit.

        ``tiers``: the routed tier, then its fallbacks. The reservation is the worst case over
        them (a fallback to a dearer tier is paid for before it may answer), in one round trip.
        When that does not fit, the fallbacks dearer than the routed tier are dropped and the
        routed tier's price is tried (a second round trip, on this refusal only): a request
        that fits on its routed tier is served there (``reservation.tiers``), never refused
        because a fallback would not fit. ``movable``: tiers a later try of the same request
        may be routed to instead (the fast tier a precise-share cap moves it to): a refusal
        is final (``x-should-retry: false``) only when it is dearer than a whole budget there
        too.
        """
        policy = principal.policy
        if policy.budget_daily is None and policy.budget_monthly is None:
            return None
        windows = Windows.at(self.clock())
        prices = [self.costs.cost(tier, prompt_tokens, completion_tokens) for tier in tiers]
        amount = max(prices)
        try:
            refused, spent = await self.store.reserve(
                principal.key_id, windows, policy.budget_daily, policy.budget_monthly, amount
            )
            if refused is not None and prices[0] < amount:
                tiers = [
                    tier for tier, price in zip(tiers, prices, strict=True) if price <= prices[0]
                ]
                amount = prices[0]
                refused, spent = await self.store.reserve(
                    principal.key_id, windows, policy.budget_daily, policy.budget_monthly, amount
                )
        except (RedisError, OSError):
            if self.fail_open:
                _log.warning("budget.store_unavailable", key_id=principal.key_id)
                return None
            raise
        if refused is not None:
            others = [self.costs.cost(t, prompt_tokens, completion_tokens) for t in movable]
            raise _refusal(policy, refused, spent, amount, windows, least=min([amount, *others]))
        headers = _headers(policy.budget_daily, spent, windows)
        return BudgetReservation(self, principal, windows, amount, headers, tiers=tuple(tiers))


def _refusal(
    policy: KeyPolicy, refused: str, spent: float, amount: float, windows: Windows, *, least: float
) -> BudgetSpent:
    """The 429 for a reservation of ``amount`` that the ``refused`` window could not take;
    final when even ``least`` (its price on the cheapest tier a later try may get) never fits."""
    limit = policy.budget_daily if refused == "budget_daily" else policy.budget_monthly
    wait = windows.day_left_s if refused == "budget_daily" else windows.month_left_s
    headers = {"Retry-After": str(wait), **_headers(policy.budget_daily, spent, windows)}
    whole = (policy.budget_daily, policy.budget_monthly)
    if any(cap is not None and least > cap for cap in whole):  # never fits: either
        headers.update(NO_RETRY)  # window may refuse first, the other never admits it
    return BudgetSpent(
        f"This key's {refused.split('_')[1]} compute budget of {limit:g} is spent "
        f"({spent:.4g} used; this request needs up to {amount:.4g}).",
        limit=refused,
        headers=headers,
    )


def _left_s(window: str, now: float) -> int:
    """Seconds until the ``daily`` or ``monthly`` window turns."""
    windows = Windows.at(now)
    return windows.day_left_s if window == "daily" else windows.month_left_s


def _headers(day_budget: float | None, spent_today: float, windows: Windows) -> dict[str, str]:
    if day_budget is None:
        return {}
    return {
        "x-ratelimit-limit-budget": f"{day_budget:g}",
        "x-ratelimit-remaining-budget": f"{max(0.0, day_budget - spent_today):.6g}",
        "x-ratelimit-reset-budget": f"{windows.day_left_s}s",
    }


def cost_model(prices: Mapping[str, tuple[float, float]], baseline: str) -> CostModel:
    """A cost model from (input, output) prices per 1k tokens."""
    return CostModel({tier: TierPrice(*p) for tier, p in prices.items()}, baseline)


@dataclass(slots=True)
class BudgetedAdmission:
    """The rate-limit admission and the budget reservation, settled together."""

    admission: Admission
    reservation: BudgetReservation
    ctx: RequestContext

    @property
    def settles(self) -> bool:
        """A budget reservation is always settled."""
        return True

    @property
    def settle_first(self) -> bool:
        """Settled before the answer's last byte: its remaining-budget header shows the
        settled spend (on a whole answer; a stream's headers leave before its usage is known)."""
        return True

    @property
    def headers(self) -> Mapping[str, str]:
        """Both sets of ``x-ratelimit-*`` headers."""
        return {**self.admission.headers, **self.reservation.headers}

    async def settle(self, used_tokens: int | None) -> None:
        """Settle the limits with the tokens, the budget with their cost on the serving tier
        (both at once: two round trips in parallel)."""
        await asyncio.gather(self.admission.settle(used_tokens), self.reservation.settle(self.ctx))

    async def withdraw(self) -> None:
        """Refused before forwarding: the limits and the whole reservation go back."""
        await self.admission.withdraw()
        await self.reservation.refund()


async def with_budget(
    gate: BudgetGate,
    admission: Admission,
    ctx: RequestContext,
    *,
    principal: Principal,
    tiers: tuple[str, ...],
    prompt_tokens: int,
    completion_tokens: int,
    movable: Sequence[str] = (),
) -> tuple[Admission, tuple[str, ...]]:
    """Reserve the request's worst-case cost; on a 429 give the rate-limit admission back.
    The admission, and the tiers the request may be served on (the budget may drop a dearer
    fallback it cannot pay for)."""
    try:
        reservation = await gate.reserve(
            principal, tiers, prompt_tokens, completion_tokens, movable=movable
        )
    except BaseException:
        await admission.withdraw()
        raise
    if reservation is None:
        return admission, tiers
    return BudgetedAdmission(admission, reservation, ctx), reservation.tiers
