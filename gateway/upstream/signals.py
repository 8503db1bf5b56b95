"""What a replica says about its own capacity, and what the gateway derives from it.

Read from each health round's ``/metrics`` page (no extra request; with
``health.metrics_every`` N, every Nth round, and vLLM's cheaper ``GET /load`` between): vLLM's
``vllm:num_requests_waiting_by_reason{reason="capacity"}`` (only *capacity* means the engine is
full; *deferred* requests wait for something else), ``vllm:admission_rejections`` (the
engine's own 503s) and ``vllm:request_success_total`` (finished requests, whose rise between
two scrapes is the replica's drain rate). A server without the by-reason gauge counts its
whole ``waiting`` as waiting for capacity.

From them, per replica:

- **slots** (:func:`refresh_slots`): how many of the gateway's requests it takes at once. At
  most the tier's ``max_concurrency``; once the replica was seen full (requests waiting for
  capacity), at most what it ran then (``engine_slots``), raised again by a quarter each round
  in which the gateway filled it and nothing waited; and while requests wait for capacity,
  none beyond the gateway's in-flight count then less those waiting — a replica reporting
  capacity-waiting counts as full.
- **wait** (:func:`replica_wait_s`): seconds a new request would wait before it starts: the
  requests ahead of it (the engine's running and capacity-waiting, or the gateway's own
  in-flight count when higher, beyond what it runs at once: ``engine_slots`` where learnt,
  else ``max_concurrency``) over the drain rate (or, before a drain was
  seen, ``assumed_request_s`` each). A tier's wait is its best usable replica's
  (:func:`tier_wait_s`); spill across tiers compares them (gateway/routing/spillover.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from gateway.upstream.replicas import Replica

LOAD_PATH = "/load"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_REJECTIONS = "vllm:admission_rejections"
_FINISHED = "vllm:request_success_total"
# Weight of the newest drain-rate sample (one per scrape) in the moving average.
_DRAIN_WEIGHT = 0.3
# How much a replica's learnt slot count grows in a round it was filled without a queue.
_GROWTH = 1.25


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One ``/metrics`` page's capacity samples, summed over engines; ``None``: absent."""

    waiting_capacity: float | None = None
    waiting_deferred: float | None = None
    rejections: float | None = None
    finished: float | None = None


def sample_line(line: str) -> tuple[str, str, float] | None:
    """``(name, labels, value)`` of one Prometheus exposition line; ``None`` for comments and
    junk (a count or ratio that is NaN, infinite or negative is junk: no server runs -5 or
    +Inf requests). The one sample parser of the health round's ``/metrics`` reads."""
    if not line or line[0] == "#":
        return None
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            return None
        name, labels, fields = line[:brace], line[brace + 1 : close], line[close + 1 :].split()
    else:
        name, *fields = line.split()
        labels = ""
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return (name.strip(), labels, value) if math.isfinite(value) and value >= 0 else None


def parse_signals(page: str) -> EngineSignals:
    """The capacity samples of a vLLM ``/metrics`` page."""
    totals: dict[str, float] = {}
    for line in page.splitlines():
        if not line.startswith("vllm:") or not line.startswith(
            (_WAITING_BY_REASON, _REJECTIONS, _FINISHED)
        ):
            continue
        sample = sample_line(line)
        if sample is None:
            continue
        name, labels, value = sample
        if name == _WAITING_BY_REASON:
            if 'reason="capacity"' in labels:
                name = "waiting_capacity"
            elif 'reason="deferred"' in labels:
                name = "waiting_deferred"
            else:
                continue
        elif name not in (_REJECTIONS, _FINISHED):
            continue
        totals[name] = totals.get(name, 0.0) + value
    totals = {name: value for name, value in totals.items() if math.isfinite(value)}
    return EngineSignals(
        waiting_capacity=totals.get("waiting_capacity"),
        waiting_deferred=totals.get("waiting_deferred"),
        rejections=totals.get(_REJECTIONS),
        finished=totals.get(_FINISHED),
    )


def parse_load(body: bytes) -> float | None:
    """``server_load`` of a ``GET /load`` answer; ``None`` when it is not one."""
    try:
        value = msgspec.json.decode(body).get("server_load")
    except (msgspec.DecodeError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def absorb_load(replica: Replica, load: float | None) -> bool:
    """Fold a ``/load`` reading into ``replica``; False when it shows that the replica does not
    track its load (no answer, or 0 while the gateway has requests there): from then on only
    ``/metrics`` is read."""
    if load is None or (load == 0 and replica.in_flight > 0):
        replica.load_tracked = False
        replica.server_load = None
        return False
    if load > 0:
        replica.load_tracked = True
    replica.server_load = load
    refresh_slots(replica)
    return True


def capacity_waiting(replica: Replica) -> float:
    """Requests the replica holds waiting for capacity (all it holds waiting when it does not
    say why; with a ``/load`` reading newer than the scrape, what it holds beyond its size)."""
    reported = replica.waiting_capacity
    waiting = replica.waiting if reported is None else reported
    load, size = replica.server_load, replica.engine_slots
    if load is not None and size is not None:
        return max(waiting, load - size)
    return waiting


def absorb(replica: Replica, signals: EngineSignals, now: float) -> None:
    """Fold one scrape's signals into ``replica`` (after its running/waiting were read)."""
    finished = signals.finished
    if finished is not None:
        before, at = replica.finished_total, replica.finished_at
        if before is not None and now > at and finished >= before:
            rate = (finished - before) / (now - at)
            drain = replica.drain_per_s
            if math.isfinite(rate):  # a counter that leapt to 1e308: no rate (inf, then NaN)
                replica.drain_per_s = drain + _DRAIN_WEIGHT * (rate - drain) if drain else rate
        replica.finished_total, replica.finished_at = finished, now
    rejections = signals.rejections
    if rejections is not None:
        before_rejections = replica.rejections_total
        replica.rejecting = before_rejections is not None and rejections > before_rejections
        replica.rejections_total = rejections
    replica.waiting_capacity = signals.waiting_capacity
    replica.server_load = None  # the scrape is newer
    waiting = capacity_waiting(replica)
    if waiting > 0 and replica.running >= 1:
        replica.engine_slots = int(replica.running)  # what it runs when it is full
    elif replica.engine_slots is not None and replica.in_flight >= replica.engine_slots:
        replica.engine_slots = math.ceil(replica.engine_slots * _GROWTH)  # filled, no queue
    refresh_slots(replica)


def refresh_slots(replica: Replica) -> None:
    """Set ``replica.slots`` from its setting and its signals (see the module docstring)."""
    slots = replica.max_concurrency
    if replica.engine_slots is not None:
        slots = min(slots, replica.engine_slots)
    waiting = capacity_waiting(replica)
    if waiting > 0 or replica.rejecting:
        slots = min(slots, max(0, replica.in_flight - math.ceil(waiting)))
    replica.slots = slots


def replica_wait_s(replica: Replica, assumed_request_s: float) -> float:
    """Seconds a request sent now would wait on ``replica`` before it starts."""
    size = replica.max_concurrency
    if replica.engine_slots is not None:
        size = min(size, replica.engine_slots)
    engine_busy = max(replica.running + capacity_waiting(replica), replica.server_load or 0.0)
    ahead = max(float(replica.in_flight), engine_busy) + 1 - size
    if ahead <= 0:
        return 0.0
    drain = replica.drain_per_s
    return ahead / drain if drain > 0 else ahead * assumed_request_s


def tier_wait_s(replicas: Iterable[Replica], assumed_request_s: float) -> float:
    """The shortest wait among ``replicas`` (the usable ones of a tier); inf when none."""
    return min((replica_wait_s(r, assumed_request_s) for r in replicas), default=math.inf)
