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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from redis.exceptions import RedisError

from gateway.limits.budget_stores import BudgetStore, Windows
from gateway.limits.limits import NO_RETRY, KeyRateLimited
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
