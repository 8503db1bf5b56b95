"""Who gets a tier's next free slot: a bounded queue, fair across tenants, by priority class.

A request that finds every replica of its tier at its cap joins the tier's :class:`FairQueue`
as a waiter. A freed slot is *handed* to exactly one waiter (leased on its behalf, then its
future resolved), so nothing races for it and a request arriving meanwhile cannot take it.

Order (policy ``fair``): the ``interactive`` class before ``batch`` (strict), and within a
class start-time fair queuing across tenants: a waiter's tag is ``max(class clock, tenant's
last finish)``, its tenant's finish then advances by ``1 / weight``; the smallest tag is served
and the class clock moves to it. A tenant with many waiters thus gets its weighted share and
one with few is served at once. A tenant that stops waiting keeps no credit. Policy ``fifo``
serves in arrival order, ignoring class and tenant (the behaviour before fair queuing).

A full queue (``max_length`` waiters) refuses a newcomer only when it would hold as many
places as anyone: otherwise the newcomer takes the place of the newest waiter of the flow
holding the most (a lower class's first), which is refused in its stead. So one tenant that
fills the queue cannot shut the others out (under ``fifo`` the newcomer is refused).

Headroom (``batch_max_share`` below 1): batch requests hold at most that share of a tier's
slots, so an interactive arrival finds a free one; below the cap batch takes any free slot.

Exact within one worker process: each worker has its own slots (``max_concurrency`` per
replica per worker) and its own queue.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from policies.errors import InvalidRequest, PermissionDenied
from policies.principal import SCOPE_PRIORITY, Principal

INTERACTIVE: Final = "interactive"
BATCH: Final = "batch"
PRIORITIES: Final = (INTERACTIVE, BATCH)
PRIORITY_HEADER: Final = "x-tiergate-priority"
QueuePolicy = Literal["fair", "fifo"]
# Queue-wait histogram bounds (seconds); the tier's longest allowed wait is added when above.
WAIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOP_TENANTS: Final = 1000  # tenants remembered per tier for the admin view


class Ticket(NamedTuple):
    """Who is waiting: the tenant (the fairness flow), its priority class and weight."""

    tenant: str
    priority: str = INTERACTIVE
    weight: float = 1.0

    @property
    def batch(self) -> bool:
        """Of the batch class (held to its share of slots under headroom)."""
        return self.priority == BATCH


ANONYMOUS: Final = Ticket("-")
# What a waiter is resolved with when a newcomer of a lighter flow took its place.
PUSHED_OUT: Final = "pushed-out"


def ticket_for(principal: Principal, header: str | None) -> Ticket:
    """The caller's ticket: the key's class and weight; ``x-tiergate-priority`` only for keys
    with the ``priority`` scope (403 otherwise, 400 for an unknown class)."""
    policy = principal.policy
    priority = policy.priority
    if header:
        if not policy.has_scope(SCOPE_PRIORITY):
            raise PermissionDenied(
                f"This key may not set the {PRIORITY_HEADER} header.", code="priority_not_allowed"
            )
        if header not in PRIORITIES:
            raise InvalidRequest(
                f"The {PRIORITY_HEADER} header must be one of {', '.join(PRIORITIES)}.",
                param=PRIORITY_HEADER,
            )
        priority = header
    return Ticket(principal.tenant, priority, policy.queue_weight)


class Waiter:
    """One queued request: resolved with the replica whose slot it was handed."""

    __slots__ = ("exclude", "flow", "future", "queued", "ticket")

    def __init__(self, ticket: Ticket, exclude: frozenset[str], flow: tuple[int, str]) -> None:
        self.ticket = ticket
        self.exclude = exclude
        self.flow = flow
        self.future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.queued = True


class FairQueue:
    """The waiters of one tier, bounded, served one at a time in policy order."""

    def __init__(self, policy: QueuePolicy = "fair", max_length: int = 1024) -> None:
        self.policy = policy
        self.max_length = max_length
        self.waiting = 0
        self.by_class = [0] * len(PRIORITIES)  # waiters per class rank (fifo: all in rank 0)
        self._heap: list[tuple[int, float, int, Waiter]] = []
        self._finish: dict[tuple[int, str], float] = {}
        self._flows: Counter[tuple[int, str]] = Counter()
        self._clock = [0.0] * len(PRIORITIES)
        self._seq = itertools.count()

    def push(self, ticket: Ticket, exclude: frozenset[str]) -> Waiter | None:
        """Queue a waiter; ``None`` when the queue is full and the newcomer may take no
        one's place (a waiter pushed out is resolved with :data:`PUSHED_OUT`)."""
        rank = PRIORITIES.index(ticket.priority) if self.policy == "fair" else 0
        flow = (rank, ticket.tenant if self.policy == "fair" else "")
        if self.waiting >= self.max_length:
            victim = self._displaced_by(flow)
            if victim is None:
                return None
            self.drop(victim)
            victim.future.set_result(PUSHED_OUT)
        start = max(self._clock[rank], self._finish.get(flow, 0.0))
        self._finish[flow] = start + 1.0 / ticket.weight if self.policy == "fair" else 0.0
        waiter = Waiter(ticket, exclude, flow)
        heapq.heappush(self._heap, (rank, start, next(self._seq), waiter))
        self._flows[flow] += 1
        self.waiting += 1
        self.by_class[rank] += 1
        return waiter

    def _displaced_by(self, flow: tuple[int, str]) -> Waiter | None:
        """The waiter a newcomer of ``flow`` takes the place of in a full queue: the newest of
        the flow with the most waiters in the lowest class below the newcomer's, else in its
        own class if that flow holds two more than the newcomer's; ``None`` otherwise."""
        own = self._flows.get(flow, 0)
        candidates = [
            (f[0], count, f)
            for f, count in self._flows.items()
            if f[0] > flow[0] or (f[0] == flow[0] and count > own + 1)
        ]
        if not candidates:
            return None
        heaviest = max(candidates)[2]
        waiters = [
            (start, seq, waiter)
            for _, start, seq, waiter in self._heap
            if waiter.flow == heaviest and waiter.queued and not waiter.future.done()
        ]
        return max(waiters, key=lambda entry: entry[:2])[2] if waiters else None

    def ahead_of(self, priority: str) -> int:
        """Waiters a new request of class ``priority`` would find ahead of it at worst."""
        if self.policy != "fair":
            return self.waiting
        return sum(self.by_class[: PRIORITIES.index(priority) + 1])

    def pop(self, url: str, *, batch: bool = True) -> Waiter | None:
        """The next waiter that may use replica ``url`` (taken off the queue), or ``None``;
        ``batch`` False passes over batch waiters (their class holds its share of slots)."""
        heap = self._heap
        skipped: list[tuple[int, float, int, Waiter]] = []
        found: Waiter | None = None
        while heap:
            entry = heapq.heappop(heap)
            waiter = entry[3]
            if not waiter.queued:
                continue  # left already (timed out or cancelled)
            if waiter.future.done() or url in waiter.exclude:
                skipped.append(entry)
                continue
            if not batch and waiter.ticket.batch:
                skipped.append(entry)
                if entry[0]:  # fair: only batch waiters are left behind this one
                    break
                continue
            self._clock[entry[0]] = entry[1]
            self.drop(waiter)
            found = waiter
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def drop(self, waiter: Waiter) -> None:
        """Take ``waiter`` off the queue (served, timed out or cancelled); idempotent."""
        if not waiter.queued:
            return
        waiter.queued = False
        self.waiting -= 1
        flow = waiter.flow
        self.by_class[flow[0]] -= 1
        self._flows[flow] -= 1
        if self._flows[flow] <= 0:
            del self._flows[flow]
            self._finish.pop(flow, None)  # an idle tenant keeps no credit
        if len(self._heap) > 2 * self.waiting + 64:  # drop the entries of waiters gone
            self._heap = [e for e in self._heap if e[3].queued]
            heapq.heapify(self._heap)


class WaitHistogram:
    """Queue waits of one priority class: cumulative-ready bucket counts, count and sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one wait."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


def wait_buckets(max_wait_s: float) -> tuple[float, ...]:
    """The histogram bounds reaching ``max_wait_s``."""
    bounds = [b for b in WAIT_BUCKETS if b < max_wait_s]
    return (*bounds, max_wait_s) if max_wait_s > 0 else WAIT_BUCKETS


@dataclass(slots=True)
class TenantTally:
    """Queue waits and refusals of one tenant on one tier."""

    waited_s: float = 0.0
    waits: int = 0
    refused: int = 0


@dataclass(slots=True)
class QueueStats:
    """What a tier's queue did, for ``/metrics`` and ``/admin/queue`` (no tenant labels)."""

    max_wait_s: float
    waits: dict[str, WaitHistogram] = field(default_factory=dict)
    shed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (class, reason)
    tenants: dict[str, TenantTally] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.waits = {p: WaitHistogram(wait_buckets(self.max_wait_s)) for p in PRIORITIES}

    def waited(self, ticket: Ticket, seconds: float) -> None:
        """A queued request was handed a slot after ``seconds``."""
        self.waits[ticket.priority].observe(seconds)
        tally = self._tally(ticket.tenant)
        tally.waited_s += seconds
        tally.waits += 1

    def refused(self, ticket: Ticket, reason: str) -> None:
        """A request was shed: ``full`` (queue full) or ``deadline`` (waited its longest)."""
        self.shed[ticket.priority, reason] += 1
        self._tally(ticket.tenant).refused += 1

    def _tally(self, tenant: str) -> TenantTally:
        tallies = self.tenants
        tally = tallies.get(tenant)
        if tally is None:
            if len(tallies) >= TOP_TENANTS:  # bounded: forget the least notable tenant
                least = min(tallies, key=lambda t: tallies[t].waited_s + tallies[t].refused)
                del tallies[least]
            tally = tallies[tenant] = TenantTally()
        return tally

    def top(self, count: int = 10) -> dict[str, list[dict[str, object]]]:
        """The tenants that waited longest in all and those refused most."""

        def row(tenant: str) -> dict[str, object]:
            t = self.tenants[tenant]
            return {
                "tenant": tenant,
                "waited_s": round(t.waited_s, 3),
                "waits": t.waits,
                "refused": t.refused,
            }

        by_wait = sorted(self.tenants, key=lambda t: -self.tenants[t].waited_s)[:count]
        by_refusal = sorted(self.tenants, key=lambda t: -self.tenants[t].refused)[:count]
        return {
            "by_wait": [row(t) for t in by_wait if self.tenants[t].waits],
            "by_refusals": [row(t) for t in by_refusal if self.tenants[t].refused],
        }
