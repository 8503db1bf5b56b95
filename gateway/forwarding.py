"""From a routed request to an open upstream answer: replica choice, leases, retries, fallback.

Nothing here writes to the client, so every retry happens before the first byte reached it.
For streams the first SSE event is read inside the attempt: a backend that stalls before its
first token is retried elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from gateway.context import RequestContext
from gateway.replicas import Replica, ReplicaPool
from gateway.retry import RetryBudget, RetryLoop, RetryPolicy
from gateway.settings import Timeouts
from gateway.upstream import AttemptFailed, Opened, attempt
from policies.errors import Overloaded, UpstreamRejected, UpstreamUnavailable
from policies.selection import Strategy

_encoder = msgspec.json.Encoder()
_EVENT_END = b"\n\n"
_MAX_EVENT = 1 << 20


@dataclass(slots=True)
class Exchange:
    """An open upstream answer and the lease it holds until :meth:`finish`."""

    opened: Opened
    replica: Replica
    pool: ReplicaPool
    first_event: bytes = b""
    finished: bool = False

    def finish(self, *, abort: bool = False) -> None:
        """Return the lease; ``abort`` closes the connection so the engine stops work."""
        if self.finished:
            return
        self.finished = True
        response = self.opened.response
        if response is not None:
            if abort:
                response.close()
            else:
                response.release()
        self.pool.release(self.replica)


@dataclass(frozen=True, slots=True)
class TierRoute:
    """A tier's pool, its strategy and timeouts."""

    pool: ReplicaPool
    strategy: Strategy
    timeouts: Timeouts
    served_model: str


class Forwarder:
    """Opens upstream answers for routed requests."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        routes: Mapping[str, TierRoute],
        policy: RetryPolicy,
    ) -> None:
        self.session = session
        self.routes = routes
        self.policy = policy
        self.budget = RetryBudget(policy.budget_ratio, policy.budget_min)

    async def forward(
        self,
        ctx: RequestContext,
        path: str,
        body: dict[str, Any],
        tiers: Sequence[str],
        prefix_blocks: Sequence[int] = (),
    ) -> Exchange:
        """Try ``tiers`` in order; within a tier, retry on other replicas per the rules."""
        last: Exception | None = None
        for index, tier in enumerate(tiers):
            try:
                exchange = await self._forward_tier(ctx, path, body, tier, prefix_blocks)
            except (UpstreamUnavailable, Overloaded) as exc:
                last = exc
                continue
            if index > 0:
                ctx.extra_headers["x-tiergate-fallback-from"] = tiers[0]
            ctx.tier = tier
            return exchange
        assert last is not None  # noqa: S101  # tiers is never empty
        raise last

    async def _forward_tier(
        self,
        ctx: RequestContext,
        path: str,
        body: dict[str, Any],
        tier: str,
        prefix_blocks: Sequence[int],
    ) -> Exchange:
        route = self.routes[tier]
        body["model"] = route.served_model
        payload = _encoder.encode(body)
        stream = bool(body.get("stream"))
        headers = {"Content-Type": "application/json", "x-request-id": ctx.request_id}
        loop = RetryLoop(self.policy, self.budget, time.monotonic() + route.timeouts.total_s)
        tried: set[str] = set()

        async def one(_: int) -> Exchange:
            replica = await self._choose(route, frozenset(tried), prefix_blocks, loop)
            tried.add(replica.url)
            ctx.replica = replica.name
            ctx.attempts += 1
            return await self._attempt(
                ctx, route, replica, path=path, payload=payload, headers=headers, stream=stream
            )

        try:
            return await loop.run(one)
        except AttemptFailed as failure:
            raise _final_error(tier, failure) from None

    async def _choose(
        self,
        route: TierRoute,
        exclude: frozenset[str],
        prefix_blocks: Sequence[int],
        loop: RetryLoop,
    ) -> Replica:
        pool = route.pool
        while True:
            usable = pool.usable(time.monotonic(), exclude)
            if not usable and exclude:
                usable = pool.usable(time.monotonic())  # every replica tried: any is fair
            if not usable:
                raise AttemptFailed("no_replica", f"No healthy replica in tier '{pool.tier}'.")
            free = [r for r in usable if r.has_capacity]
            if free:
                replica = route.strategy.choose(free, prefix_blocks, pool.next_index())
                pool.lease(replica)
                return replica
            await pool.wait_for_slot(loop.remaining())

    async def _attempt(
        self,
        ctx: RequestContext,
        route: TierRoute,
        replica: Replica,
        *,
        path: str,
        payload: bytes,
        headers: dict[str, str],
        stream: bool,
    ) -> Exchange:
        timeout = route.timeouts.first_byte_s
        try:
            opened = await attempt(
                self.session,
                replica.url + path,
                payload,
                headers,
                stream=stream,
                timeout_s=timeout,
                ctx=ctx,
            )
        except BaseException:
            route.pool.release(replica)
            raise
        exchange = Exchange(opened, replica, route.pool)
        if stream:
            try:
                exchange.first_event = await _first_event(exchange, timeout, ctx)
            except BaseException:
                exchange.finish(abort=True)
                raise
        else:
            exchange.finish()
        return exchange


async def _first_event(exchange: Exchange, timeout_s: float, ctx: RequestContext) -> bytes:
    response = exchange.opened.response
    assert response is not None  # noqa: S101  # streams always keep their response
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            return await response.content.readuntil(_EVENT_END, max_size=_MAX_EVENT)
    except TimeoutError as exc:
        raise AttemptFailed("first_byte_timeout", "The backend sent no token in time.") from exc
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise AttemptFailed("reset", "The backend closed the stream before any output.") from exc
    finally:
        elapsed = time.perf_counter() - started
        ctx.upstream_s += elapsed
        ctx.first_chunk_s = time.perf_counter() - ctx.started


def _final_error(tier: str, failure: AttemptFailed) -> Exception:
    status = failure.status
    if status is not None and 400 <= status < 500 and status != 429:
        body = failure.body or {}
        param = body.get("param") if isinstance(body.get("param"), str) else None
        return UpstreamRejected(failure.message, status=status, param=param)
    if failure.kind == "no_replica":
        return UpstreamUnavailable(failure.message, status=503, headers={"Retry-After": "1"})
    if status == 429:
        return Overloaded(
            f"Every replica of the '{tier}' tier is busy; retry shortly.",
            headers={"Retry-After": str(int(failure.retry_after or 1))},
        )
    if failure.kind in ("timeout", "first_byte_timeout"):
        return UpstreamUnavailable(f"The '{tier}' tier did not answer in time.", status=504)
    return UpstreamUnavailable(
        f"The '{tier}' tier could not serve the request: {failure.message}", status=502
    )
