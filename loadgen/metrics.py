"""Summaries of one grid point, with the definitions of ``vllm bench serve``.

- TTFT: send to the first chunk that carries text (content, thinking or a tool call).
- TPOT, per request: (E2E - TTFT) / (output tokens - 1), for requests with >= 2 tokens.
- ITL: every gap between two text chunks, over all requests.
- E2EL: send to the end of the stream.
- Throughput: successful requests and their output tokens over the wall time of the point.
- Goodput: successful requests within every SLO limit, per second.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadgen.client import RequestResult
from loadgen.spec import Slo

PERCENTILES = (50, 90, 99)


def trimmed_mean(values: Sequence[float], fraction: float) -> float:
    """The mean after dropping ``floor(fraction * n)`` values from each end."""
    ordered = sorted(values)
    cut = math.floor(fraction * len(ordered))
    kept = ordered[cut : len(ordered) - cut] or ordered
    return float(sum(kept) / len(kept))


def distribution(seconds: Sequence[float], trim: float) -> dict[str, float | int | None]:
    """mean, median, p90, p99, std and trimmed mean in milliseconds (None when empty)."""
    if not seconds:
        return {
            "count": 0,
            "mean": None,
            "median": None,
            "p90": None,
            "p99": None,
            "std": None,
            "trimmed_mean": None,
        }
    ms = np.asarray(seconds, dtype=float) * 1000.0
    p50, p90, p99 = (float(v) for v in np.percentile(ms, PERCENTILES))
    return {
        "count": len(seconds),
        "mean": float(ms.mean()),
        "median": p50,
        "p90": p90,
        "p99": p99,
        "std": float(ms.std()),
        "trimmed_mean": trimmed_mean([float(v) for v in ms], trim),
    }


def meets(result: RequestResult, slo: Slo) -> bool:
    """True when a successful request is within every limit that is set."""
    if not result.ok:
        return False
    checks = (
        (slo.ttft_ms, result.ttft),
        (slo.tpot_ms, result.tpot or 0.0),
        (slo.e2el_ms, result.e2el),
    )
    return all(limit is None or value * 1000.0 <= limit for limit, value in checks)


def counted_from(results: Sequence[RequestResult]) -> str:
    """``usage``, ``chunks`` or ``mixed``: where the output token counts came from."""
    sources = {r.counted_from for r in results}
    if not sources:
        return "none"
    return sources.pop() if len(sources) == 1 else "mixed"


def summarise(
    results: Sequence[RequestResult], duration_s: float, slo: Slo, trim: float
) -> dict[str, Any]:
    """Every metric of one grid point."""
    good = [r for r in results if r.ok]
    tpots = [t for t in (r.tpot for r in good) if t is not None]
    output_tokens = sum(r.output_tokens for r in good)
    prompt_counts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    statuses = Counter(r.status for r in results if not r.ok)
    wall = duration_s if duration_s > 0 else math.nan
    summary: dict[str, Any] = {
        "requests": len(results),
        "completed": len(good),
        "failed": len(results) - len(good),
        "error_rate": (len(results) - len(good)) / len(results) if results else 0.0,
        "errors_by_status": dict(sorted(statuses.items())),
        "first_errors": _first_errors(results),
        "duration_s": duration_s,
        "request_throughput": len(good) / wall,
        "output_throughput": output_tokens / wall,
        "total_output_tokens": output_tokens,
        "mean_output_tokens": output_tokens / len(good) if good else None,
        "mean_prompt_tokens": sum(prompt_counts) / len(prompt_counts) if prompt_counts else None,
        "tokens_counted_from": counted_from(good),
        "ttft_ms": distribution([r.ttft for r in good], trim),
        "tpot_ms": distribution(tpots, trim),
        "itl_ms": distribution([gap for r in good for gap in r.itl], trim),
        "e2el_ms": distribution([r.e2el for r in good], trim),
    }
    if slo.is_set():
        within = sum(1 for r in good if meets(r, slo))
        summary["goodput"] = within / wall
        summary["slo_attainment"] = within / len(results) if results else 0.0
    return summary


def _first_errors(results: Sequence[RequestResult]) -> dict[str, str]:
    """One example message per failing status."""
    examples: dict[str, str] = {}
    for r in results:
        if not r.ok and r.status not in examples:
            examples[r.status] = r.error
    return examples
