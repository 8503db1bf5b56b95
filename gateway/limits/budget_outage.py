"""Budgets through a Redis outage (``ratelimit.on_redis_error: open``): enforced locally, and
what was spent meanwhile written to Redis once it answers again.

While Redis is unreachable, a process lets a key spend at most its share of what was left
when it last heard from Redis: ``(budget - spent as Redis last said) / N`` per window, ``N``
being the live gateway processes (:class:`gateway.census.LocalShare`). Every charge made
while Redis could not take it (a reservation, or the settlement of any request, reserved
before the outage or during it) is added to a journal per key and window; before the next
charge goes to Redis once it answers, the journal goes first, so Redis again holds what was
spent. A process with nothing to charge pays it all the same: while anything is owed, a
background loop (:meth:`FailOpenBudgetStore.start`) probes Redis at the health's retry
interval and settles up once it answers. A charge sent whose answer never came (Redis died,
or answered after the socket timeout) may or may not have run: each charge carries this
process's increasing number and Redis keeps, per key and process, the highest that ran
(``gateway.budgets._MARK``), which settles the question once Redis answers. (The one case it
cannot: a reservation Redis refused, whose answer was lost, followed by a later charge of the
same key from the same process that ran before the crash: that refusal counts as a charge
given back.)

The bound: during an outage the fleet spends at most what the key had left at each process's
last look (divided among N), plus one request's overrun per process (a settlement above its
reservation); a process that never saw the key in Redis counts it as unspent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from redis.exceptions import RedisError

from gateway.config.redis_client import BackendHealth
from gateway.limits.budget_stores import MemoryBudgetStore, RedisBudgetStore, Windows
from gateway.pipeline.tasks import stop_tasks

_Entry = tuple[str, str, str]  # key id, day, month


class FailOpenBudgetStore:
    """A :class:`RedisBudgetStore` that keeps enforcing and counting while Redis is down."""

    def __init__(
        self,
        remote: RedisBudgetStore,
        health: BackendHealth,
        share: Callable[[], int],
    ) -> None:
        self.remote = remote
        self.health = health
        self.share = share
        self.local = MemoryBudgetStore()  # this process's spend since the outage began
        # Charges never sent to Redis, per key and windows (with the windows' TTLs).
        self.owed: dict[_Entry, tuple[float, Windows]] = {}
        # Charges sent whose answer never came: (key id, windows, amount, seq, a reserve?);
        # applied or not, Redis' marks will tell.
        self.unsure: list[tuple[str, Windows, float, int, bool]] = []
        # One settling-up at a time, and no new charge sent while one is due: a charge sent
        # after a lost one would raise the marks the lost one is judged by.
        self._settling = asyncio.Lock()
        self._repayer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the payback loop: what is owed reaches Redis once it answers, also when this
        process has no request to charge (an idle worker's debt would otherwise hide spend
        from the fleet's other processes until its next budgeted request)."""
        if self._repayer is None:
            self._repayer = asyncio.get_running_loop().create_task(
                self._repay_forever(), name="budget.payback"
            )

    async def _repay_forever(self) -> None:
        interval = max(0.01, self.health.retry_interval_s)
        while True:
            await asyncio.sleep(interval)
            if (self.owed or self.unsure) and self.health.should_try():
                try:
                    await self._settle_up()
                except (RedisError, OSError) as exc:
                    self.health.failed(type(exc).__name__)
                else:
                    self.health.succeeded()

    async def reserve(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
    ) -> tuple[str | None, float]:
        """In Redis when it answers (after what is owed to it), else against the local share."""
        if self.health.should_try():
            seq = 0
            try:
                await self._settle_up()
                seq = self.remote.next_seq()
                verdict = await self.remote.reserve(
                    key_id, windows, day_budget, month_budget, amount, seq=seq
                )
            except (RedisError, OSError) as exc:
                self.health.failed(type(exc).__name__)
                if seq:  # it may have charged Redis, besides the local reservation below
                    self.unsure.append((key_id, windows, amount, seq, True))
            else:
                self.health.succeeded()
                return verdict
        return await self._reserve_locally(key_id, windows, day_budget, month_budget, amount)

    async def _reserve_locally(
        self,
        key_id: str,
        windows: Windows,
        day_budget: float | None,
        month_budget: float | None,
        amount: float,
    ) -> tuple[str | None, float]:
        seen = self.remote.seen
        day_seen = seen.get((key_id, windows.day), 0.0)
        month_seen = seen.get((key_id, windows.month), 0.0)
        n = max(1, self.share())

        def local(budget: float | None, seen: float) -> float | None:
            return None if budget is None else max(0.0, budget - seen) / n

        refused, spent = await self.local.reserve(
            key_id, windows, local(day_budget, day_seen), local(month_budget, month_seen), amount
        )
        if refused is None:
            self._owe(key_id, windows, amount)
        base = month_seen if refused == "budget_monthly" else day_seen
        return refused, base + spent

    async def adjust(
        self, key_id: str, windows: Windows, delta: float, *, lazy: bool = True
    ) -> float | None:
        """A settlement: to Redis when it answers, else owed to it (and counted locally)."""
        if self.health.healthy:
            seq = 0
            try:
                await self._settle_up()
                seq = self.remote.next_seq()
                return await self.remote.adjust(key_id, windows, delta, lazy=lazy, seq=seq)
            except (RedisError, OSError) as exc:
                self.health.failed(type(exc).__name__)
                await self._not_answered(key_id, windows, delta, seq)
                return None
            except asyncio.CancelledError:  # the request's client left: the charge still counts
                await self._not_answered(key_id, windows, delta, seq)
                raise
        self._owe(key_id, windows, delta)
        await self.local.adjust(key_id, windows, delta)
        return None

    async def _not_answered(self, key_id: str, windows: Windows, delta: float, seq: int) -> None:
        """A settlement whose answer never came: unsure once sent (``seq``), else owed."""
        if seq:
            self.unsure.append((key_id, windows, delta, seq, False))
        else:
            self._owe(key_id, windows, delta)
        await self.local.adjust(key_id, windows, delta)

    def _owe(self, key_id: str, windows: Windows, delta: float) -> None:
        entry = (key_id, windows.day, windows.month)
        owed, _ = self.owed.get(entry, (0.0, windows))
        self.owed[entry] = (owed + delta, windows)

    async def _settle_up(self) -> None:
        """Settle with Redis first when anything is due (one caller at a time)."""
        if not self.unsure and not self.owed:
            return
        async with self._settling:
            await self._repay()

    async def _repay(self) -> None:
        """Settle with Redis. A charge whose answer was lost: Redis' marks say whether it was
        applied; a settlement that was not is owed, a reservation that was is given back (the
        request was reserved locally instead, or refused). Then what is owed is written, one
        key and window at a time (a failure keeps the rest, and makes that one unsure). Once
        all is paid the local counts start afresh."""
        while self.unsure:
            lost = self.unsure[-1]
            key_id, windows, amount, seq, reserve = lost
            applied = await self.remote.charged(key_id, seq)
            if reserve and applied:
                self._owe(key_id, windows, -amount)
            elif not reserve and not applied:
                self._owe(key_id, windows, amount)
            # This one (by its number): a request whose answer was lost meanwhile may have
            # added another at the end, to be judged in turn.
            self.unsure.remove(lost)
        while self.owed:
            entry, (delta, windows) = next(iter(self.owed.items()))
            seq = self.remote.next_seq()
            try:
                await self.remote.adjust(entry[0], windows, delta, lazy=False, seq=seq)
            except (RedisError, OSError, asyncio.CancelledError):
                # Sent, perhaps run (a cancelled caller too: the command is out): Redis' marks
                # will say; owed still, it would be paid twice.
                self.unsure.append((entry[0], windows, delta, seq, False))
                self._owe(entry[0], windows, -delta)  # now unsure instead of owed
                if self.owed[entry][0] == 0.0:
                    del self.owed[entry]
                raise
            now_owed, latest = self.owed[entry]
            if now_owed == delta:
                del self.owed[entry]
            else:  # charged again while the command was out
                self.owed[entry] = (now_owed - delta, latest)
        self.local.spent.clear()

    async def aclose(self) -> None:
        """Shutdown: stop the payback loop, pay what is still owed if Redis answers, then
        close."""
        task, self._repayer = self._repayer, None
        await stop_tasks(task)
        with contextlib.suppress(RedisError, OSError):
            await self._settle_up()
        await self.remote.aclose()
