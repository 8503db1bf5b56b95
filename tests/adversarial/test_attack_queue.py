"""Attacks on a full tier's queue (issue 36): weights that break its order, waits that cannot end.

Unit level: the queue and the replica pool alone, no process (the behaviour is in-process).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.settings import QueueSettings
from gateway.config.tier_settings import TierSettings, Timeouts
from gateway.pipeline.events import AttemptEnd, AttemptStart
from gateway.upstream.attempt import UpstreamClient
from gateway.upstream.fair_queue import BATCH, Ticket, ticket_for
from gateway.upstream.forwarding import Forwarder, TierRoute, _queued
from gateway.upstream.replicas import QueueSetup, Replica, ReplicaPool
from gateway.upstream.retry import RetryBudget, RetryLoop, RetryPolicy
from policies.errors import InvalidRequest, Overloaded, PermissionDenied
from policies.keys import policy_from_dict
from policies.principal import SCOPE_PRIORITY, KeyPolicy, Principal
from policies.selection import RoundRobin

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
PATH = "/v1/chat/completions"


async def _served(pool: ReplicaPool, replica: Replica, tickets: list[Ticket]) -> list[str]:
    """Queue ``tickets``, then free the one slot once per ticket: the tenants served, in turn."""
    order: list[str] = []

    async def wait(ticket: Ticket) -> None:
        await pool.acquire(ticket, frozenset(), 5.0)
        order.append(ticket.tenant)

    tasks = [asyncio.create_task(wait(t)) for t in tickets]
    await asyncio.sleep(0)
    for _ in tickets:
        pool.release(replica)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return order


@pytest.mark.parametrize("weight", [5e-324, 1e-300, 1e-12])
def test_a_weight_too_small_for_the_queue_clock_is_refused(weight: float) -> None:
    """A key with a vanishing weight pushed the class clock to 1/weight (inf at 5e-324, 1e300
    at 1e-300) once served; every later tag then compared equal and the class was served
    first come first served for the life of the worker. Such weights are refused."""
    with pytest.raises(ValueError, match="queue_weight"):
        policy_from_dict({"queue_weight": weight})


async def test_the_smallest_accepted_weight_leaves_fair_queuing_intact() -> None:
    """After a tenant with the smallest weight a key may have is served twice, a light tenant
    arriving behind a flood is still served among the first two, not last."""
    smallest = policy_from_dict({"queue_weight": 0.001}).queue_weight
    pool = ReplicaPool("fast", [A], 1, 5.0)
    replica = pool.replicas[0]
    pool.lease(replica)
    tiny = Ticket("tiny", weight=smallest)
    assert await _served(pool, replica, [tiny, tiny]) == ["tiny", "tiny"]
    order = await _served(pool, replica, [Ticket("flood")] * 6 + [Ticket("light")])
    assert "light" in order[:2]
    assert replica.in_flight == 1  # the slot the test holds, nothing leaked
    assert pool.queue.waiting == 0


async def test_a_retry_whose_other_replica_is_down_takes_the_slot_it_tried() -> None:
    """A retry that tried replica A finds A at its cap and B unhealthy: it must wait for A's
    slot, not for B's, which never comes (it waited its whole deadline, then got 503)."""
    pool = ReplicaPool("fast", [A, B], 1, 5.0)
    first, second = pool.replicas
    pool.lease(first)
    second.healthy = False
    loop = RetryLoop(RetryPolicy(), RetryBudget(0.2, 1.0), time.monotonic() + 5.0)
    waiter = asyncio.create_task(_queued(pool, frozenset({A}), loop, Ticket("a")))
    await asyncio.sleep(0)
    assert pool.queue.waiting == 1
    pool.release(first)  # the only usable replica frees its slot
    assert pool.queue.waiting == 0, "the only usable replica's free slot was not handed over"
    assert (await asyncio.wait_for(waiter, 1.0)).replica is first
    assert first.in_flight == 1
    assert second.in_flight == 0


async def test_waiters_move_on_when_the_health_round_finds_the_tier_down() -> None:
    """Every replica of the tier fails its health checks while requests wait for a slot: they
    are refused at the health round (so a fallback tier can serve them), not held their whole
    deadline for a slot no replica will hand over; the down replica's lease still comes back."""
    pool = ReplicaPool("fast", [A], 1, 30.0)
    replica = pool.replicas[0]
    pool.lease(replica)
    waiters = [asyncio.create_task(pool.acquire(Ticket(t), frozenset(), 30.0)) for t in ("a", "b")]
    await asyncio.sleep(0)
    assert pool.queue.waiting == 2
    replica.healthy = False
    pool.refresh_context()  # what the health monitor calls after each round
    assert pool.queue.waiting == 0, "waiters still held for a tier with no healthy replica"
    for waiter in waiters:
        with pytest.raises(Overloaded, match="has no healthy replica"):
            await asyncio.wait_for(waiter, 1.0)
    assert pool.queue_stats.shed["interactive", "down"] == 2
    pool.release(replica)
    assert replica.in_flight == 0


async def test_a_waiter_cancelled_after_the_tier_went_down_leaks_nothing() -> None:
    """A client that disconnects in the instant its waiter is refused for a down tier."""
    pool = ReplicaPool("fast", [A], 1, 30.0)
    replica = pool.replicas[0]
    pool.lease(replica)
    waiter = asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 30.0))
    await asyncio.sleep(0)
    replica.healthy = False
    pool.refresh_context()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert replica.in_flight == 1  # only the lease the test holds
    assert pool.queue.waiting == 0


async def test_a_tier_whose_only_replica_is_misconfigured_still_serves_its_waiters() -> None:
    """A replica flagged misconfigured (it refused the gateway's credentials once) is still
    picked when no other is usable, but its freed slots were never handed to waiters: every
    queued request waited its whole deadline and got 503 while the slot stood free."""
    pool = ReplicaPool("fast", [A], 1, 30.0)
    replica = pool.replicas[0]
    pool.lease(replica)
    pool.mark_misconfigured(replica, 401)
    waiter = asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 30.0))
    await asyncio.sleep(0)
    pool.release(replica)
    assert pool.queue.waiting == 0, "the free slot of the only replica was not handed over"
    assert await asyncio.wait_for(waiter, 1.0) is replica
    assert replica.in_flight == 1


@pytest.mark.parametrize(("wait_s", "expected"), [(0.0, "1"), (0.2, "1"), (1000.0, "60")])
async def test_retry_after_is_a_whole_second_count_from_1_to_60(
    wait_s: float, expected: str
) -> None:
    """A refusal with nothing drained lately (the rate unknown): 1 to 60, never 0 or a
    fraction, whatever the configured wait (0 refuses at once)."""
    pool = ReplicaPool("fast", [A], 1, wait_s)
    pool.lease(pool.replicas[0])
    with pytest.raises(Overloaded) as refused:
        await pool.acquire(Ticket("a"), frozenset(), min(wait_s, 0.01))
    assert refused.value.headers["Retry-After"] == expected
    assert pool.queue.waiting == 0


async def test_a_shedding_storm_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Two hundred refusals in a row (queue full) write one tier.shedding line, not 200."""
    pool = ReplicaPool("fast", [A], 1, 5.0, queue=QueueSetup(max_length=0))
    pool.lease(pool.replicas[0])
    for index in range(200):
        with pytest.raises(Overloaded):
            await pool.acquire(Ticket(f"t{index}"), frozenset(), 5.0)
    lines = [r for r in caplog.records if "tier.shedding" in r.getMessage()]
    assert len(lines) == 1
    assert pool.queue_stats.shed["interactive", "full"] == 200


@pytest.mark.parametrize("header", ["Interactive", "INTERACTIVE", " interactive", "batch,batch"])
def test_an_odd_priority_header_is_refused_not_guessed(header: str) -> None:
    """Odd casing or a joined value: 403 for a key without the scope, 400 for one with it;
    an empty value (a repeated header's first) leaves the key's own class."""
    plain = Principal("k", "t", KeyPolicy(priority=BATCH))
    scoped = Principal("k", "t", KeyPolicy(scopes=frozenset({SCOPE_PRIORITY})))
    with pytest.raises(PermissionDenied):
        ticket_for(plain, header)
    with pytest.raises(InvalidRequest):
        ticket_for(scoped, header)
    assert ticket_for(plain, "").priority == BATCH


class _BrokenTelemetry:
    """An AttemptEvents listener that fails when an attempt starts (a telemetry bug)."""

    def attempt_started(self, start: AttemptStart) -> Mapping[str, str]:
        """Fail, as a tracing or logging bug would."""
        raise RuntimeError(f"exporter broke on {start.replica}")

    def attempt_ended(self, end: AttemptEnd) -> None:
        """Nothing to keep."""


async def test_a_failure_between_lease_and_attempt_returns_the_slot(
    upstream: UpstreamClient,
) -> None:
    """The slot leased for an attempt comes back when reporting the attempt's start fails;
    otherwise each such failure cost a slot for the worker's life, until the tier was dead."""
    pool = ReplicaPool("fast", [A], 2, 0.1)
    route = TierRoute(pool, RoundRobin(), Timeouts(), "tiergate-fast")
    forwarder = Forwarder(upstream, {"fast": route}, RetryPolicy(backoff_base_s=0.0))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for _ in range(3):
        with pytest.raises(RuntimeError, match="exporter broke"):
            await forwarder.forward(PATH, dict(body), ["fast"], events=_BrokenTelemetry())
    assert pool.replicas[0].in_flight == 0


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (TierSettings, "max_queue_wait_s"),
        (QueueSettings, "interactive_wait_s"),
        (QueueSettings, "batch_wait_s"),
    ],
)
def test_an_endless_queue_wait_is_refused_at_startup(settings: type[Any], field: str) -> None:
    """YAML ``.inf`` as a wait passed ``ge=0``; the first refusal with no drain history then
    computed Retry-After as ceil(inf): OverflowError, a 500 for every shed request."""
    base = {"model": "m", "replicas": [A]} if settings is TierSettings else {}
    with pytest.raises(ValidationError, match=field):
        settings.model_validate({**base, field: math.inf})
