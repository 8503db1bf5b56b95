"""Measure one leg at a series of concurrencies with wrk, and say how disturbed each point was."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.cpu_noise import CpuMeter, Noise, wait_until_quiet
from bench.harness.legs import Leg, Placement
from bench.harness.wrk import WrkResult, WrkRunner, lua_script

CONCURRENCIES = (1, 16, 64)
QUIET_FOREIGN_SHARE = 0.05  # --quiet-wait waits for other processes to use at most this
# Servers waiting for a CPU more than this share of a point's time make that point suspect.
NOISY_WAIT = 0.05


@dataclass(frozen=True)
class Plan:
    """How long each point runs and how many requests the memory phase sends."""

    duration_s: float
    warmup_s: float
    memory_steps: tuple[int, ...]
    noisy_retries: int
    quiet_wait_s: float


@dataclass(frozen=True)
class Bench:
    """What every leg shares: the load generator, the plan, the work directory, the pinning."""

    runner: WrkRunner
    plan: Plan
    workdir: Path
    pin: Placement


@dataclass
class Series:
    """One setup's points: concurrency -> wrk result."""

    role: str  # "upstream", "direct", "tiergate" or "litellm"
    label: str
    points: dict[int, WrkResult] = field(default_factory=dict)
    wait: dict[int, float] = field(default_factory=dict)  # servers' run-queue wait share
    foreign: dict[int, float] = field(default_factory=dict)  # other processes' CPU share

    def rps(self, concurrency: int) -> float | None:
        """Req/s at a concurrency, if measured."""
        point = self.points.get(concurrency)
        return point.rps if point else None


def measure(leg: Leg, role: str, bench: Bench, upstream: Leg | None = None) -> Series:
    """Warm up, then run every concurrency point against one leg (noisy points are retried)."""
    runner, plan = bench.runner, bench.plan
    series = Series(role, leg.name)
    script = lua_script(leg.body(), leg.api_key, headers=leg.headers)
    meter = CpuMeter(leg.sessions() + (upstream.sessions() if upstream else []), leg.sessions())
    # Direct legs share a core with wrk by design, so their wait says nothing about noise.
    retries = plan.noisy_retries if upstream is not None else 0
    for c in CONCURRENCIES:
        for attempt in range(retries + 1):
            if plan.quiet_wait_s > 0:
                wait_until_quiet(meter.sessions, QUIET_FOREIGN_SHARE, plan.quiet_wait_s)
            runner.run(leg.chat_url, script, c, plan.warmup_s)
            meter.start()
            point = runner.run(leg.chat_url, script, c, plan.duration_s)
            noise = meter.stop()
            _print_point(leg.name, c, point, noise, attempt)
            if c not in series.wait or noise.wait_share < series.wait[c]:
                series.points[c] = point
                series.wait[c], series.foreign[c] = noise.wait_share, noise.foreign_share
            if noise.wait_share <= NOISY_WAIT:
                break
    return series


def _print_point(name: str, c: int, point: WrkResult, noise: Noise, attempt: int) -> None:
    retry = f" (retry {attempt})" if attempt else ""
    print(
        f"  {name:<30} c={c:<3} {point.rps:>9,.0f} req/s  p50 {point.p50_ms:7.2f} ms  "
        f"p99 {point.p99_ms:7.2f} ms  errors {point.errors + point.non_2xx}  "
        f"wait {noise.wait_share:.0%}  other CPU {noise.foreign_share:.0%}{retry}",
        flush=True,
    )
