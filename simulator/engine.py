"""The simulated engine: running slots, a FIFO waiting queue, KV blocks and latency draws.

A request is admitted while a slot is free (``max_num_seqs``) and its KV blocks fit: the
prompt's plus every token it will generate, reserved at admission (vLLM allocates them as it
decodes and preempts when they run out; the simulator never preempts). Otherwise it waits for
*capacity*; a request held back for another reason first (``deferred_s``: vLLM's structured-
output grammar or remote KV transfer) waits as *deferred*. A full waiting queue refuses the
request and counts an admission rejection.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from simulator.metrics import EngineMetrics, Gauges
from simulator.prefix_cache import Lease, PrefixCache, chain_hashes
from simulator.profiles import Profile

NEW, WAITING, RUNNING, DONE = range(4)


class QueueFullError(Exception):
    """The waiting queue is at its bound; the request is refused before it enters."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler and latency knobs."""

    profile: Profile
    max_num_seqs: int = 64
    max_queue: int | None = None
    latency_scale: float = 1.0
    time_factor_under_load: float = 2.0
    jitter: float = 0.2
    deferred_s: float = 0.0


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine."""

    prompt_tokens: list[str]
    output_tokens: list[str]
    chain_seed: int
    total_blocks: int
    arrival: float = field(default_factory=time.monotonic)
    state: int = NEW
    lease: Lease | None = None
    waiter: asyncio.Future[None] | None = None
    prompt_hashes: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    first_token_at: float = 0.0
    generated: int = 0


class Engine:
    """Admission, block accounting, metrics and latency for every sequence."""

    def __init__(self, config: EngineConfig, cache: PrefixCache, seed: int) -> None:
        self.config = config
        self.cache = cache
        self.metrics = EngineMetrics()
        self.running = 0
        self.waiting: deque[Sequence] = deque()
        self.aborts = 0
        # Requests held back before they may be scheduled (waiting reason "deferred").
        self.deferred = 0
        # Requests refused at admission, by reason (vllm:admission_rejections).
        self.rejections: Counter[str] = Counter()
        self._rng = random.Random(seed)  # noqa: S311 - simulation draws, not security
        slots = max(config.max_num_seqs - 1, 1)
        self._load_slope = (config.time_factor_under_load - 1.0) / slots

    def gauges(self) -> Gauges:
        """Live state for a metrics scrape."""
        return Gauges(
            self.running,
            len(self.waiting) + self.deferred,
            self.cache.usage(),
            self.cache.block_size,
            self.cache.num_blocks,
            waiting_deferred=self.deferred,
            rejections=dict(self.rejections),
        )

    def load(self) -> int:
        """Requests in the engine: running, waiting for capacity, deferred (``/load``)."""
        return self.running + len(self.waiting) + self.deferred

    # -- admission -------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> bool:
        """Start ``seq`` now (True) or queue it (False); raises QueueFullError at the bound."""
        if not self.waiting and self.running < self.config.max_num_seqs and self._start(seq):
            return True
        bound = self.config.max_queue
        if bound is not None and len(self.waiting) >= bound:
            self.rejections["queue_full"] += 1
            raise QueueFullError
        seq.state = WAITING
        seq.waiter = asyncio.get_running_loop().create_future()
        self.waiting.append(seq)
        return False

    async def wait_started(self, seq: Sequence) -> None:
        """Wait in the queue until ``seq`` holds a slot and its blocks."""
        if seq.waiter is not None:
            await seq.waiter

    def _start(self, seq: Sequence) -> bool:
        cache = self.cache
        seq.prompt_hashes = chain_hashes(seq.chain_seed, seq.prompt_tokens, cache.block_size)
        # Like vLLM, the last prompt token is always recomputed, so a fully cached prompt
        # still leaves its final block to prefill.
        lookup_blocks = (len(seq.prompt_tokens) - 1) // cache.block_size
        lease = cache.acquire(seq.prompt_hashes[:lookup_blocks], seq.total_blocks)
        if lease is None:
            return False
        seq.lease = lease
        seq.cached_tokens = lease.hit_blocks * cache.block_size
        seq.state = RUNNING
        self.running += 1
        metrics = self.metrics
        metrics.prefix_queries += len(seq.prompt_tokens)
        metrics.prefix_hits += seq.cached_tokens
        return True

    def _drain(self) -> None:
        waiting = self.waiting
        while waiting and self.running < self.config.max_num_seqs:
            head = waiting[0]
            if head.waiter is None or head.waiter.done():
                waiting.popleft()
                continue
            if not self._start(head):
                return
            waiting.popleft()
            head.waiter.set_result(None)

    # -- latency -----------------------------------------------------------------------------

    def _jittered(self, mean: float) -> float:
        spread = self._rng.gauss(0.0, self.config.jitter)
        spread = min(max(spread, -0.7), 0.7)
        return mean * (1.0 + spread) * self.config.latency_scale

    def load_factor(self) -> float:
        """1 with one running request, ``time_factor_under_load`` with every slot busy."""
        return 1.0 + self._load_slope * max(self.running - 1, 0)

    def prefill_delay(self, seq: Sequence) -> float:
        """Seconds from admission to the first token."""
        if not self.config.latency_scale:
            return 0.0
        profile = self.config.profile
        uncached = len(seq.prompt_tokens) - seq.cached_tokens
        mean = profile.base_overhead_s + uncached * profile.prefill_per_token_s
        return self._jittered(mean * self.load_factor())

    def decode_delay(self, tokens: int = 1) -> float:
        """Seconds to decode ``tokens`` more tokens at the current load."""
        if not self.config.latency_scale or tokens <= 0:
            return 0.0
        return self._jittered(tokens * self.config.profile.inter_token_s * self.load_factor())

    # -- progress ----------------------------------------------------------------------------

    def first_token(self, seq: Sequence) -> None:
        """Prefill done: publish the prompt blocks and record TTFT."""
        now = time.monotonic()
        seq.first_token_at = now
        if seq.lease is not None:
            self.cache.commit(seq.lease, seq.prompt_hashes)
        metrics = self.metrics
        metrics.prompt_tokens += len(seq.prompt_tokens)
        metrics.ttft.observe(now - seq.arrival)
        if seq.output_tokens:
            seq.generated = 1
            metrics.generation_tokens += 1

    def tokens(self, seq: Sequence, count: int, each_s: float) -> None:
        """``count`` more tokens were decoded, ``each_s`` seconds apart."""
        if count <= 0:
            return
        seq.generated += count
        self.metrics.generation_tokens += count
        self.metrics.itl.observe(each_s, count)

    def finish(self, seq: Sequence, reason: str) -> None:
        """The sequence ended (``stop``, ``length`` or ``abort``): free its slot and blocks."""
        if seq.state == WAITING:
            self.waiting.remove(seq)
        elif seq.state == RUNNING:
            self.running -= 1
            lease = seq.lease
            if lease is not None:
                extra = self._decoded_hashes(seq)
                self.cache.release(lease, extra)
            self.metrics.e2e.observe(time.monotonic() - seq.arrival)
        else:
            return
        seq.state = DONE
        self.metrics.finished[reason] += 1
        if reason == "abort":
            self.aborts += 1
        self._drain()

    def _decoded_hashes(self, seq: Sequence) -> list[int]:
        if seq.generated < 2:
            return []
        # The KV cache holds every token fed to the model: the last sampled one never was.
        computed = seq.prompt_tokens + seq.output_tokens[: seq.generated - 1]
        hashes = seq.prompt_hashes
        parent = hashes[-1] if hashes else seq.chain_seed
        return chain_hashes(parent, computed, self.cache.block_size, len(hashes))

    def abort(self, seq: Sequence) -> None:
        """The client went away: drop the sequence wherever it is."""
        self.finish(seq, "abort")
