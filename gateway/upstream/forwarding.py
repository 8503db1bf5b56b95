"""From a routed request to an open upstream answer: replica choice, leases, retries, fallback.

Nothing here writes to the client, so every retry happens before the first byte reached it.
For streams the first SSE event is read inside the attempt: a backend that stalls before its
first token is retried elsewhere, and one whose first event is an error is answered like an
HTTP error of that status. A non-streaming attempt is bounded by the request's deadline only:
vLLM sends nothing until the whole answer is ready, so a "first byte" timeout would re-send a
request the backend is still generating and multiply its work.

Every attempt carries its own ``x-request-id`` (vLLM 0.11 refuses a second request with an id
already running); the caller's id is only echoed back to the caller.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from gateway.config.tier_settings import Timeouts
from gateway.pipeline.events import (
    NO_EVENTS,
    AttemptEnd,
    AttemptEvents,
    AttemptStart,
    FailureKind,
)
from gateway.pipeline.ids import fresh_id
from gateway.upstream.attempt import (
    AUTH_STATUSES,
    AttemptFailed,
    Opened,
    UpstreamClient,
    attempt,
)
from gateway.upstream.connection import Response
from gateway.upstream.explain import every_tier_failed, final_error, why_none
from gateway.upstream.fair_queue import ANONYMOUS, Ticket
from gateway.upstream.keys import UpstreamKeys, bearer_tokens, every_key_refused
from gateway.upstream.replicas import Replica, ReplicaPool
from gateway.upstream.retry import RetryBudget, RetryLoop, RetryPolicy
from gateway.upstream.sse import (
    BOM,
    ERROR_EVENT,
    EVENT_END,
    MAX_EVENT,
    event_error,
    first_of_dialect,
    keep_alive,
    stream_error,
)
from policies.errors import Overloaded, TierGateError, UpstreamUnavailable
from policies.selection import Choice, Strategy

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
MIN_DECODE_TOKENS = 8  # a stream's decode this long times its replica (fewer: mostly noise)


@dataclass(slots=True)
class Exchange:
    """An open upstream answer and the lease it holds until :meth:`finish`."""

    opened: Opened
    replica: Replica
    pool: ReplicaPool
    first_event: bytes = b""
    finished: bool = False
    # The lease counts as the batch class's (ReplicaPool.batch_cap).
    batch: bool = False
    # The stream's line ending when not LF (b"\r\n" or b"\r"): the relay turns it into LF.
    framing: bytes | None = None
    # The request's deadline (time.monotonic(), timeouts.total_s): a stream ends there too.
    deadline: float = math.inf
    # The upstream keys, blanked in an error event that quotes one (Forwarder's own tuple).
    secrets: tuple[str, ...] = ()

    def finish(
        self, *, abort: bool = False, failed: bool = False, tokens: int = 0, since: float = 0.0
    ) -> None:
        """Return the lease; ``abort`` closes the connection so the engine stops work.

        ``failed``: the backend broke the stream (reset, stall, truncation), which counts
        against the replica's health like a failed attempt. ``tokens``: those a complete
        stream of one choice relayed after its first, at ``since`` (perf_counter()): at
        least ``MIN_DECODE_TOKENS`` of them time the replica's decoding (its speed).
        """
        if self.finished:
            return
        self.finished = True
        if tokens >= MIN_DECODE_TOKENS and since and not (abort or failed):
            now = time.perf_counter()
            self.pool.record_speed(self.replica, now - since, tokens, now)
        if failed:
            self.pool.record_failure(
                self.replica,
                FailureKind.MID_STREAM,
                "The stream broke after it started.",
                counts=True,
            )
        response = self.opened.response
        if response is not None:
            if abort:
                response.close()
            else:
                response.release()
        self.pool.release(self.replica, batch=self.batch)


class Forwarded(NamedTuple):
    """What :meth:`Forwarder.forward` returns: the open answer and which tier gave it.

    ``fallback_from`` and ``fallback_reason`` are set when a fallback tier answered: the tier
    asked for and the code of the error it gave up with.
    """

    exchange: Exchange
    tier: str
    fallback_from: str | None = None
    fallback_reason: str | None = None


@dataclass(frozen=True, slots=True)
class TierRoute:
    """A tier's pool, its strategy and timeouts."""

    pool: ReplicaPool
    strategy: Strategy
    timeouts: Timeouts
    served_model: str
    # Sent with every attempt: the tier's upstream credentials (Authorization), if any.
    upstream_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    keys: UpstreamKeys | None = None  # several keys: each replica's replaces the header above


class _Waited:
    """Time one attempt spent waiting on its backend (a local of one attempt)."""

    __slots__ = ("first_chunk_at", "upstream_s")

    def __init__(self) -> None:
        self.upstream_s = 0.0
        self.first_chunk_at: float | None = None


class Forwarder:
    """Opens upstream answers for routed requests."""

    def __init__(
        self,
        upstream: UpstreamClient,
        routes: Mapping[str, TierRoute],
        policy: RetryPolicy,
    ) -> None:
        self.upstream = upstream
        self.routes = routes
        self.policy = policy
        # Sent with every attempt on a tier (its credentials included), merged once.
        self._base_headers = {
            tier: {"Content-Type": "application/json", **route.upstream_headers}
            for tier, route in routes.items()
        }
        self.budget = RetryBudget(policy.budget_ratio, policy.budget_min, policy.budget_window_s)
        # A backend may quote the key it was sent in an error ("Incorrect API key provided").
        heads = [h for r in routes.values() for h in (r.upstream_headers, *(r.keys or ()))]
        self._upstream_secrets = bearer_tokens(heads)

    def uses_prefix(self, tiers: Sequence[str]) -> bool:
        """Whether a replica choice on ``tiers`` can follow the request's prefix blocks.

        Only a prefix-aware strategy over more than one replica reads them; otherwise the
        caller skips hashing the prompt (a request's blocks are then empty).
        """
        routes = self.routes
        for tier in tiers:
            route = routes[tier]
            if route.strategy.uses_prefix and len(route.pool.replicas) > 1:
                return True
        return False

    async def forward(
        self,
        path: str,
        body: dict[str, Any],
        tiers: Sequence[str],
        prefix_blocks: Sequence[int] = (),
        events: AttemptEvents = NO_EVENTS,
        *,
        ticket: Ticket = ANONYMOUS,
    ) -> Forwarded:
        """Try ``tiers`` in order; within a tier, retry on other replicas per the rules.

        One deadline covers the whole request, fallback tiers included. Each attempt is
        reported to ``events`` (started, then ended); the result says which tier answered and,
        after a fallback, from which tier and why. ``ticket``: its place in a full tier's queue.
        """
        deadline = time.monotonic() + self.routes[tiers[0]].timeouts.total_s
        failed: list[tuple[str, TierGateError]] = []
        try:
            for index, tier in enumerate(tiers):
                if index > 0 and deadline <= time.monotonic():
                    break
                try:
                    exchange = await self._forward_tier(
                        path,
                        body,
                        tier,
                        events,
                        prefix_blocks=prefix_blocks,
                        deadline=deadline,
                        fallback=index > 0,
                        ticket=ticket,
                    )
                except (UpstreamUnavailable, Overloaded) as exc:
                    failed.append((tier, exc))
                    continue
                exchange.deadline = deadline
                if failed:
                    return Forwarded(exchange, tier, tiers[0], str(failed[-1][1].code))
                return Forwarded(exchange, tier)
            raise every_tier_failed(failed)
        finally:
            failed.clear()  # their tracebacks hold this frame: no cycle once it is left

    async def _forward_tier(
        self,
        path: str,
        body: dict[str, Any],
        tier: str,
        events: AttemptEvents,
        *,
        prefix_blocks: Sequence[int],
        deadline: float,
        fallback: bool = False,
        ticket: Ticket = ANONYMOUS,
    ) -> Exchange:
        route = self.routes[tier]
        body["model"] = route.served_model
        payload = _encoder.encode(body)
        stream = bool(body.get("stream"))
        pool = route.pool
        loop = RetryLoop(
            self.policy,
            self.budget,
            deadline,
            ready_in=lambda: pool.ready_in(time.monotonic()),
            replicas=len(pool.replicas),
            counts_as_request=not fallback,
        )
        tried: set[str] = set()
        batch = ticket.batch

        async def one(number: int) -> Exchange:
            if number > 1 and loop.failures:
                pool.count_retry(loop.failures[-1].kind)
            routed_at = time.perf_counter()
            exclude = frozenset(tried) if tried else _NOTHING
            choice = _pick(route, exclude, prefix_blocks, ticket)
            if choice is None:  # every usable replica at its cap: queue for a slot
                choice = await _queued(pool, exclude, loop, ticket)
            replica = choice.replica
            tried.add(replica.url)
            try:
                headers = self._started(tier, route, choice, routed_at, prefix_blocks, body, events)
            except BaseException:  # a listener's bug must not keep the slot leased
                pool.release(replica, batch=batch)
                raise
            first_byte_s = route.timeouts.first_byte_s if stream else math.inf
            limit_s = max(0.001, min(first_byte_s, loop.remaining()))
            url = replica.url + path
            return await self._attempt(
                route, replica, url, payload, headers, stream, limit_s, events, batch
            )

        try:
            return await loop.run(one)
        except AttemptFailed as failure:
            # No local name for the error: frame and exception would hold each other (and the
            # request body) alive until a full collection.
            raise final_error(tier, failure, loop.failures) from None
        finally:
            loop.forget_tracebacks()

    def _started(  # noqa: PLR0917  # one attempt's facts, passed as is (hot path)
        self,
        tier: str,
        route: TierRoute,
        choice: Choice[Replica],
        routed_at: float,
        prefix_blocks: Sequence[int],
        body: dict[str, Any],
        events: AttemptEvents,
    ) -> dict[str, str]:
        """Report an attempt on ``choice`` as started; the headers it sends.

        The tier's headers, a fresh ``x-request-id`` (unique per attempt), what ``events``
        adds and, with several upstream keys, the replica's key.
        """
        replica = choice.replica
        upstream_id = fresh_id()  # unique per attempt
        start = AttemptStart(
            tier,
            replica.name,
            replica.url,
            route.strategy.name,
            routed_at,
            len(prefix_blocks),
            choice.affinity,
            upstream_id,
            body,
            self._upstream_secrets,
        )
        extra = events.attempt_started(start)
        headers = {**self._base_headers[tier], "x-request-id": upstream_id, **extra}
        if route.keys is not None:
            headers.update(route.keys.for_replica(replica.url))
        return headers

    async def _attempt(  # noqa: PLR0917  # one attempt's request, passed as is (hot path)
        self,
        route: TierRoute,
        replica: Replica,
        url: str,
        payload: bytes,
        headers: dict[str, str],
        stream: bool,
        limit_s: float,
        events: AttemptEvents,
        batch: bool,
    ) -> Exchange:
        """One attempt, reported to ``events`` as ended (opened or failed) whatever happens;
        its lease on ``replica`` (``batch``: a batch one) is returned on failure, else the
        exchange holds it (a non-streaming answer is read whole and gives it back at once)."""
        pool = route.pool
        waited = _Waited()
        started = time.perf_counter()
        try:
            try:
                opened = await attempt(
                    self.upstream.pool,
                    url,
                    payload,
                    headers,
                    stream=stream,
                    timeout_s=limit_s,
                    connect_s=route.timeouts.connect_s,
                )
            except AttemptFailed as failure:
                pool.release(replica, batch=batch)
                self._record_failure(route, replica, failure)
                raise
            except BaseException:
                pool.release(replica, batch=batch)
                raise
            finally:
                waited.upstream_s += time.perf_counter() - started
            exchange = Exchange(opened, replica, pool, batch=batch, secrets=self._secrets(replica))
            if stream:
                await self._read_first_event(route, exchange, limit_s, waited)
            else:  # no speed: a whole answer's time is mostly prefill and queueing
                exchange.finish()
            pool.record_success(replica)
            if route.keys is not None:
                route.keys.accepted(replica.url)
        except BaseException as exc:
            kind = exc.kind if isinstance(exc, AttemptFailed) else type(exc).__name__
            events.attempt_ended(AttemptEnd(waited.upstream_s, waited.first_chunk_at, kind))
            raise
        events.attempt_ended(
            AttemptEnd(
                waited.upstream_s,
                waited.first_chunk_at,
                body=opened.body,
                first_event=exchange.first_event,
            )
        )
        return exchange

    async def _read_first_event(
        self, route: TierRoute, exchange: Exchange, limit_s: float, waited: _Waited
    ) -> None:
        """A stream's first event into ``exchange``; on failure the exchange is aborted."""
        try:
            exchange.first_event = await _first_event(exchange, limit_s, waited)
        except AttemptFailed as failure:
            exchange.finish(abort=True)
            self._record_failure(route, exchange.replica, failure)
            raise
        except BaseException:
            exchange.finish(abort=True)
            raise

    def _secrets(self, replica: Replica) -> tuple[str, ...]:
        """What a backend's own texts must never hand a caller: the upstream keys and the
        replica's own address."""
        return (*self._upstream_secrets, *replica.addresses)

    def _record_failure(self, route: TierRoute, replica: Replica, failure: AttemptFailed) -> None:
        """Count ``failure`` on the replica; a Retry-After on 429/503 becomes a cool-down."""
        failure.replica = replica.label  # named in the caller's error if every attempt fails
        failure.blank(self._secrets(replica))  # before callers, logs or /admin/backends see them
        pool = route.pool
        if failure.status is not None:  # an error answer is still an answer: the server lives
            replica.heard_at = time.monotonic()
        if failure.status in AUTH_STATUSES and every_key_refused(route.keys, replica.url):
            pool.mark_misconfigured(replica, failure.status)
        cooldown = None
        if failure.retry_after is not None:
            # Never a backend's raw value: it sets cool-downs, retry waits and the caller's header.
            failure.retry_after = min(failure.retry_after, self.policy.max_cooldown_s)
            if failure.status in (429, 503):
                cooldown = failure.retry_after
        pool.record_failure(
            replica,
            failure.kind,
            failure.message,
            counts=failure.counts_against_replica and cooldown is None,
            retry_after=cooldown,
        )


_NOTHING: frozenset[str] = frozenset()


async def _queued(
    pool: ReplicaPool, exclude: frozenset[str], loop: RetryLoop, ticket: Ticket
) -> Choice[Replica]:
    """A slot handed over by the tier's queue (no usable replica left untried: any replica;
    an untried one that is down would never hand its slot over)."""
    if exclude and not pool.usable(time.monotonic(), exclude):
        exclude = _NOTHING
    wait_s = min(pool.wait_for(ticket), loop.remaining())
    return Choice(await pool.acquire(ticket, exclude, wait_s))


def _pick(
    route: TierRoute, exclude: frozenset[str], prefix_blocks: Sequence[int], ticket: Ticket
) -> Choice[Replica] | None:
    """A leased replica for the next attempt; None when every usable one is at its cap (or
    ``ticket`` is batch and its class holds its share of the tier's slots).

    Raises ``AttemptFailed`` (no replica) when none is usable at all.
    """
    pool = route.pool
    now = time.monotonic()
    # The usual case in one pass: the replicas up, configured, not tried and below their cap
    # (what the steps below leave when any such replica exists).
    free = [
        r
        for r in pool.replicas
        if r.in_flight < r.slots
        and not r.misconfigured
        and r.url not in exclude
        and r.available(now)
    ]
    batch = ticket.batch
    if free and not pool.batch_full(ticket):
        return _lease(route, free, prefix_blocks, batch=batch)
    usable = pool.usable(now, exclude)
    if not usable and exclude:
        usable = pool.usable(now)  # every replica tried: any is fair
    if not usable:
        raise AttemptFailed(
            FailureKind.NO_REPLICA,
            f"No healthy replica in tier '{pool.tier}': {why_none(pool, now)}.",
            retry_after=pool.ready_in(now) or None,
        )
    free = [r for r in usable if r.has_capacity]
    if not free or pool.batch_full(ticket):
        return None
    return _lease(route, free, prefix_blocks, batch=batch)


def _lease(
    route: TierRoute, free: list[Replica], prefix_blocks: Sequence[int], *, batch: bool
) -> Choice[Replica]:
    """The strategy's pick among ``free`` (all below their cap), leased."""
    pool = route.pool
    # One candidate: every strategy takes it, with no prefix followed (affinity None).
    choice = (
        Choice(free[0])
        if len(free) == 1
        else route.strategy.choose(free, prefix_blocks, pool.next_index())
    )
    pool.lease(choice.replica, batch=batch)
    return choice


async def _first_event(exchange: Exchange, timeout_s: float, waited: _Waited) -> bytes:
    response = exchange.opened.response
    assert response is not None  # noqa: S101  # streams always keep their response
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            while keep_alive(event := _framed(exchange, await _next_event(response))):
                pass  # a comment or blank event before the first: not the answer's start
    except TimeoutError as exc:
        raise AttemptFailed(
            FailureKind.FIRST_BYTE_TIMEOUT, "The backend sent no token in time."
        ) from exc
    except ValueError as exc:
        raise AttemptFailed(
            FailureKind.BAD_ANSWER, "The backend sent a first event above the size limit."
        ) from exc
    except OSError as exc:
        raise AttemptFailed(
            FailureKind.RESET, "The backend closed the stream before any output."
        ) from exc
    finally:
        waited.first_chunk_at = now = time.perf_counter()
        waited.upstream_s += now - started
    if event.startswith(ERROR_EVENT) or event_error(event) is not None:
        raise stream_error(event)
    return event


async def _next_event(response: Response) -> bytes:
    """The stream's next event as sent (its blank line included; the body's rest at its end)."""
    return await response.readuntil(EVENT_END, MAX_EVENT)


def _framed(exchange: Exchange, event: bytes) -> bytes:
    """An event read before the first one that counts, with LF line ends and in the relay's
    dialect; the stream's framing, when not LF, noted on ``exchange`` (the first event
    read says which)."""
    if event[-2:] != b"\n\n":  # not LF framing (or a body that ended without a blank line)
        framing = exchange.framing
        if framing is None:
            framing = (
                b"\r\n" if event.endswith(b"\r\n\r\n") else b"\r" if event[-2:] == b"\r\r" else None
            )
        if framing is not None:
            exchange.framing = framing
            event = event.replace(framing, b"\n")
    if not event.startswith(b"data: "):
        event = first_of_dialect(event[3:] if event[:3] == BOM else event)
    return event
