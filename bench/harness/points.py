"""Measure one leg at a series of concurrencies with wrk, and say how disturbed each point was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.cpu_noise import CpuMeter, Noise, wait_until_quiet
from bench.harness.legs import Leg, LegUnavailableError, Placement
from bench.harness.wrk import WrkResult, WrkRunner, lua_script, parse_output

CONCURRENCIES = (1, 16, 64)
QUIET_FOREIGN_SHARE = 0.05  # --quiet-wait waits for other processes to use at most this
# Servers waiting for a CPU more than this share of a point's time make that point suspect,
# and so do other processes using more than this share of the machine's CPUs during it.
NOISY_WAIT = 0.05
NOISY_FOREIGN = 0.05


def noisiness(noise: Noise) -> float:
    """How disturbed a point was: the larger of its servers' wait and the others' CPU share."""
    return max(noise.wait_share, noise.foreign_share)


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
            if c not in series.wait or noisiness(noise) < max(series.wait[c], series.foreign[c]):
                series.points[c] = point
                series.wait[c], series.foreign[c] = noise.wait_share, noise.foreign_share
            if noise.wait_share <= NOISY_WAIT and noise.foreign_share <= NOISY_FOREIGN:
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


@dataclass
class CountedRun:
    """A request-count run: what answered and each wrk chunk's output."""

    requests: int = 0
    socket_errors: int = 0
    non_2xx: int = 0
    outputs: list[str] = field(default_factory=list)


def send_count(
    runner: WrkRunner,
    url: str,
    script_for: Callable[[int], str],
    connections: int,
    target: int,
) -> CountedRun:
    """Send ``target`` requests (plus at most the in-flight ones) with wrk.

    ``script_for(n)`` renders a script that stops its thread after ``n`` answers. wrk itself
    runs for whole seconds whatever the script does, so chunks are sized from the rate measured
    so far (the first second calibrates) and only the last one waits out part of a second.
    """
    run = CountedRun()
    best_rps = 0.0
    while run.requests < target:
        remaining = target - run.requests
        seconds = max(1, min(30, int(remaining / best_rps * 0.7))) if best_rps else 1
        stdout = runner.run_raw(url, script_for(remaining), connections, seconds)
        result = parse_output(stdout)
        if result.requests == 0:
            raise LegUnavailableError(f"{url} served no request in {seconds} s")
        best_rps = max(best_rps, result.rps)
        run.requests += result.requests
        run.socket_errors += result.errors
        run.non_2xx += result.non_2xx
        run.outputs.append(stdout)
    return run
