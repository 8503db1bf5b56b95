"""A full tier's queue: who is handed the next slot, deadlines, cancellation, no leaked slot."""

from __future__ import annotations

import asyncio

import pytest

from gateway.routing.spillover import Spillover, SpilloverConfig
from gateway.upstream.fair_queue import BATCH, TOP_TENANTS, QueueStats, Ticket, ticket_for
from gateway.upstream.replicas import QueueSetup, Replica, ReplicaPool
from policies.errors import InvalidRequest, Overloaded, PermissionDenied
from policies.keys import policy_from_dict, policy_to_dict
from policies.principal import SCOPE_PRIORITY, KeyPolicy, Principal
from policies.tiering import RouteDecision

URL = "http://10.0.0.1:8000"


def full_pool(setup: QueueSetup | None = None, wait_s: float = 5.0) -> tuple[ReplicaPool, Replica]:
    """A tier of one replica with one slot, taken."""
    pool = ReplicaPool("fast", [URL], 1, wait_s, queue=setup)
    replica = pool.replicas[0]
    pool.lease(replica)
    return pool, replica


async def served_order(pool: ReplicaPool, replica: Replica, tickets: list[Ticket]) -> list[str]:
    """Queue ``tickets`` in order, then free the slot once per ticket; who got it, in turn."""
    order: list[str] = []

    async def wait(ticket: Ticket, label: str) -> None:
        await pool.acquire(ticket, frozenset(), 5.0)
        order.append(label)

    tasks = [
        asyncio.create_task(wait(t, f"{t.tenant}/{t.priority}/{i}")) for i, t in enumerate(tickets)
    ]
    await asyncio.sleep(0)
    assert pool.queue.waiting == len(tickets)
    for _ in tickets:
        pool.release(replica)  # hands the slot to exactly one waiter
        await asyncio.sleep(0)
        assert replica.in_flight == 1
    await asyncio.gather(*tasks)
    return order


async def test_interactive_is_served_before_batch() -> None:
    """A batch waiter that came first is served after every interactive one."""
    pool, replica = full_pool()
    order = await served_order(
        pool, replica, [Ticket("a", BATCH), Ticket("b"), Ticket("c", BATCH), Ticket("d")]
    )
    assert [o.split("/")[1] for o in order] == ["interactive"] * 2 + ["batch"] * 2


async def test_tenants_share_turns_by_weight() -> None:
    """A flood of one tenant does not hold back another; weight 2 gets two turns to one."""
    pool, replica = full_pool()
    tickets = [Ticket("heavy")] * 8 + [Ticket("light")] * 2
    order = [o.split("/")[0] for o in await served_order(pool, replica, tickets)]
    assert order[:4].count("light") == 2  # light's two requests are among the first four
    pool, replica = full_pool()
    tickets = [Ticket("two", weight=2.0)] * 6 + [Ticket("one")] * 6
    order = [o.split("/")[0] for o in await served_order(pool, replica, tickets)]
    assert order[:6].count("two") == 4  # 2:1 while both wait


async def test_fifo_serves_in_arrival_order() -> None:
    """policy fifo ignores class and tenant."""
    pool, replica = full_pool(QueueSetup("fifo"))
    tickets = [Ticket("heavy", BATCH)] * 3 + [Ticket("light")]
    order = await served_order(pool, replica, tickets)
    assert [o.split("/")[2] for o in order] == ["0", "1", "2", "3"]


async def test_deadline_sheds_with_retry_after_from_the_drain_rate() -> None:
    """Past its class's wait a waiter gets 503 with Retry-After = queue / drain rate."""
    pool, replica = full_pool(QueueSetup(waits={"batch": 0.05}), wait_s=30.0)
    slow = [asyncio.create_task(pool.acquire(Ticket("x"), frozenset(), 30.0)) for _ in range(4)]
    await asyncio.sleep(0)
    for _ in range(2):  # two handed slots 0.1 s apart: 10 a second
        pool.release(replica)
        await asyncio.sleep(0.1)
    with pytest.raises(Overloaded) as caught:
        await pool.acquire(Ticket("late", BATCH), frozenset(), pool.wait_for(Ticket("b", BATCH)))
    assert caught.value.status == 503
    assert caught.value.headers["Retry-After"] == "1"  # 3 waiting at ~10/s: under a second
    assert pool.queue_stats.shed["batch", "deadline"] == 1
    assert pool.queue.waiting == 2
    for task in slow:
        task.cancel()
    await asyncio.gather(*slow, return_exceptions=True)
    assert pool.queue.waiting == 0


async def test_a_full_queue_refuses_at_once() -> None:
    """max_length waiters of two tenants, one each: a third tenant's request (who would hold
    as many places as anyone) gets 503 without waiting."""
    pool, _ = full_pool(QueueSetup(max_length=2))
    waiting = [asyncio.create_task(pool.acquire(Ticket(t), frozenset(), 5.0)) for t in ("a", "b")]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await pool.acquire(Ticket("c"), frozenset(), 5.0)
    assert pool.queue_stats.shed["interactive", "full"] == 1
    assert pool.queue_stats.top()["by_refusals"][0]["tenant"] == "c"
    assert pool.queue.waiting == 2
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_tenant_that_fills_the_queue_gives_its_newest_place_to_another() -> None:
    """One tenant's waiters fill the queue: another tenant's request takes the place of the
    flooder's newest waiter (refused with 503 in its stead) and is served within one turn;
    the flooder's own next request is refused, and nothing leaks."""
    pool, replica = full_pool(QueueSetup(max_length=3))
    flood = [asyncio.create_task(pool.acquire(Ticket("heavy"), frozenset(), 5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    light = asyncio.create_task(pool.acquire(Ticket("light"), frozenset(), 5.0))
    await asyncio.sleep(0)
    assert pool.queue.waiting == 3
    with pytest.raises(Overloaded):
        await flood[2]  # the newest of heavy's waiters
    with pytest.raises(Overloaded):
        await pool.acquire(Ticket("heavy"), frozenset(), 5.0)  # heavy holds the most already
    assert pool.queue_stats.shed["interactive", "full"] == 2
    assert pool.queue_stats.top()["by_refusals"][0] == {
        "tenant": "heavy", "waited_s": 0.0, "waits": 0, "refused": 2,
    }  # fmt: skip
    for _ in range(2):  # light's turn comes second, after heavy's first (the same tag)
        pool.release(replica)
    await asyncio.sleep(0)
    assert [flood[0].done(), light.done(), flood[1].done()] == [True, True, False]
    pool.release(replica)
    await asyncio.gather(light, *flood[:2])
    assert (pool.queue.waiting, replica.in_flight) == (0, 1)


async def test_an_interactive_request_takes_a_batch_place_never_the_reverse() -> None:
    """A queue full of batch waiters: an interactive newcomer takes the place of the newest
    batch waiter even of a tenant with one; a batch newcomer never pushes out interactive."""
    pool, _ = full_pool(QueueSetup(max_length=2))
    batch = [
        asyncio.create_task(pool.acquire(Ticket(t, BATCH), frozenset(), 5.0)) for t in ("x", "y")
    ]
    await asyncio.sleep(0)
    interactive = asyncio.create_task(pool.acquire(Ticket("z"), frozenset(), 5.0))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await batch[1]
    with pytest.raises(Overloaded):
        await pool.acquire(Ticket("w", BATCH), frozenset(), 5.0)
    assert pool.queue_stats.shed["batch", "full"] == 2
    assert pool.queue.waiting == 2
    for task in (batch[0], interactive):
        task.cancel()
    await asyncio.gather(batch[0], interactive, return_exceptions=True)
    assert pool.queue.waiting == 0


async def test_fifo_never_pushes_a_waiter_out() -> None:
    """policy fifo: a full queue refuses the newcomer, whoever it is."""
    pool, _ = full_pool(QueueSetup("fifo", max_length=2))
    waiting = [asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 5.0)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await pool.acquire(Ticket("b"), frozenset(), 5.0)
    assert not any(task.done() for task in waiting)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_cancelled_waiter_leaves_and_leaks_no_slot() -> None:
    """Cancelled while waiting: it leaves the queue. Cancelled after being handed the slot
    (before it ran): the slot goes on to the next waiter, or back to the replica."""
    pool, replica = full_pool()
    gone = asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 5.0))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert pool.queue.waiting == 0
    handed = asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 5.0))
    nxt = asyncio.create_task(pool.acquire(Ticket("b"), frozenset(), 5.0))
    await asyncio.sleep(0)
    pool.release(replica)  # handed to the first waiter...
    handed.cancel()  # ...which is cancelled before it could run
    await asyncio.gather(handed, return_exceptions=True)
    assert await asyncio.wait_for(nxt, 1.0) is replica  # the slot went on
    assert replica.in_flight == 1
    pool.release(replica)
    assert replica.in_flight == 0
    assert pool.queue.waiting == 0


async def test_an_excluded_replica_is_not_handed_to_its_waiter() -> None:
    """A retry that already tried a replica waits for another one's slot."""
    pool = ReplicaPool("fast", [URL, "http://10.0.0.2:8000"], 1, 5.0)
    first, second = pool.replicas
    pool.lease(first)
    pool.lease(second)
    waiter = asyncio.create_task(pool.acquire(Ticket("a"), frozenset({URL}), 5.0))
    await asyncio.sleep(0)
    pool.release(first)
    await asyncio.sleep(0)
    assert not waiter.done()
    assert first.in_flight == 0
    pool.release(second)
    assert await asyncio.wait_for(waiter, 1.0) is second
    assert pool.queue_stats.top()["by_wait"][0]["tenant"] == "a"


def test_priority_header_needs_the_scope() -> None:
    """The key's class unless the key may choose with x-tiergate-priority."""
    batch = KeyPolicy(priority=BATCH, queue_weight=3.0)
    assert ticket_for(Principal("k", "t", batch), None) == Ticket("t", BATCH, 3.0)
    with pytest.raises(PermissionDenied):
        ticket_for(Principal("k", "t", batch), "interactive")
    allowed = Principal("k", "t", KeyPolicy(scopes=frozenset({SCOPE_PRIORITY})))
    assert ticket_for(allowed, "batch").priority == BATCH
    with pytest.raises(InvalidRequest):
        ticket_for(allowed, "urgent")


def test_queue_fields_round_trip_and_are_checked() -> None:
    """priority and queue_weight are stored only when set, and checked when read."""
    policy = policy_from_dict({"priority": "batch", "queue_weight": 0.5})
    assert policy_to_dict(policy)["priority"] == "batch"
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert "priority" not in policy_to_dict(KeyPolicy())
    for bad in ({"priority": "urgent"}, {"queue_weight": 0}, {"queue_weight": True}):
        with pytest.raises(ValueError, match=r"priority|queue_weight"):
            policy_from_dict(bad)


async def test_a_replica_back_in_rotation_takes_a_waiter_after_the_health_round() -> None:
    """Waiters do not wait for a release when a replica becomes usable again."""
    pool = ReplicaPool("fast", [URL, "http://10.0.0.2:8000"], 1, 5.0)
    busy, down = pool.replicas
    pool.lease(busy)
    down.healthy = False
    waiter = asyncio.create_task(pool.acquire(Ticket("a"), frozenset(), 5.0))
    await asyncio.sleep(0)
    down.healthy = True
    pool.refresh_context()  # what the health monitor calls after each round
    assert await asyncio.wait_for(waiter, 1.0) is down
    assert down.in_flight == 1


def test_the_tenant_view_is_bounded() -> None:
    """At most TOP_TENANTS tenants are remembered; a new one replaces the least notable."""
    stats = QueueStats(1.0)
    stats.waited(Ticket("big"), 5.0)
    for index in range(TOP_TENANTS + 50):
        stats.refused(Ticket(f"t{index}"), "full")
    assert len(stats.tenants) == TOP_TENANTS
    assert "big" in stats.tenants
    assert stats.top()["by_wait"][0]["tenant"] == "big"
    assert sum(stats.shed.values()) == TOP_TENANTS + 50  # the counts themselves are exact


async def test_the_queue_wait_counts_the_waiters_ahead_of_a_class() -> None:
    """An interactive request would wait behind interactive waiters only; a batch one behind
    all; with no drain seen yet, each waiter is assumed to hold a slot assumed_request_s."""
    pool, _ = full_pool()
    assert pool.queue_wait_s(BATCH, 1.0) == 0.0
    waiting = [
        asyncio.create_task(pool.acquire(Ticket("h", BATCH), frozenset(), 5.0)) for _ in range(3)
    ]
    waiting.append(asyncio.create_task(pool.acquire(Ticket("l"), frozenset(), 5.0)))
    await asyncio.sleep(0)
    assert pool.queue.ahead_of("interactive") == 1
    assert pool.queue.ahead_of(BATCH) == 4
    assert pool.queue_wait_s(BATCH, 0.5) == 2.0  # 4 waiters x 0.5 s over 1 slot
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert pool.queue.ahead_of(BATCH) == 0


async def test_spill_sees_the_gateway_queue_ahead_of_the_class() -> None:
    """A batch request's wait estimate includes the gateway's queue ahead of it (interactive
    ones skip batch waiters), so it spills up to an idle precise tier."""
    fast, _ = full_pool()
    precise = ReplicaPool("precise", ["http://10.0.0.9:8000"], 1, 5.0)
    spill = Spillover(SpilloverConfig(enabled=True, margin_s=0.25), fast, precise)
    waiting = [
        asyncio.create_task(fast.acquire(Ticket("h", BATCH), frozenset(), 5.0)) for _ in range(4)
    ]
    await asyncio.sleep(0)
    routed = RouteDecision(tier="fast", reason="classifier", score=0.1)
    batch = Principal("k", "h", KeyPolicy(priority=BATCH))
    assert spill.adjust(routed, batch).reason == "spill_up"
    # 4 batch waiters x 1 s over 1 slot: 4 s more for batch, nothing more for interactive
    assert spill.wait_s(fast, 0.0, BATCH) == spill.wait_s(fast, 0.0, "interactive") + 4.0
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
