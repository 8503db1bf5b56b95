"""The engine: FIFO admission, the queue bound, aborts, KV-block waits and latency draws."""

from __future__ import annotations

import pytest

from simulator.engine import RUNNING, WAITING, Engine, EngineConfig, QueueFullError, Sequence
from simulator.prefix_cache import PrefixCache, chain_seed
from simulator.profiles import FAST


def _engine(
    slots: int = 1, queue: int | None = None, blocks: int = 64, scale: float = 1.0
) -> Engine:
    config = EngineConfig(profile=FAST, max_num_seqs=slots, max_queue=queue, latency_scale=scale)
    return Engine(config, PrefixCache(blocks, 16), seed=1)


def _seq(prompt: int = 20, output: int = 4, blocks: int = 2) -> Sequence:
    return Sequence(
        [f"p{i}" for i in range(prompt)],
        [f"o{i}" for i in range(output)],
        chain_seed("m", None),
        blocks,
    )


async def test_fifo_admission_when_slots_free_up() -> None:
    """With one slot, later requests wait in arrival order and start as slots free."""
    engine = _engine()
    first, second, third = _seq(), _seq(), _seq()
    assert engine.submit(first)
    assert not engine.submit(second)
    assert not engine.submit(third)
    assert (engine.running, len(engine.waiting)) == (1, 2)
    engine.first_token(first)
    engine.finish(first, "stop")
    await engine.wait_started(second)
    assert second.state == RUNNING
    assert third.state == WAITING
    assert engine.metrics.finished["stop"] == 1


async def test_queue_bound_refuses() -> None:
    """Past ``max_queue`` waiting requests, submit raises QueueFullError."""
    engine = _engine(queue=1)
    engine.submit(_seq())
    engine.submit(_seq())
    with pytest.raises(QueueFullError):
        engine.submit(_seq())


async def test_abort_while_waiting_frees_the_queue_place() -> None:
    """Aborting a queued request removes it and counts an abort; aborting twice is a no-op."""
    engine = _engine()
    engine.submit(_seq())
    queued = _seq()
    engine.submit(queued)
    engine.abort(queued)
    engine.abort(queued)
    assert len(engine.waiting) == 0
    assert engine.aborts == 1
    assert engine.metrics.finished["abort"] == 1


async def test_waits_for_kv_blocks() -> None:
    """A request that does not fit in the free KV blocks waits even with a free slot."""
    engine = _engine(slots=4, blocks=4)
    big = _seq(blocks=3)
    assert engine.submit(big)
    blocked = _seq(blocks=2)
    assert not engine.submit(blocked)
    assert engine.cache.usage() == 3 / 4
    engine.abort(big)
    assert blocked.state == RUNNING


def test_load_factor_and_zero_scale() -> None:
    """Load factor goes from 1 to ``time_factor_under_load``; scale 0 means no delay at all."""
    engine = _engine(slots=3)
    engine.running = 1
    assert engine.load_factor() == 1.0
    engine.running = 3
    assert engine.load_factor() == 2.0
    seq = _seq(prompt=100)
    delays = [engine.prefill_delay(seq) for _ in range(200)]
    mean = (FAST.base_overhead_s + 100 * FAST.prefill_per_token_s) * 2.0
    assert all(0.3 * mean <= d <= 1.7 * mean for d in delays)
    quiet = _engine(scale=0.0)
    assert quiet.prefill_delay(seq) == 0.0
    assert quiet.decode_delay(50) == 0.0
