"""Latency profiles: what one simulated replica costs per request and per token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    """Mean latencies of one tier; scaled by load, jitter and ``--latency-scale``."""

    name: str
    default_model: str
    base_overhead_s: float
    prefill_per_token_s: float
    inter_token_s: float


# FP16-like 7-8B model on one H100: TTFT ~80 ms at 256 prompt tokens, ~12 ms per output token.
PRECISE = Profile("precise", "tiergate-precise", 0.015, 0.00025, 0.012)
# INT4-like quantised model: prefill about 2x cheaper, decode about 3x faster.
FAST = Profile("fast", "tiergate-fast", 0.010, 0.00012, 0.004)

PROFILES: dict[str, Profile] = {p.name: p for p in (PRECISE, FAST)}
