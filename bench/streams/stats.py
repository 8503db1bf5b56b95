"""Percentiles, inter-token gaps and the "added" numbers of the streams benchmark."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, nearest rank; NaN when empty."""
    if not sorted_values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max (and how many values) of ``values``, in their own unit."""
    ordered = sorted(values)
    return {
        "n": float(len(ordered)),
        "p50": percentile(ordered, 50),
        "p99": percentile(ordered, 99),
        "max": float(ordered[-1]) if ordered else math.nan,
    }


def gaps_ms(arrivals_ns: Sequence[int]) -> list[float]:
    """Times between consecutive events of one stream, in milliseconds."""
    return [(b - a) / 1e6 for a, b in itertools.pairwise(arrivals_ns)]


def delays_ms(arrivals_ns: Sequence[int], stamps_ns: Sequence[int]) -> list[float]:
    """How long each event took from the upstream's write to the client's read, in ms."""
    return [(a - s) / 1e6 for a, s in zip(arrivals_ns, stamps_ns, strict=True)]


def added(leg: dict[str, float], direct: dict[str, float]) -> dict[str, float]:
    """A leg's percentiles minus direct's (same run): what the proxy added."""
    return {key: leg[key] - direct[key] for key in ("p50", "p99", "max") if key in leg}


def per_thousand(cpu_s: float, events: int) -> float:
    """CPU-seconds per 1,000 relayed events (NaN when none were relayed)."""
    return cpu_s / events * 1000 if events else math.nan
