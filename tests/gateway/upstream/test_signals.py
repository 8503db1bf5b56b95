"""A replica's capacity signals: parsing, drain rate, and the slot count derived from them."""

from __future__ import annotations

from gateway.upstream.replicas import Replica
from gateway.upstream.signals import (
    EngineSignals,
    absorb,
    absorb_load,
    parse_signals,
    replica_wait_s,
)

PAGE = """\
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="capacity"} 2.0
vllm:admission_rejections{model_name="m",reason="queue_full"} 4.0
vllm:request_success_total{engine="0",model_name="m",finished_reason="stop"} 10.0
vllm:request_success_total{engine="0",model_name="m",finished_reason="length"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:request_success_total{engine="0",model_name="m",finished_reason="abort"} NaN
garbage{ line
"""


def test_parse_sums_engines_and_splits_reasons() -> None:
    """Capacity and deferred are told apart and summed over engines; junk is skipped."""
    assert parse_signals(PAGE) == EngineSignals(
        waiting_capacity=5.0, waiting_deferred=1.0, rejections=4.0, finished=15.0
    )
    assert parse_signals("vllm:num_requests_running 1\n") == EngineSignals()


def replica(max_concurrency: int = 64) -> Replica:
    """A fresh replica with the tier's cap."""
    return Replica("fast", "http://r:8000", max_concurrency)


def test_capacity_waiting_makes_the_replica_full_and_teaches_its_size() -> None:
    """8 of the gateway's requests in flight, the engine runs 2 and holds 6 for capacity: it
    takes no more than 2 (it is full now, and that is what it runs when full)."""
    r = replica()
    assert r.slots == 64
    r.in_flight, r.running = 8, 2.0
    absorb(r, EngineSignals(waiting_capacity=6.0, finished=0.0), now=1.0)
    assert (r.engine_slots, r.slots, r.has_capacity) == (2, 2, False)
    # Its queue drained while 2 were in flight: room to grow by a quarter, never above the cap.
    r.in_flight, r.running = 2, 2.0
    absorb(r, EngineSignals(waiting_capacity=0.0, finished=4.0), now=2.0)
    assert (r.engine_slots, r.slots) == (3, 3)
    assert r.drain_per_s == 4.0
    small = replica(max_concurrency=2)
    small.running = 8.0
    absorb(small, EngineSignals(waiting_capacity=1.0), now=1.0)
    assert small.slots == 0  # full: nothing beyond its in-flight count (0) less those waiting


def test_deferred_waiting_is_not_full() -> None:
    """Requests deferred for another reason leave the replica's slots alone."""
    r = replica()
    r.waiting, r.running = 3.0, 1.0
    absorb(r, EngineSignals(waiting_capacity=0.0, waiting_deferred=3.0), now=1.0)
    assert (r.engine_slots, r.slots) == (None, 64)


def test_rejections_count_as_full_and_without_reasons_waiting_is_capacity() -> None:
    """A replica that refused requests since the last scrape takes none beyond its in-flight
    count; a server without the by-reason gauge has all its waiting counted as capacity."""
    r = replica()
    r.in_flight = 5
    absorb(r, EngineSignals(rejections=1.0), now=1.0)
    assert r.slots == 64  # the first reading is a baseline, not a rise
    absorb(r, EngineSignals(rejections=3.0), now=2.0)
    assert (r.rejecting, r.slots) == (True, 5)
    legacy = replica()
    legacy.running, legacy.waiting = 4.0, 2.0
    absorb(legacy, EngineSignals(), now=1.0)
    assert legacy.engine_slots == 4
    assert replica_wait_s(legacy, 0.5) == (4 + 2 + 1 - 4) * 0.5


def test_a_load_reading_beyond_the_learnt_size_counts_as_waiting() -> None:
    """Between scrapes, /load's 5 on a replica learnt to run 2 means 3 wait for capacity: it is
    full for the gateway's 4 in flight beyond 1, and the wait counts 5 ahead less its size."""
    r = replica()
    r.in_flight, r.running = 4, 2.0
    absorb(r, EngineSignals(waiting_capacity=1.0), now=1.0)
    assert r.engine_slots == 2
    assert absorb_load(r, 5.0)
    assert (r.server_load, r.load_tracked, r.slots) == (5.0, True, 1)
    assert replica_wait_s(r, 1.0) == 5 + 1 - 2
    absorb(r, EngineSignals(waiting_capacity=0.0), now=2.0)
    assert r.server_load is None  # the scrape is newer
    assert not absorb_load(r, 0.0)  # 0 while 4 are in flight: it does not track its load
    assert r.load_tracked is False
