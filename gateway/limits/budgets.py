"""Compute budgets: per-key cost quotas per UTC day and calendar month (issue 17).

A request reserves its worst-case cost on the tier it was routed to (its prompt estimate and
its completion cap, priced by ``policies/cost.py``) before it is forwarded, and settles with
the real usage priced on the tier that served it. A key whose reservation does not fit gets a
429 naming the budget, with ``Retry-After`` until the window turns. The Redis store checks
and reserves in one Lua script, so several gateways share one exact budget: the total charged
never exceeds the budget plus the reservations in flight when it ran out (and the amount by
which real prompts exceeded their estimate). Keys without a budget cost nothing here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.limits.limits import KeyRateLimited
from gateway.limits.redis import LuaScript, ScriptRunner, script_runner
from gateway.pipeline.context import RequestContext
from policies.cost import CostModel, TierPrice
from policies.ports import Admission
from policies.principal import Principal

_log = structlog.get_logger("tiergate.budgets")
_RESERVE = """
local day = tonumber(redis.call('GET', KEYS[1]) or '0')
local month = tonumber(redis.call('GET', KEYS[2]) or '0')
local reserve = tonumber(ARGV[3])
local day_budget, month_budget = tonumber(ARGV[1]), tonumber(ARGV[2])
if day_budget >= 0 and day + reserve > day_budget then return {0, 'daily', tostring(day)} end
if month_budget >= 0 and month + reserve > month_budget then
  return {0, 'monthly', tostring(month)}
end
redis.call('INCRBYFLOAT', KEYS[1], reserve)
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBYFLOAT', KEYS[2], reserve)
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {1, tostring(day + reserve), tostring(month + reserve)}
"""
_RESERVE_SCRIPT = LuaScript(_RESERVE, keys=2, args=5)
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

    async def adjust(self, key_id: str, windows: Windows, delta: float) -> None:
        """Add ``delta`` (negative: give back) to both windows."""
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

    async def adjust(self, key_id: str, windows: Windows, delta: float) -> None:
        """Apply a settlement."""
        for key in (f"{key_id}:d:{windows.day}", f"{key_id}:m:{windows.month}"):
            self.spent[key] = self.spent.get(key, 0.0) + delta


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

    def _keys(self, key_id: str, windows: Windows) -> list[str]:
        base = f"{self.prefix}budget:{{{key_id}}}"
        return [f"{base}:d:{windows.day}", f"{base}:m:{windows.month}"]

    async def reserve(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
    ) -> tuple[str | None, float]:
        """One script: check both windows and charge both, atomically.

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
                ),
            )
        )
        try:
            result = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._give_back(done, key_id, windows, amount))
            raise
        if int(result[0]) == 1:
            return None, float(result[1])
        return f"budget_{result[1].decode() if isinstance(result[1], bytes) else result[1]}", float(
            result[2]
        )

    async def adjust(self, key_id: str, windows: Windows, delta: float) -> None:
        """Both windows, sent with the next command (lazy); returns once Redis applied both."""
        await asyncio.gather(
            *(
                self._runner.command("INCRBYFLOAT", key, delta, lazy=True, retry=False)
                for key in self._keys(key_id, windows)
            )
        )

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
    settled: bool = False

    async def settle(self, ctx: RequestContext) -> None:
        """Charge the real cost on the tier that served (nothing when nothing was served)."""
        usage, tier = ctx.usage, ctx.tier
        actual = 0.0
        if usage is not None and tier is not None:
            actual = self.gate.costs.cost(tier, usage.prompt_tokens, usage.completion_tokens)
        await self._charge(actual)

    async def refund(self) -> None:
        """Nothing was forwarded: give the whole reservation back."""
        await self._charge(0.0)

    async def _charge(self, actual: float) -> None:
        if self.settled:
            return
        self.settled = True
        delta = actual - self.reserved
        if delta:
            try:
                await self.gate.store.adjust(self.principal.key_id, self.windows, delta)
            except (RedisError, OSError):
                _log.warning("budget.settle_failed", key_id=self.principal.key_id)


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

    async def reserve(
        self, principal: Principal, tiers: Sequence[str], prompt_tokens: int, completion_tokens: int
    ) -> BudgetReservation | None:
        """``None`` for keys without budgets; raises a 429 when the reservation does not fit.

        The reservation is priced on the dearest of ``tiers`` (the routed tier and its
        fallbacks), so a fallback to a dearer tier never charges more than was reserved.
        """
        policy = principal.policy
        if policy.budget_daily is None and policy.budget_monthly is None:
            return None
        windows = Windows.at(self.clock())
        amount = max(self.costs.cost(t, prompt_tokens, completion_tokens) for t in tiers)
        try:
            refused, spent = await self.store.reserve(
                principal.key_id, windows, policy.budget_daily, policy.budget_monthly, amount
            )
        except (RedisError, OSError):
            if self.fail_open:
                _log.warning("budget.store_unavailable", key_id=principal.key_id)
                return None
            raise
        if refused is not None:
            limit = policy.budget_daily if refused == "budget_daily" else policy.budget_monthly
            wait = windows.day_left_s if refused == "budget_daily" else windows.month_left_s
            raise KeyRateLimited(
                f"This key's {refused.split('_')[1]} compute budget of {limit:g} is spent "
                f"({spent:.4g} used; this request needs up to {amount:.4g}).",
                limit=refused,
                headers={"Retry-After": str(wait), **_headers(policy.budget_daily, spent, windows)},
            )
        return BudgetReservation(
            self, principal, windows, amount, _headers(policy.budget_daily, spent, windows)
        )


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
    def headers(self) -> Mapping[str, str]:
        """Both sets of ``x-ratelimit-*`` headers."""
        return {**self.admission.headers, **self.reservation.headers}

    async def settle(self, used_tokens: int | None) -> None:
        """Settle the limits with the tokens, the budget with their cost on the serving tier."""
        await self.admission.settle(used_tokens)
        await self.reservation.settle(self.ctx)

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
    tiers: Sequence[str],
    prompt_tokens: int,
    completion_tokens: int,
) -> Admission:
    """Reserve the request's worst-case cost; on a 429 give the rate-limit admission back."""
    try:
        reservation = await gate.reserve(principal, tiers, prompt_tokens, completion_tokens)
    except BaseException:
        await admission.withdraw()
        raise
    return admission if reservation is None else BudgetedAdmission(admission, reservation, ctx)
