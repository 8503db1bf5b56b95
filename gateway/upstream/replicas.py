"""The replicas of each tier: their state, their concurrency caps, leases, and ejection.

A lease is taken before an attempt and returned after it, so the gateway always knows its own
in-flight count per replica. When every eligible replica is at its cap the request joins the
tier's bounded queue (``fair_queue.py``): a returned lease is handed to one chosen waiter.
A waiter past its class's deadline, or one arriving at a full queue, is shed with 503 and a
``Retry-After`` from the rate the queue drains.

Passive outlier ejection: every attempt's outcome is recorded here. ``eject_after``
consecutive connection failures or 5xx answers eject the replica for ``base_s * 2**(n-1)``
seconds (``n`` = its recent ejections, capped at ``max_s``), but never more than
``max_share`` of the tier at once. Upstream 4xx never count against a replica. A ``Retry-After``
on a 429/503 puts the replica in a short cool-down instead.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import structlog

from gateway.upstream.fair_queue import (
    PUSHED_OUT,
    FairQueue,
    QueuePolicy,
    QueueStats,
    Ticket,
    Waiter,
)
from policies.errors import Overloaded

RECENT_ERRORS = 10
# A replica's seconds-per-token average (docs/replicas.md): a sample is clipped to within
# SPEED_CLIP times the average, weighs SPEED_UP when slower (slow only after several in a row)
# and SPEED_DOWN when faster (a healed replica recovers fast), or 1/n while it has n < 1/weight
# samples; the average counts from its SPEED_MIN_SAMPLES-th sample.
SPEED_UP, SPEED_DOWN, SPEED_CLIP, SPEED_MIN_SAMPLES = 0.1, 0.25, 2.0, 4
SHED_QUIET_S = 30.0  # a tier that shed nothing this long starts a new shedding spell
_log = structlog.get_logger("tiergate.health")


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    """When a replica is taken out of rotation by its own failures, and for how long."""

    eject_after: int = 5
    base_s: float = 2.0
    max_s: float = 60.0
    max_share: float = 0.5


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One recent failure of a replica (kinds and messages are ours, never secrets)."""

    at: float
    kind: str
    message: str


def _display_name(url: str) -> str:
    """host:port without any user-info, safe for labels, logs and the admin view."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}" if parts.port is not None else host


def _addresses(url: str) -> tuple[str, ...]:
    """How a backend may name itself in its own error texts: its host:port, and its host when
    that is an IP address or a dotted name (a single label is too likely an ordinary word)."""
    parts = urlsplit(url)
    host = parts.hostname
    if host is None:
        return ()
    named = [parts.netloc.rpartition("@")[2], _display_name(url)]
    if parts.port is not None:
        named.append(f"{host}:{parts.port}")
    if "." in host or ":" in host:
        named.append(host)
    return tuple(dict.fromkeys(n for n in named if n))


@dataclass(slots=True, eq=False)
class Replica:
    """One backend replica as the gateway sees it."""

    tier: str
    url: str
    max_concurrency: int
    name: str = ""
    # What callers' error messages call it: its tier and 1-based place in the tier's list
    # (``fast#2``). Its address (``name``) stays in logs, metrics and the admin view.
    label: str = ""
    # Its address as the backend may quote it (:func:`_addresses`): blanked, like the upstream
    # keys, from the backend's error texts before a caller sees them.
    addresses: tuple[str, ...] = ()
    # The tier's ``health_path`` (an override) and ``kind`` setting (``auto`` or a kind name).
    health_override: str | None = None
    kind_setting: str = "auto"
    # What is known: the kind (``None`` until ``auto`` found out), why, the route probed.
    kind: str | None = None
    detection: str = ""
    probe_path: str | None = None
    resolved: bool = False
    detections: int = 0  # ``auto`` detections since it was last reachable (a cold peer: slow)
    last_probe_error: str = ""
    in_flight: int = 0
    # When it last sent a byte of an answer; when it was last given work while it owed the
    # gateway nothing (a request while idle, after answering the ones before: a request that
    # was given up on unanswered does not start the clock again); and how long after the later
    # of the two a probe timeout with requests in flight still means "busy", not "gone": its
    # tier's longest wait for a byte.
    heard_at: float = 0.0
    owed_at: float = 0.0
    busy_s: float = 60.0
    healthy: bool = True
    ejected_until: float = 0.0
    cooldown_until: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prefix_hit_rate: float | None = None
    # Its speed as the gateway saw it: a moving average of the decode seconds per token of
    # its finished streams (0: no data yet), their count, when the last came (perf_counter());
    # ``token_s``, what strategies read (policies.selection.slowness), is that average pulled
    # toward the tier's fastest the longer it went without an answer (decay_speeds).
    token_avg: float = 0.0
    token_n: int = 0
    token_at: float = 0.0
    token_s: float = 0.0
    # Capacity signals (gateway.upstream.signals): requests the engine holds waiting for
    # capacity (``None``: not reported), its finished-request counter and the drain rate seen
    # between scrapes, whether it refused requests at admission since the last scrape, the
    # most it was seen running while full, and the gateway's slot count from all of these.
    waiting_capacity: float | None = None
    finished_total: float | None = None
    finished_at: float = 0.0
    drain_per_s: float = 0.0
    rejections_total: float | None = None
    rejecting: bool = False
    engine_slots: int | None = None
    slots: int = 0
    # vLLM's GET /load between scrapes: requests in flight there (``None``: not read since the
    # last scrape), and whether it tracks them (``None``: not known yet).
    server_load: float | None = None
    load_tracked: bool | None = None
    # Read from the server itself: its context length (``max_model_len`` in ``/v1/models``)
    # and vLLM's ``engine_sleep_state`` (``None``: not reported; anything but "awake": asleep).
    max_model_len: int | None = None
    models_read_at: float = 0.0
    sleep_state: str | None = None
    checked: bool = False
    check_failures: int = 0
    check_successes: int = 0
    last_check_at: float = 0.0
    scraped_at: float = 0.0
    scrape_misses: int = 0  # failed /metrics scrapes in a row
    consecutive_failures: int = 0
    ejections: int = 0
    ejections_total: int = 0
    last_ejected_at: float = 0.0
    # The backend refused the gateway's credentials (401/403): a configuration error, cleared
    # by the next successful attempt. Such a replica is tried only when no other is usable.
    misconfigured: bool = False
    outcomes: Counter[str] = field(default_factory=Counter)
    # Streams it answered 200 that ended before the answer was finished, by cause.
    truncated: Counter[str] = field(default_factory=Counter)
    recent_errors: deque[ErrorRecord] = field(default_factory=lambda: deque(maxlen=RECENT_ERRORS))

    def __post_init__(self) -> None:
        if not self.name:
            self.name = _display_name(self.url)
        if not self.label:
            self.label = f"{self.tier}#?"
        if not self.addresses:
            self.addresses = _addresses(self.url)
        if self.kind_setting != "auto":
            self.kind = self.kind_setting
        if not self.slots:
            self.slots = self.max_concurrency

    @property
    def health_path(self) -> str:
        """The route its health is probed on (the kind's default until it is resolved)."""
        if self.probe_path is not None:
            return self.probe_path
        return self.health_override or "/health"

    def unavailable_reason(self, now: float) -> str | None:
        """Why it cannot take a request now, in words for an error message; ``None``: it can."""
        if not self.healthy:
            return f"unhealthy ({self.last_probe_error or 'failed its health checks'})"
        if self.ejected(now):
            return (
                f"ejected for {self.ejected_until - now:.1f}s after repeated failures"
                f" ({self._last_error()})"
            )
        if now < self.cooldown_until:
            return f"cooling down for {self.cooldown_until - now:.1f}s after a Retry-After"
        if not self.has_capacity:
            return f"at its concurrency cap ({self.slots} of at most {self.max_concurrency})"
        return None

    def _last_error(self) -> str:
        return self.recent_errors[-1].message if self.recent_errors else "no detail"

    def busy(self, now: float) -> bool:
        """Serving the gateway's requests and heard from within ``busy_s``: alive, whatever a
        probe says (a probe that times out then is not counted, or not sent at all)."""
        return self.in_flight > 0 and now - max(self.heard_at, self.owed_at) < self.busy_s

    def ejected(self, now: float) -> bool:
        """Taken out of rotation by passive outlier detection right now."""
        return now < self.ejected_until

    def available(self, now: float) -> bool:
        """Healthy, not ejected, not cooling down after a Retry-After."""
        return self.healthy and now >= self.ejected_until and now >= self.cooldown_until

    @property
    def has_capacity(self) -> bool:
        """Below its slot count: ``max_concurrency`` or less where the replica reports itself
        full (:func:`gateway.upstream.signals.refresh_slots`)."""
        return self.in_flight < self.slots

    def state(self, now: float) -> str:
        """One word for the admin view: healthy, unhealthy, ejected or cooldown."""
        if not self.healthy:
            return "unhealthy"
        if self.misconfigured:
            return "misconfigured"
        if self.ejected(now):
            return "ejected"
        if now < self.cooldown_until:
            return "cooldown"
        return "healthy"


class ReplicaPool:
    """The replicas of one tier with a bounded wait for a free slot."""

    def __init__(
        self,
        tier: str,
        urls: Iterable[str],
        max_concurrency: int,
        max_queue_wait_s: float,
        ejection: EjectionPolicy | None = None,
        *,
        health_path: str | None = None,
        kind: str = "auto",
        busy_s: float = 60.0,
        queue: QueueSetup | None = None,
        speed_half_life_s: float = 5.0,
    ) -> None:
        self.tier = tier
        self.replicas = [
            Replica(
                tier,
                url,
                max_concurrency,
                health_override=health_path,
                kind_setting=kind,
                busy_s=busy_s,
                label=f"{tier}#{place}",
            )
            for place, url in enumerate(urls, 1)
        ]
        self.max_queue_wait_s = max_queue_wait_s
        self.ejection = ejection or EjectionPolicy()
        self.retries: Counter[str] = Counter()
        self.shed = 0
        self.context_len: int | None = None
        self._rr = itertools.count()
        setup = queue or QueueSetup()
        self.queue = FairQueue(setup.policy, setup.max_length)
        # Batch requests hold at most this many slots (headroom for interactive ones): a share
        # of the healthy replicas' slots, refreshed after each health round.
        self.batch_share = setup.batch_max_share
        self.batch_cap = batch_cap(self.batch_share, len(self.replicas) * max_concurrency)
        self.batch_in_flight = 0
        self.class_waits = {
            p: setup.waits.get(p, max_queue_wait_s) for p in ("interactive", "batch")
        }
        self.queue_stats = QueueStats(max(self.class_waits.values()))
        self._drained: deque[float] = deque(maxlen=64)  # when waiters were handed slots
        self._shed_at = -math.inf
        self.speed_half_life_s = speed_half_life_s

    def usable(self, now: float, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        """Replicas that are up and not excluded (already tried by this request).

        Misconfigured replicas (credentials refused) only when no other one is usable.
        """
        usable = [r for r in self.replicas if r.url not in exclude and r.available(now)]
        configured = [r for r in usable if not r.misconfigured]
        return configured or usable

    def ready_in(self, now: float) -> float | None:
        """Seconds until some healthy replica leaves ejection or cool-down (0: one is ready).

        ``None`` when no replica is healthy at all.
        """
        waits = [
            max(0.0, r.ejected_until - now, r.cooldown_until - now)
            for r in self.replicas
            if r.healthy
        ]
        return min(waits) if waits else None

    def next_index(self) -> int:
        """A shared round-robin counter."""
        return next(self._rr)

    def batch_full(self, ticket: Ticket) -> bool:
        """``ticket`` is batch and its class holds its share of the tier's slots already."""
        return ticket.batch and self.batch_in_flight >= self.batch_cap

    def lease(self, replica: Replica, *, batch: bool = False) -> None:
        """Count one more request in flight on ``replica`` (``batch``: of the batch class)."""
        if replica.in_flight == 0 and replica.heard_at >= replica.owed_at:
            replica.owed_at = time.monotonic()  # it owed the gateway nothing until now
        replica.in_flight += 1
        self.batch_in_flight += batch

    def release(self, replica: Replica, *, batch: bool = False) -> None:
        """Return a lease; with waiters queued, hand free slots to them."""
        replica.in_flight -= 1
        self.batch_in_flight -= batch
        if self.queue.waiting:
            self.dispatch()

    def dispatch(self) -> None:
        """Hand each free slot of an available replica to the next waiter that may use it."""
        now = time.monotonic()
        queue = self.queue
        # Misconfigured replicas only when no other is up, as for a request that need not wait.
        configured = any(not r.misconfigured and r.available(now) for r in self.replicas)
        for replica in self.replicas:
            if not replica.available(now) or (replica.misconfigured and configured):
                continue
            while queue.waiting and replica.has_capacity:
                waiter = queue.pop(replica.url, batch=self.batch_in_flight < self.batch_cap)
                if waiter is None:
                    break
                self.lease(replica, batch=waiter.ticket.batch)
                waiter.future.set_result(replica)
                self._drained.append(now)

    # -- outcomes -----------------------------------------------------------------------------

    def record_success(self, replica: Replica) -> None:
        """An attempt got its answer (or its first streamed event)."""
        replica.heard_at = time.monotonic()
        replica.outcomes["success"] += 1
        replica.consecutive_failures = 0
        replica.misconfigured = False

    @staticmethod
    def record_speed(replica: Replica, seconds: float, tokens: int, now: float) -> None:
        """A finished stream decoded ``tokens`` tokens after its first in ``seconds``: the
        sample moves the replica's seconds-per-token average (``SPEED_*``)."""
        if tokens <= 0:
            return
        sample, avg, n = seconds / tokens, replica.token_avg, replica.token_n + 1
        if avg > 0:
            sample = min(max(sample, avg / SPEED_CLIP), avg * SPEED_CLIP)
        avg += max(SPEED_UP if sample > avg else SPEED_DOWN, 1 / n) * (sample - avg)
        replica.token_avg, replica.token_n, replica.token_at = avg, n, now
        if n >= SPEED_MIN_SAMPLES:
            replica.token_s = avg

    def decay_speeds(self, now: float) -> None:
        """Set each replica's ``token_s``: its average, moved toward the fastest average by
        half the distance per ``speed_half_life_s`` since its last answer (called after each
        health round).

        A replica found slow gets little traffic, so its average would never learn that it
        is fast again: after a half-life or two it counts as close to the fastest, is sent
        a request, and that answer resets the clock (a slow one is avoided again, a healed
        one moves its average toward its new speed). Replicas with no data stay without
        (strategies count them as the mean).
        """
        known = [r.token_avg for r in self.replicas if r.token_n >= SPEED_MIN_SAMPLES]
        if len(known) < 2:  # one speed has nothing to decay toward
            return
        best = min(known)
        for replica in self.replicas:
            if replica.token_n < SPEED_MIN_SAMPLES:
                continue
            avg = replica.token_avg
            keep = 0.5 ** (max(0.0, now - replica.token_at) / self.speed_half_life_s)
            replica.token_s = best + (avg - best) * keep if avg > best else avg

    def mark_misconfigured(self, replica: Replica, status: int) -> None:
        """The backend refused the gateway's credentials (see ``Replica.misconfigured``).

        One warning when the replica becomes misconfigured (never the key itself).
        """
        if not replica.misconfigured:
            _log.warning(
                "replica.misconfigured",
                tier=replica.tier,
                replica=replica.name,
                status=status,
                reason="the backend refused the gateway's credentials",
            )
        replica.misconfigured = True

    def refresh_context(self) -> None:
        """Set ``context_len``: the smallest context length its replicas reported (``None``
        when none did), and ``batch_cap`` from the healthy replicas' slots. Called after each
        health round, so requests read one attribute; then free slots of replicas back in
        rotation go to waiters; with no healthy replica left, the waiters are refused now (a
        fallback tier may serve them), not at their deadline."""
        known = [r.max_model_len for r in self.replicas if r.max_model_len is not None]
        self.context_len = min(known) if known else None
        healthy = sum(r.max_concurrency for r in self.replicas if r.healthy)
        self.batch_cap = batch_cap(self.batch_share, healthy)
        if not self.queue.waiting:
            return
        if self.ready_in(time.monotonic()) is None:
            while (waiter := self.queue.pop("")) is not None:  # "": excluded by nobody
                waiter.future.set_result(None)  # acquire() refuses it
        else:  # a replica back in rotation takes waiters at once
            self.dispatch()

    def ready(self) -> bool:
        """Some replica is healthy and not misconfigured."""
        return any(r.healthy and not r.misconfigured for r in self.replicas)

    def record_failure(
        self,
        replica: Replica,
        kind: str,
        message: str,
        *,
        counts: bool,
        retry_after: float | None = None,
        now: float | None = None,
    ) -> None:
        """An attempt failed; ``counts`` is False for upstream 4xx, which never count."""
        now = time.monotonic() if now is None else now
        replica.outcomes[kind] += 1
        replica.recent_errors.append(ErrorRecord(time.time(), kind, message[:200]))
        if retry_after is not None and retry_after > 0:
            replica.cooldown_until = max(replica.cooldown_until, now + retry_after)
        if not counts:
            return
        replica.consecutive_failures += 1
        if replica.consecutive_failures >= self.ejection.eject_after:
            self._eject(replica, now)

    def count_retry(self, reason: str) -> None:
        """One retry on this tier, by the failure kind that caused it."""
        self.retries[reason] += 1

    def _eject(self, replica: Replica, now: float) -> bool:
        policy = self.ejection
        if replica.ejected(now):
            return False
        ejected = sum(1 for r in self.replicas if r.ejected(now))
        if ejected + 1 > int(policy.max_share * len(self.replicas)):
            return False
        if now - replica.last_ejected_at > 2 * policy.max_s:
            replica.ejections = 0  # a long good spell forgives earlier ejections
        replica.ejections += 1
        duration = min(policy.max_s, policy.base_s * 2 ** (replica.ejections - 1))
        replica.ejected_until = now + duration
        replica.last_ejected_at = now
        replica.consecutive_failures = 0
        replica.ejections_total += 1
        return True

    # -- saturation ---------------------------------------------------------------------------

    async def acquire(self, ticket: Ticket, exclude: frozenset[str], wait_s: float) -> Replica:
        """Queue for a slot (bounded by ``wait_s``); the replica whose slot was handed over,
        leased. Raises Overloaded when the queue is full or the wait runs out."""
        if wait_s <= 0:
            raise self.overloaded(ticket, "deadline")
        waiter = self.queue.push(ticket, exclude)
        if waiter is None:
            raise self.overloaded(ticket, "full")
        started = time.monotonic()
        try:
            async with asyncio.timeout(wait_s):
                await waiter.future
        except TimeoutError:
            if not _handed(waiter):
                self.queue.drop(waiter)
                raise self.overloaded(ticket, "deadline") from None
        except BaseException:  # cancelled
            if _handed(waiter):  # handed a slot, then cancelled: pass it on
                self.release(_replica(waiter), batch=ticket.batch)
            self.queue.drop(waiter)
            raise
        handed = waiter.future.result()
        if handed is PUSHED_OUT:  # a lighter tenant took its place in the full queue
            raise self.overloaded(ticket, "full")
        if handed is None:  # the tier went down while it waited
            raise self.overloaded(ticket, "down")
        self.queue_stats.waited(ticket, time.monotonic() - started)
        return _replica(waiter)

    def wait_for(self, ticket: Ticket) -> float:
        """The longest a request of ``ticket``'s class waits for a slot."""
        return self.class_waits.get(ticket.priority, self.max_queue_wait_s)

    def drain_per_s(self) -> float | None:
        """Slots handed to waiters a second lately (``None``: none in the last minute)."""
        drained = self._drained
        if len(drained) >= 2 and time.monotonic() - drained[0] < 60:
            return (len(drained) - 1) / max(drained[-1] - drained[0], 1e-3)
        return None

    def queue_wait_s(self, priority: str, assumed_request_s: float) -> float:
        """Seconds a new request of class ``priority`` would wait in the queue at worst: the
        waiters ahead of it over the drain rate (unknown: ``assumed_request_s`` per waiter,
        spread over the tier's slots)."""
        ahead = self.queue.ahead_of(priority)
        if not ahead:
            return 0.0
        rate = self.drain_per_s()
        if rate is None:
            slots = sum(r.max_concurrency for r in self.replicas)
            return ahead * assumed_request_s / max(slots, 1)
        return ahead / rate

    def retry_after(self) -> int:
        """Seconds until the queue ahead has drained at the rate slots were handed out lately
        (1 to 60; the longest wait when no slot was handed out lately)."""
        rate = self.drain_per_s()
        if rate is not None:
            return int(min(60, max(1, math.ceil((self.queue.waiting + 1) / rate))))
        return int(min(60, max(1, math.ceil(max(self.class_waits.values())))))

    def overloaded(self, ticket: Ticket | None = None, reason: str = "deadline") -> Overloaded:
        """The error a caller sees when the tier is saturated (counted, logged once a spell)."""
        self.shed += 1
        if ticket is not None:
            self.queue_stats.refused(ticket, reason)
        now = time.monotonic()
        if now - self._shed_at > SHED_QUIET_S:
            _log.warning(
                "tier.shedding",
                tier=self.tier,
                reason=reason,
                waiting=self.queue.waiting,
                in_flight=sum(r.in_flight for r in self.replicas),
            )
        self._shed_at = now
        state = "has no healthy replica" if reason == "down" else "is at capacity"
        return Overloaded(
            f"The '{self.tier}' tier {state}; retry shortly.",
            headers={"Retry-After": str(self.retry_after())},
        )


@dataclass(frozen=True, slots=True)
class QueueSetup:
    """A tier's queue: its order, length and each class's longest wait (others: the tier's)."""

    policy: QueuePolicy = "fair"
    max_length: int = 1024
    waits: Mapping[str, float] = field(default_factory=dict)
    batch_max_share: float = 1.0


def batch_cap(share: float, slots: int) -> float:
    """Slots batch requests may hold of ``slots``: at least one; no cap at share 1."""
    return math.inf if share >= 1 else max(1, math.floor(share * slots))


def _handed(waiter: Waiter) -> bool:
    future = waiter.future
    return future.done() and not future.cancelled() and isinstance(future.result(), Replica)


def _replica(waiter: Waiter) -> Replica:
    replica = waiter.future.result()
    assert isinstance(replica, Replica)  # noqa: S101  # only dispatch resolves it
    return replica
