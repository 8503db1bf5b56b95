"""What the per-tenant shadow budget adds to the request path: the sampling decision timed.

    .venv/bin/python bench/shadow/sample_cost.py [--ratio 0.05] [--rounds 7]

The decision before the budget (``ShadowRunner.sample``, the ratio alone) and now (the ratio,
then ``ShadowRunner.admit`` for a request the ratio sampled), each in rounds of 200,000 calls,
interleaved; prints the median and the fastest round in ns per request. Neither does IO: the
budget is a dictionary in the worker (``policies/shadow_budget.py``, a module the import
contracts keep free of Redis and any client).
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import timeit
from collections.abc import Callable

from gateway.routing.shadow import UNDER, ShadowConfig, ShadowRunner

CALLS = 200_000


def runner(ratio: float, cap: int | None) -> ShadowRunner:
    """A runner sampling fast traffic at ``ratio``, with the tenant budget ``cap``."""
    config = ShadowConfig(fast_ratio=ratio, tenant_samples_per_minute=cap)
    return ShadowRunner(
        config,
        {},
        fast_tier="fast",
        precise_tier="precise",
        upstream=lambda: None,
        rng=random.Random(1),  # sampling, not security
    )


def before(shadow: ShadowRunner) -> None:
    """The ratio alone (the decision before the budget)."""
    shadow.sample("fast")


def now(shadow: ShadowRunner) -> None:
    """The ratio, then the tenant's budget for a sampled request."""
    if shadow.sample("fast") == UNDER:
        shadow.admit(UNDER, "tenant-a")


def main() -> None:
    """Time both decisions, interleaved, and print ns per request."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratio", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    variants: dict[str, tuple[Callable[[ShadowRunner], None], int | None]] = {
        "before (ratio only)": (before, 30),
        "now, budget 30/min": (now, 30),
        "now, budget off": (now, None),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (decide, cap) in variants.items():
            seconds = timeit.timeit(
                functools.partial(decide, runner(args.ratio, cap)), number=CALLS
            )
            times[name].append(seconds / CALLS * 1e9)
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.0f} ns, fastest {min(values):.0f} ns")


if __name__ == "__main__":
    main()
