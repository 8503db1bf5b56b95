"""Replica pools: leases, passive outlier ejection, Retry-After cool-downs, bounded waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.upstream.fair_queue import ANONYMOUS
from gateway.upstream.replicas import EjectionPolicy, ErrorRecord, Replica, ReplicaPool
from policies.errors import Overloaded

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def pool(urls: list[str] = URLS, *, max_s: float = 60.0) -> ReplicaPool:
    """A pool with ejection after 3 failures, 2 s base, ``max_s`` cap, half the tier at most."""
    policy = EjectionPolicy(eject_after=3, base_s=2.0, max_s=max_s, max_share=0.5)
    return ReplicaPool("fast", urls, 4, 0.2, policy)


def fail(p: ReplicaPool, replica: Replica, times: int, now: float, *, counts: bool = True) -> None:
    """Record ``times`` failures at ``now``."""
    for _ in range(times):
        p.record_failure(replica, "connect", "refused", counts=counts, now=now)


def test_names_never_carry_credentials() -> None:
    """A replica URL with user-info is shown as host:port only."""
    replica = Replica("fast", "http://user:secret@10.0.0.9:8000", 4)
    assert replica.name == "10.0.0.9:8000"


def test_consecutive_failures_eject() -> None:
    """N consecutive connection failures/5xx take the replica out for base_s."""
    p = pool()
    replica = p.replicas[0]
    fail(p, replica, 2, now=100.0)
    assert replica.available(100.0)
    fail(p, replica, 1, now=100.0)
    assert not replica.available(100.0)
    assert replica.state(100.0) == "ejected"
    assert replica.available(102.0)


def test_a_success_resets_the_count() -> None:
    """Failures must be consecutive: a success in between starts over."""
    p = pool()
    replica = p.replicas[0]
    fail(p, replica, 2, now=100.0)
    p.record_success(replica)
    fail(p, replica, 2, now=100.0)
    assert replica.available(100.0)


def test_client_errors_never_count() -> None:
    """Upstream 4xx are recorded but never eject."""
    p = pool()
    replica = p.replicas[0]
    fail(p, replica, 10, now=100.0, counts=False)
    assert replica.available(100.0)
    assert replica.outcomes["connect"] == 10


def test_ejection_time_grows_exponentially_and_is_capped() -> None:
    """Each new ejection doubles the time out, up to max_s."""
    p = pool(max_s=5.0)
    replica = p.replicas[0]
    durations = []
    now = 100.0
    for _ in range(4):
        fail(p, replica, 3, now=now)
        durations.append(replica.ejected_until - now)
        now = replica.ejected_until
    assert durations == [2.0, 4.0, 5.0, 5.0]


def test_never_more_than_the_share_is_ejected() -> None:
    """With max_share 0.5 only two of four replicas can be ejected at once."""
    p = pool()
    for replica in p.replicas:
        fail(p, replica, 3, now=100.0)
    assert sum(r.ejected(100.0) for r in p.replicas) == 2
    assert len(p.usable(100.0)) == 2


def test_a_single_replica_tier_is_never_ejected() -> None:
    """Ejecting the only replica would help nobody (health checks still apply)."""
    p = pool(URLS[:1])
    fail(p, p.replicas[0], 10, now=100.0)
    assert p.replicas[0].available(100.0)


def test_retry_after_cools_a_replica_down() -> None:
    """A Retry-After keeps the replica out for that long without counting as a failure."""
    p = pool()
    replica = p.replicas[0]
    p.record_failure(replica, "status_503", "busy", counts=False, retry_after=1.5, now=100.0)
    assert replica.state(100.0) == "cooldown"
    assert replica.consecutive_failures == 0
    assert p.ready_in(100.0) == 0.0  # the others are ready
    for other in p.replicas[1:]:
        p.record_failure(other, "status_503", "busy", counts=False, retry_after=3.0, now=100.0)
    assert p.ready_in(100.0) == pytest.approx(1.5)


def test_ready_in_is_none_without_a_healthy_replica() -> None:
    """When no replica is healthy nothing will become ready by waiting."""
    p = pool()
    for replica in p.replicas:
        replica.healthy = False
    assert p.ready_in(time.monotonic()) is None


async def test_bounded_wait_sheds_with_retry_after() -> None:
    """Waiting for a slot is bounded; then the caller gets Overloaded with Retry-After."""
    p = pool()
    started = time.monotonic()
    with pytest.raises(Overloaded) as caught:
        await p.acquire(ANONYMOUS, frozenset(), 0.1)
    assert time.monotonic() - started < 0.5
    assert caught.value.headers["Retry-After"] == "1"  # nothing drained: the longest wait, 1 s
    assert p.shed == 1
    assert p.queue.waiting == 0


async def test_a_returned_lease_is_handed_to_a_waiter() -> None:
    """Releasing a lease ends the wait early: the waiter holds the slot it was handed."""
    p = pool()
    replica = p.replicas[0]
    p.lease(replica)
    waiter = asyncio.create_task(p.acquire(ANONYMOUS, frozenset(), 5.0))
    await asyncio.sleep(0.01)
    p.release(replica)
    handed = await asyncio.wait_for(waiter, 1.0)
    assert handed is replica
    assert replica.in_flight == 1


def test_misconfigured_replicas_are_a_last_resort_and_not_ready() -> None:
    """A replica that refused the gateway's key is used only when nothing else is usable."""
    p = pool()
    first, *others = p.replicas
    p.mark_misconfigured(first, 401)
    assert first not in p.usable(0.0)
    assert first.state(0.0) == "misconfigured"
    assert p.ready()
    for replica in others:
        p.mark_misconfigured(replica, 403)
    assert not p.ready()
    assert len(p.usable(0.0)) == len(p.replicas)  # all misconfigured: any is fair
    p.record_success(first)
    assert p.usable(0.0) == [first]
    assert p.ready()


def test_unavailable_reasons_read_as_docs_backends_md_lists_them() -> None:
    """docs/backends.md, "Error messages": the four reasons a replica is named with."""
    replica = Replica("fast", "http://10.0.0.5:8080", 4)
    replica.healthy, replica.last_probe_error = False, "health check: /health answered 404"
    assert replica.unavailable_reason(100.0) == ("unhealthy (health check: /health answered 404)")
    replica.healthy = True
    replica.ejected_until = 112.0
    replica.recent_errors.append(ErrorRecord(0.0, "connect", "could not connect"))
    assert replica.unavailable_reason(100.0) == (
        "ejected for 12.0s after repeated failures (could not connect)"
    )
    replica.ejected_until, replica.cooldown_until = 0.0, 105.0
    assert replica.unavailable_reason(100.0) == "cooling down for 5.0s after a Retry-After"
    replica.cooldown_until, replica.in_flight = 0.0, 4
    assert replica.unavailable_reason(100.0) == "at its concurrency cap (4 of at most 4)"
    replica.in_flight = 3
    assert replica.unavailable_reason(100.0) is None
