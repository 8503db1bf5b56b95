"""How many gateway processes share one Redis: a heartbeat sorted set, read while Redis is up.

Each gateway process (every worker of every replica) writes its own member into
``<prefix>census`` every ``interval_s``, scored by its expiry (Redis' own clock, ms), and
reads back how many members have not expired. While Redis is unreachable the last count it
read stands: the limiter and the budgets then enforce each key's limits divided by it locally
(``ratelimit.on_redis_error: open``), so the fleet together admits about one key's limit, not
one per process. ``ratelimit.degraded_replicas``, when set, overrides the count (it is then
the number of replicas, and is multiplied by this replica's workers, as before).

The bound: a process that died is still counted for up to ``ttl_s`` (the local share is then
smaller than needed: the safe side); one that starts while Redis is down is not counted by
the others, so in an outage the fleet admits at most ``live / counted`` times a key's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.pipeline.tasks import stop_tasks

_log = structlog.get_logger("tiergate.census")
# KEYS: the set. ARGV: member, ttl ms. Returns the live members, this one included.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
"""
INTERVAL_S = 1.0
TTL_S = 5.0


class ReplicaCensus:
    """This process's heartbeat, and the number of live gateway processes it last read."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        *,
        interval_s: float = INTERVAL_S,
        ttl_s: float = TTL_S,
    ) -> None:
        self.client = client
        self.key = f"{prefix}census"
        self.member = secrets.token_hex(8)
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.count = 1
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> int | None:
        """Beat once; the live count (also kept in ``count``), ``None`` when Redis did not
        answer (``count`` then keeps the last one read)."""
        try:
            live = await self.client.eval(_BEAT, 1, self.key, self.member, self.ttl_ms)
        except (RedisError, OSError):
            return None
        self.count = max(1, int(live))
        return self.count

    async def start(self) -> None:
        """First beat now (the count is known before the first request), then every
        ``interval_s`` in the background."""
        await self.beat()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.beat()

    async def stop(self) -> None:
        """Stop beating and leave the set (the others stop counting this process at once)."""
        task, self._task = self._task, None
        await stop_tasks(task)
        with contextlib.suppress(RedisError, OSError):
            await self.client.zrem(self.key, self.member)


class LocalShare:
    """The divisor of a key's limits while Redis is unreachable: the census, or the setting."""

    def __init__(self, census: ReplicaCensus | None, replicas: int | None, workers: int) -> None:
        self.census = census
        self.replicas = replicas
        self.workers = workers

    def __call__(self) -> int:
        """Processes that share a key's limits (at least 1)."""
        if self.replicas is not None or self.census is None:
            return max(1, (self.replicas or 1) * self.workers)
        return self.census.count
