"""Headroom for interactive requests: batch holds at most ``queue.batch_max_share`` of a
tier's slots, takes any free slot below that, and never leaks its count."""

from __future__ import annotations

import asyncio
import math

import pytest
from pydantic import ValidationError

from gateway.config.settings import QueueSettings
from gateway.config.tier_settings import Timeouts
from gateway.upstream.fair_queue import BATCH, Ticket
from gateway.upstream.forwarding import TierRoute, _pick
from gateway.upstream.replicas import QueueSetup, Replica, ReplicaPool, batch_cap
from policies.selection import RoundRobin

URL = "http://10.0.0.1:8000"
LIGHT = Ticket("light")
HEAVY = Ticket("heavy", BATCH)


def capped(share: float, slots: int = 4, policy: str = "fair") -> tuple[TierRoute, Replica]:
    """A tier of one replica with ``slots`` slots, batch capped at ``share``."""
    setup = QueueSetup("fifo" if policy == "fifo" else "fair", batch_max_share=share)
    pool = ReplicaPool("fast", [URL], slots, 5.0, queue=setup)
    return TierRoute(pool, RoundRobin(), Timeouts(), "m"), pool.replicas[0]


def test_the_cap_rounds_down_keeps_one_slot_and_share_one_is_off() -> None:
    assert batch_cap(0.5, 4) == 2
    assert batch_cap(0.6, 4) == 2
    assert batch_cap(0.1, 4) == 1
    assert batch_cap(1.0, 4) == math.inf


def test_batch_stops_at_its_share_and_interactive_finds_a_free_slot() -> None:
    """With two of four slots held by batch, a third batch request queues; interactive not."""
    route, replica = capped(0.5)
    assert _pick(route, frozenset(), (), HEAVY) is not None
    assert _pick(route, frozenset(), (), HEAVY) is not None
    assert _pick(route, frozenset(), (), HEAVY) is None  # two slots free, none for batch
    assert _pick(route, frozenset(), (), LIGHT) is not None
    assert (replica.in_flight, route.pool.batch_in_flight) == (3, 2)


def test_share_one_lets_batch_take_every_slot() -> None:
    route, replica = capped(1.0)
    assert all(_pick(route, frozenset(), (), HEAVY) is not None for _ in range(4))
    assert _pick(route, frozenset(), (), HEAVY) is None
    assert (replica.in_flight, route.pool.batch_in_flight) == (4, 4)


async def test_a_queued_batch_waiter_gets_a_batch_slot_not_an_interactive_one() -> None:
    """A slot freed by interactive stays free for interactive; one freed by batch goes on."""
    route, replica = capped(0.5)
    pool = route.pool
    for ticket in (HEAVY, HEAVY, LIGHT, LIGHT):
        pool.lease(replica, batch=ticket is HEAVY)
    waiter = asyncio.create_task(pool.acquire(HEAVY, frozenset(), 5.0))
    await asyncio.sleep(0)
    pool.release(replica)  # an interactive slot frees: batch is at its cap still
    await asyncio.sleep(0)
    assert not waiter.done()
    assert (replica.in_flight, pool.queue.waiting) == (3, 1)
    assert _pick(route, frozenset(), (), LIGHT) is not None  # interactive: the free slot
    assert pool.queue.waiting == 1
    pool.release(replica)  # that interactive request ends
    pool.release(replica, batch=True)  # a batch slot frees: the batch waiter takes it
    assert await waiter is replica
    assert (replica.in_flight, pool.batch_in_flight) == (3, 2)


@pytest.mark.parametrize("policy", ["fair", "fifo"])
async def test_batch_fills_the_free_slots_up_to_its_cap_when_interactive_is_idle(
    policy: str,
) -> None:
    """Work-conserving up to the cap: three batch waiters, 0.75 of four slots, all free."""
    route, replica = capped(0.75, policy=policy)
    pool = route.pool
    for _ in range(4):
        pool.lease(replica)
    tasks = [asyncio.create_task(pool.acquire(t, frozenset(), 5.0)) for t in [HEAVY] * 4]
    tasks.append(asyncio.create_task(pool.acquire(LIGHT, frozenset(), 5.0)))
    await asyncio.sleep(0)
    for _ in range(4):
        pool.release(replica)
    await asyncio.sleep(0)
    served = [t.done() for t in tasks]
    assert served == [True, True, True, False, True]  # the fourth batch waits; light did not
    assert (replica.in_flight, pool.batch_in_flight, pool.queue.waiting) == (4, 3, 1)
    tasks[3].cancel()
    await asyncio.gather(tasks[3], return_exceptions=True)
    assert pool.queue.waiting == 0


async def test_a_cancelled_batch_waiter_gives_its_batch_slot_back() -> None:
    """Handed a slot, then cancelled: the slot and the batch count both come back."""
    route, replica = capped(0.5, slots=2)
    pool = route.pool
    pool.lease(replica, batch=True)
    pool.lease(replica)
    task = asyncio.create_task(pool.acquire(HEAVY, frozenset(), 5.0))
    await asyncio.sleep(0)
    pool.release(replica, batch=True)  # handed to the waiter...
    task.cancel()  # ...which is gone before it runs
    await asyncio.gather(task, return_exceptions=True)
    assert (replica.in_flight, pool.batch_in_flight) == (1, 0)


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_the_share_is_checked(share: float) -> None:
    with pytest.raises(ValidationError):
        QueueSettings(batch_max_share=share)
    assert QueueSettings().batch_max_share == 1.0


def test_the_cap_follows_the_healthy_replicas_after_a_health_round() -> None:
    """Half the tier down: batch keeps its share of the slots left, not of all of them."""
    setup = QueueSetup(batch_max_share=0.5)
    pool = ReplicaPool("fast", [URL, "http://10.0.0.2:8000"], 4, 5.0, queue=setup)
    assert pool.batch_cap == 4
    pool.replicas[1].healthy = False
    pool.refresh_context()
    assert pool.batch_cap == 2
    pool.replicas[0].healthy = False
    pool.refresh_context()
    assert pool.batch_cap == 1  # at least one slot
    pool.replicas[0].healthy = pool.replicas[1].healthy = True
    pool.refresh_context()
    assert pool.batch_cap == 4
