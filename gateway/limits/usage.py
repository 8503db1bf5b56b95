"""Tokens, cost and savings per tier, tenant and key, by hour (issue 17: savings you can see).

Every finished request with known usage is priced on the tier that served it and against the
all-precise baseline (``policies/cost.py``). Totals are kept per UTC hour, tier, tenant and
key id: in memory for a single gateway, and in Redis hashes (one per hour, written in batches
off the request path) when the rate limiter uses Redis, so ``GET /admin/usage`` on any replica
sees every replica's traffic. Prometheus counters per tier come from this process's totals.

Shadow answers and judge calls (``gateway/routing/shadow.py``) are compute the gateway spent
on its own account: they are kept under :data:`SHADOW_TENANT`, a tenant no key can have (a
key's tenant has at least one character: ``policies/keys.py``), with the purpose in the key id
slot (ids no key can have either), reported in a ``shadow`` block beside the callers' rows and
added to the totals, with an all-precise baseline of 0 (sending everything to precise would
shadow nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextvars import Context
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
import structlog
from litestar import Request, Response, get
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.access.admin_keys import AdminGuard, authorization
from gateway.pipeline.context import RequestContext
from gateway.pipeline.events import Usage
from gateway.pipeline.tasks import stop_tasks
from policies.cost import CostModel
from policies.errors import InvalidRequest, TierGateError

_encoder = msgspec.json.Encoder()
_log = structlog.get_logger("tiergate.usage")
FIELDS = ("requests", "input_tokens", "output_tokens", "cost", "baseline_cost")
WINDOWS = {"1h": 1, "24h": 24, "7d": 24 * 7, "30d": 24 * 30}
GROUPINGS = ("tier", "tenant", "key")
RowKey = tuple[str, str, str]  # tier, tenant, key id
_K = TypeVar("_K")
# Shadow evaluation's own spend: no key's tenant is empty, and no key id has a "-" (its ids
# are [a-z0-9_]; the development principal's "auth-disabled" has another tenant).
SHADOW_TENANT = ""
SHADOW_PURPOSES = {"answer": "shadow-answer", "judge": "shadow-judge"}  # purpose -> key id
_PURPOSE_OF = {key_id: purpose for purpose, key_id in SHADOW_PURPOSES.items()}

_FLUSH_WAIT_S = 10.0  # at stop, the longest wait for the flush in progress past its interval
_HOUR_TTL_S = 32 * 86400
_BATCH_ROWS = 1000  # rows per script: 5,000 increments, a few ms of Redis' time
# KEYS: this store's mark (the number of the last batch Redis counted from it), then one hash
# per hour. ARGV: the batch's number, the TTL of the mark and the hashes, then per hash the
# number of field/increment values that follow, and those values. A batch counts once: batches
# go out one at a time, in order, so one not above the mark was counted already. The mark
# lives as long as the hashes: a batch may wait as long as Redis is out of reach. An increment
# Redis refuses (its field holds text, its key is not a hash: written by something else) does
# not stop the script, which would leave the rest of a batch already marked uncounted: it is
# skipped, and the answer lists each one ("hour-key field"), for the error log.
_APPLY_ONCE = """
if tonumber(ARGV[1]) <= tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local refused = {}
local at = 3
for k = 2, #KEYS do
  local n = tonumber(ARGV[at])
  for i = at + 1, at + n, 2 do
    local done = redis.pcall('HINCRBYFLOAT', KEYS[k], ARGV[i], ARGV[i + 1])
    if type(done) == 'table' and done.err then
      refused[#refused + 1] = KEYS[k] .. ' ' .. ARGV[i]
    end
  end
  redis.pcall('EXPIRE', KEYS[k], ARGV[2])
  at = at + n + 1
end
return refused
"""
_NAMED_REFUSALS = 20  # at most this many refused increments named in the log line


def hour_of(now: float) -> int:
    """The UTC hour (hours since the epoch) of epoch second ``now``."""
    return int(now // 3600)


class UsageStore(Protocol):
    """Where hourly totals live."""

    def add(self, hour: int, key: RowKey, values: tuple[float, ...]) -> None:
        """Add one request's values (``FIELDS`` order) to ``hour``'s totals."""
        ...

    async def rows(self, hours: range) -> dict[RowKey, list[float]]:
        """Totals over ``hours``, per (tier, tenant, key)."""
        ...


class MemoryUsageStore:
    """Hourly totals in this process, 31 days kept."""

    def __init__(self) -> None:
        self.hours: dict[int, dict[RowKey, list[float]]] = {}

    def add(self, hour: int, key: RowKey, values: tuple[float, ...]) -> None:
        """Accumulate; drop hours older than 31 days."""
        bucket = self.hours.get(hour)
        if bucket is None:
            bucket = self.hours[hour] = {}
            for old in [h for h in self.hours if h < hour - 24 * 31]:
                del self.hours[old]
        totals = bucket.get(key)
        if totals is None:
            bucket[key] = list(values)
        else:
            for index, value in enumerate(values):
                totals[index] += value

    async def rows(self, hours: range) -> dict[RowKey, list[float]]:
        """Sum the hours asked for."""
        out: dict[RowKey, list[float]] = {}
        for hour in hours:
            for key, values in self.hours.get(hour, {}).items():
                _add_into(out, key, values)
        return out


@dataclass
class _Batch:
    """Totals sent to Redis together, under one number (this store's batches count up)."""

    number: int
    hours: dict[int, dict[RowKey, list[float]]]


class RedisUsageStore:
    """Hourly totals shared by every gateway: one hash per hour, flushed once a second."""

    def __init__(self, client: Redis, prefix: str, flush_s: float = 1.0) -> None:
        self.client = client
        self.prefix = prefix
        self.flush_s = flush_s
        self.pending = MemoryUsageStore()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._unsure: _Batch | None = None  # sent, not answered: counted by Redis or not
        self._mark = f"{prefix}usage-sent:{secrets.token_hex(8)}"
        self._numbered = 0
        self._lock = asyncio.Lock()
        # One list per report being read, under a token of its own (lists that hold the same
        # batches are equal, so a list cannot name its report): the batches Redis confirms
        # while the read is out.
        self._readers: dict[object, list[_Batch]] = {}

    def add(self, hour: int, key: RowKey, values: tuple[float, ...]) -> None:
        """Buffer in memory; the flusher sends it. A value that is not a finite number is
        sent as 0 (Redis would refuse it halfway through a batch)."""
        if not all(math.isfinite(value) for value in values):
            _log.warning("usage.not_finite", tier=key[0], tenant=key[1], key_id=key[2])
            values = tuple(value if math.isfinite(value) else 0.0 for value in values)
        self.pending.add(hour, key, values)

    def start(self) -> None:
        """Start the flusher (at start-up; again after ``stop``, in this loop or another)."""
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(
            self._flush_forever(), context=Context()
        )

    async def stop(self) -> None:
        """Let the flusher finish the flush it is in (a cancelled write would leave totals
        that Redis may or may not have counted), then flush what is left; totals Redis still
        has not confirmed are summed in one ``usage.unsent_at_stop`` error, also when the stop
        is cancelled (they may be counted already: a batch whose answer did not come is among
        them)."""
        task, self._task = self._task, None
        try:
            if task is not None:
                self._stopping.set()
                await asyncio.wait({task}, timeout=self.flush_s + _FLUSH_WAIT_S)
                await stop_tasks(task)
            await self.flush()
        finally:  # said also when the stop itself is cut short
            self._say_unsent()

    def _say_unsent(self) -> None:
        """One ``usage.unsent_at_stop`` error summing the totals Redis has not confirmed."""
        left: dict[tuple[int, RowKey], list[float]] = {}
        for by_hour in (self.pending.hours, {} if self._unsure is None else self._unsure.hours):
            for hour, bucket in by_hour.items():
                for key, values in bucket.items():
                    _add_into(left, (hour, key), values)
        if left:  # Redis out of reach at the end: say what this process's report loses
            sums = [sum(values[i] for values in left.values()) for i in range(len(FIELDS))]
            _log.error(
                "usage.unsent_at_stop", rows=len(left), **dict(zip(FIELDS, sums, strict=True))
            )

    async def _flush_forever(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_s):
                    await self._stopping.wait()
            await self.flush()

    async def flush(self) -> None:
        """Send the buffered totals in batches of at most ``_BATCH_ROWS`` rows, one at a time.
        A batch whose answer did not come (Redis down, a timeout, the flusher stopped) may
        have been counted or not: it is kept and sent again as it is, under its number,
        before anything newer; Redis counts a number once."""
        async with self._lock:
            while True:
                if self._unsure is None:
                    if not self.pending.hours:
                        return
                    self._numbered += 1
                    self._unsure = _Batch(self._numbered, self._take(_BATCH_ROWS))
                if not await self._send(self._unsure):
                    return
                for landed in self._readers.values():
                    landed.append(self._unsure)
                self._unsure = None

    def _take(self, limit: int) -> dict[int, dict[RowKey, list[float]]]:
        """Move up to ``limit`` rows out of ``pending``."""
        taken: dict[int, dict[RowKey, list[float]]] = {}
        count = 0
        for hour in list(self.pending.hours):
            bucket = self.pending.hours[hour]
            while bucket and count < limit:
                key = next(iter(bucket))
                taken.setdefault(hour, {})[key] = bucket.pop(key)
                count += 1
            if not bucket:
                del self.pending.hours[hour]
            if count >= limit:
                break
        return taken

    async def _send(self, batch: _Batch) -> bool:
        """Apply ``batch`` once (a repeat of a batch already counted does nothing)."""
        keys = [self._mark]
        args: list[str | float | int] = [batch.number, _HOUR_TTL_S]
        for hour, bucket in batch.hours.items():
            keys.append(f"{self.prefix}usage:{hour}")
            args.append(len(bucket) * len(FIELDS) * 2)
            for (tier, tenant, key_id), values in bucket.items():
                for field_name, value in zip(FIELDS, values, strict=True):
                    args += (f"{tier}|{tenant}|{key_id}|{field_name}", value)
        try:
            refused = await self.client.eval(_APPLY_ONCE, len(keys), *keys, *args)
        except (RedisError, OSError) as exc:
            _log.warning("usage.flush_failed", error=type(exc).__name__)
            return False
        if isinstance(refused, list) and refused:
            named = [r.decode() if isinstance(r, bytes) else str(r) for r in refused]
            _log.error(
                "usage.increments_refused", count=len(refused), first=named[:_NAMED_REFUSALS]
            )
        return True

    async def rows(self, hours: range) -> dict[RowKey, list[float]]:
        """Read and sum the hourly hashes, then add what this process holds that Redis had not
        counted when it answered: the mark read with the hashes numbers the last batch they
        include, so the rows not flushed yet and any batch above the mark (the one still
        unanswered, or one confirmed while the read was out) are added; a batch that landed
        before the read is counted once, from Redis."""
        landed: list[_Batch] = []
        reader = object()
        self._readers[reader] = landed
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self._mark)
                for hour in hours:
                    pipe.hgetall(f"{self.prefix}usage:{hour}")
                counted, *answers = await pipe.execute()
        finally:
            del self._readers[reader]
        # From here to the return nothing awaits, so the flusher cannot move rows meanwhile.
        out: dict[RowKey, list[float]] = {}
        mark = int(counted or 0)
        held = [self.pending.hours, *(b.hours for b in landed if b.number > mark)]
        if self._unsure is not None and self._unsure.number > mark:
            held.append(self._unsure.hours)
        for by_hour in held:
            for hour in hours:
                for key, values in by_hour.get(hour, {}).items():
                    _add_into(out, key, values)
        for answer in answers:
            for raw_field, raw_value in answer.items():
                name = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
                # A tier has no "|" (settings), nor a key id or field; a tenant may.
                tier, rest = name.split("|", 1)
                tenant, key_id, metric = rest.rsplit("|", 2)
                totals = out.setdefault((tier, tenant, key_id), [0.0] * len(FIELDS))
                totals[FIELDS.index(metric)] += float(raw_value)
        return out


def _add_into(out: dict[_K, list[float]], key: _K, values: list[float]) -> None:
    totals = out.setdefault(key, [0.0] * len(FIELDS))
    for index, value in enumerate(values):
        totals[index] += value


@dataclass
class UsageLedger:
    """Prices finished requests and keeps their totals."""

    costs: CostModel
    store: UsageStore

    def __post_init__(self) -> None:
        self.per_tier: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(FIELDS))
        self.shadow_per_tier: dict[tuple[str, str], list[float]] = defaultdict(
            lambda: [0.0] * len(FIELDS)
        )

    def record(self, ctx: RequestContext) -> None:
        """Add one finished request (those without usage or tier cost nothing)."""
        usage, tier, principal = ctx.usage, ctx.tier, ctx.principal
        if usage is None or tier is None or principal is None:
            return
        cost = self.costs.cost(tier, usage.prompt_tokens, usage.completion_tokens)
        baseline = self.costs.baseline(usage.prompt_tokens, usage.completion_tokens)
        values = (1.0, float(usage.prompt_tokens), float(usage.completion_tokens), cost, baseline)
        self.store.add(hour_of(time.time()), (tier, principal.tenant, principal.key_id), values)
        totals = self.per_tier[tier]
        for index, value in enumerate(values):
            totals[index] += value

    def record_shadow(self, tier: str, purpose: str, usage: Usage) -> None:
        """Add one shadow answer or judge call (``purpose``: a key of ``SHADOW_PURPOSES``)
        served by ``tier``: priced on ``tier``, billed to no tenant, no baseline."""
        cost = self.costs.cost(tier, usage.prompt_tokens, usage.completion_tokens)
        values = (1.0, float(usage.prompt_tokens), float(usage.completion_tokens), cost, 0.0)
        key = (tier, SHADOW_TENANT, SHADOW_PURPOSES[purpose])
        self.store.add(hour_of(time.time()), key, values)
        totals = self.shadow_per_tier[tier, purpose]
        for index, value in enumerate(values):
            totals[index] += value

    async def view(self, window: str, by: str) -> dict[str, Any]:
        """Totals over ``window`` grouped ``by`` tier, tenant or key, with savings; shadow
        evaluation's spend apart (``shadow``, by tier and purpose) and in ``total``."""
        now_hour = hour_of(time.time())
        rows = await self.store.rows(range(now_hour - WINDOWS[window] + 1, now_hour + 1))
        grouped: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * len(FIELDS))
        shadows: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0] * len(FIELDS))
        for (tier, tenant, key_id), values in rows.items():
            purpose = _PURPOSE_OF.get(key_id) if tenant == SHADOW_TENANT else None
            if purpose is not None:
                _add_into(shadows, (tier, purpose), values)
                continue
            group = {"tier": (tier,), "tenant": (tenant, tier), "key": (key_id, tenant, tier)}[by]
            _add_into(grouped, group, values)
        labels = {
            "tier": ("tier",),
            "tenant": ("tenant", "tier"),
            "key": ("key_id", "tenant", "tier"),
        }[by]
        out_rows = [
            _row(dict(zip(labels, group, strict=True)), values)
            for group, values in sorted(grouped.items())
        ]
        shadow_total = _sum(shadows.values())
        return {
            "window": window,
            "by": by,
            "rows": out_rows,
            "total": _row({}, _sum([*grouped.values(), shadow_total])),
            "shadow": {
                "rows": [
                    _row({"tier": tier, "purpose": purpose}, values)
                    for (tier, purpose), values in sorted(shadows.items())
                ],
                "total": _row({}, shadow_total),
            },
            "baseline_tier": self.costs.baseline_tier,
        }


def _sum(rows: Iterable[list[float]]) -> list[float]:
    """Field by field."""
    total = [0.0] * len(FIELDS)
    for values in rows:
        for index, value in enumerate(values):
            total[index] += value
    return total


def _row(labels: Mapping[str, str], values: list[float]) -> dict[str, Any]:
    requests, inputs, outputs, cost, baseline = values
    saved = baseline - cost
    return {
        **labels,
        "requests": int(requests),
        "input_tokens": int(inputs),
        "output_tokens": int(outputs),
        "cost": round(cost, 6),
        "baseline_cost": round(baseline, 6),
        "savings": round(saved, 6),
        "savings_share": round(saved / baseline, 4) if baseline else 0.0,
    }


class UsageCollector(Collector):
    """``tiergate_cost_total`` and ``tiergate_cost_baseline_total`` per tier (callers' answers),
    ``tiergate_shadow_tokens_total`` and ``tiergate_shadow_cost_total`` (this process)."""

    def __init__(self, ledger: UsageLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        """Cost and the all-precise baseline, per tier."""
        cost = CounterMetricFamily(
            "tiergate_cost", "Cost of served tokens, by tier", labels=("tier",)
        )
        baseline = CounterMetricFamily(
            "tiergate_cost_baseline",
            "What the same tokens would have cost on the precise tier",
            labels=("tier",),
        )
        for tier, values in list(self.ledger.per_tier.items()):
            cost.add_metric((tier,), values[3])
            baseline.add_metric((tier,), values[4])
        yield cost
        yield baseline
        yield from self._shadows()

    def _shadows(self) -> Iterator[Metric]:
        """Shadow answers' and judge calls' tokens and cost, per tier and purpose."""
        tokens = CounterMetricFamily(
            "tiergate_shadow_tokens",
            "Tokens of shadow answers and judge calls (billed to no caller)",
            labels=("tier", "purpose", "direction"),
        )
        cost = CounterMetricFamily(
            "tiergate_shadow_cost",
            "Cost of shadow answers and judge calls, on the tier that served them",
            labels=("tier", "purpose"),
        )
        for (tier, purpose), values in list(self.ledger.shadow_per_tier.items()):
            tokens.add_metric((tier, purpose, "input"), values[1])
            tokens.add_metric((tier, purpose, "output"), values[2])
            cost.add_metric((tier, purpose), values[3])
        yield tokens
        yield cost


class UsageStoreDown(TierGateError):
    """The shared usage store (Redis) did not answer a report (503): the report needs every
    replica's totals, and this process holds only its own."""

    status = 503
    default_code = "usage_store_unavailable"


def admin_usage_handlers(ledger: UsageLedger, admin_token: str | None) -> list[Any]:
    """``GET /admin/usage?window=24h&by=tenant`` (admin token), or nothing when admin is off."""
    if not admin_token:
        return []
    guard = AdminGuard(admin_token)

    @get("/admin/usage")
    async def admin_usage(request: Request[Any, Any, Any]) -> Response[bytes]:
        guard.check(authorization(request))
        window = request.query_params.get("window", "24h")
        by = request.query_params.get("by", "tier")
        if window not in WINDOWS:
            raise InvalidRequest(f"'window' must be one of {sorted(WINDOWS)}.", param="window")
        if by not in GROUPINGS:
            raise InvalidRequest(f"'by' must be one of {list(GROUPINGS)}.", param="by")
        try:
            view = await ledger.view(window, by)
        except (RedisError, OSError):
            raise UsageStoreDown("The usage store (Redis) is unreachable; try again.") from None
        body = _encoder.encode(view)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    return [admin_usage]
