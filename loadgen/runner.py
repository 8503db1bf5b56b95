"""Drive the grid: for each shape and load, run every target in turn, then summarise."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadgen.client import RequestResult, RequestSpec, build_body, send
from loadgen.metrics import summarise
from loadgen.progress import Progress
from loadgen.prompts import Prompt, cycle, synthetic
from loadgen.spec import Load, Shape, Slo, SpecError, Target


@dataclass(frozen=True, slots=True)
class Plan:
    """One whole run."""

    targets: list[Target]
    shapes: list[Shape]
    loads: list[Load]
    num_requests: int
    max_duration_s: float
    warmup: int
    chat: bool
    ignore_eos: bool
    timeout_s: float
    seed: int
    slo: Slo
    trim: float
    file_prompts: list[Prompt] | None = None
    rounds: int = 1  # each point's requests split into rounds, the targets taking turns
    run_id: str = "0"  # keeps synthetic prompts of different runs apart (prefix caches)


@dataclass(slots=True)
class PointResult:
    """The summary of one target at one grid point."""

    target: Target
    shape: Shape
    load: Load
    summary: dict[str, Any] = field(default_factory=dict)


def _arrivals(load: Load, rng: random.Random) -> Iterator[float]:
    """Seconds to wait before each request: 0 (rate inf), fixed, or exponential (Poisson)."""
    while True:
        if math.isinf(load.rate):
            yield 0.0
        elif load.arrival == "fixed":
            yield 1.0 / load.rate
        else:
            yield rng.expovariate(load.rate)


def _prompts(plan: Plan, shape: Shape, tag: str) -> Iterator[Prompt]:
    """The user's prompts, or synthetic ones whose head is unique to this run and ``tag``."""
    if shape.prompt_tokens is None:
        return cycle(plan.file_prompts or [])
    return synthetic(shape.prompt_tokens, plan.seed, f"{plan.run_id}-{tag}")


def _spec(plan: Plan, shape: Shape) -> RequestSpec:
    return RequestSpec(
        chat=plan.chat,
        max_tokens=shape.output_tokens,
        ignore_eos=plan.ignore_eos,
        timeout_s=plan.timeout_s,
    )


class _Point:
    """One target at one grid point: the schedule, the cap, the deadline and the results."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        plan: Plan,
        target: Target,
        *,
        shape: Shape,
        load: Load,
        progress: Progress,
        turn: tuple[int, int],
    ) -> None:
        self.session, self.plan, self.target, self.progress = session, plan, target, progress
        self.spec = _spec(plan, shape)
        # The same words for every target at this point; the heads differ (no cache sharing).
        self.prompts = _prompts(plan, shape, f"{target.name}-{shape.label}-{load.label}-{turn[0]}")
        self.count = turn[1]
        self.gaps = _arrivals(load, random.Random(plan.seed))  # noqa: S311 - arrival times
        self.slots = asyncio.Semaphore(load.concurrency) if load.concurrency else None
        # With an infinite rate the launcher takes the slot itself, so that at most
        # `concurrency` tasks exist however large --num-requests is.
        self.launcher_holds = self.slots is not None and math.isinf(load.rate)
        self.origin = time.perf_counter()
        self.deadline = self.origin + plan.max_duration_s / plan.rounds
        self.results: list[RequestResult] = []

    async def _send(self, body: dict[str, Any]) -> None:
        self.results.append(
            await send(self.session, self.target, self.spec, body, origin=self.origin)
        )

    async def _one(self, body: dict[str, Any]) -> None:
        try:
            if self.slots is None or self.launcher_holds:
                await self._send(body)
            else:
                async with self.slots:
                    if time.perf_counter() < self.deadline:
                        await self._send(body)
        finally:
            if self.launcher_holds and self.slots is not None:
                self.slots.release()
            self.progress.step()

    async def run(self) -> tuple[list[RequestResult], float]:
        """Launch on schedule, wait for every request; (results, wall seconds)."""
        tasks = []
        for _ in range(self.count):
            await asyncio.sleep(next(self.gaps))
            if self.launcher_holds and self.slots is not None:
                await self.slots.acquire()
            if time.perf_counter() >= self.deadline:
                if self.launcher_holds and self.slots is not None:
                    self.slots.release()
                break
            body = build_body(self.target, self.spec, next(self.prompts))
            tasks.append(asyncio.create_task(self._one(body)))
        await asyncio.gather(*tasks)
        self.progress.done += self.count - len(tasks)  # never started: past the deadline
        return self.results, time.perf_counter() - self.origin


async def run_point(
    session: aiohttp.ClientSession,
    plan: Plan,
    target: Target,
    *,
    shape: Shape,
    load: Load,
    progress: Progress,
    turn: tuple[int, int],
) -> tuple[list[RequestResult], float]:
    """Send round ``turn[0]``'s ``turn[1]`` requests; (results, seconds).

    Arrival times follow the rate; a request that arrives while the cap is reached waits
    for a slot, and its latencies start when it is sent. No request starts after
    ``max_duration_s / rounds``; those already sent finish (or time out).
    """
    point = _Point(session, plan, target, shape=shape, load=load, progress=progress, turn=turn)
    return await point.run()


async def check_target(session: aiohttp.ClientSession, plan: Plan, target: Target) -> str:
    """Send the warm-up requests; raises SpecError when none of them succeeds."""
    shape = plan.shapes[0]
    spec = _spec(plan, shape)
    prompts = _prompts(plan, shape, f"{target.name}-warmup")
    results = [
        await send(
            session,
            target,
            spec,
            build_body(target, spec, next(prompts)),
            origin=time.perf_counter(),
        )
        for _ in range(max(plan.warmup, 1))
    ]
    if any(r.ok for r in results):
        return results[-1].counted_from
    last = results[-1]
    status = f"HTTP {last.status}" if last.status.isdigit() else last.status
    raise SpecError(
        f"target {target.name} ({target.url}, model {target.model}) does not "
        f"answer: {status}: {last.error}"
    )


def _connector(plan: Plan) -> aiohttp.TCPConnector:
    caps = [load.concurrency for load in plan.loads]
    limit = 0 if None in caps else max(c for c in caps if c is not None)
    return aiohttp.TCPConnector(limit=limit, force_close=False)


def _shares(total: int, rounds: int) -> list[int]:
    """``total`` requests split over ``rounds`` as evenly as whole numbers allow."""
    return [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]


async def _point(
    session: aiohttp.ClientSession, plan: Plan, shape: Shape, load: Load, progress: Progress
) -> list[PointResult]:
    """Every target at one grid point, taking turns round by round, so that a passing
    slowdown of the machine hits every target alike."""
    results: dict[str, list[RequestResult]] = {t.name: [] for t in plan.targets}
    seconds = dict.fromkeys(results, 0.0)
    shares = [n for n in _shares(plan.num_requests, plan.rounds) if n]
    for turn in enumerate(shares):
        for target in plan.targets:
            label = f"{target.name} {shape.label} {load.label}"
            if len(shares) > 1:
                label += f" (round {turn[0] + 1}/{len(shares)})"
            progress.begin(label)
            done, took = await run_point(
                session, plan, target, shape=shape, load=load, progress=progress, turn=turn
            )
            results[target.name] += done
            seconds[target.name] += took
            progress.end_point(_one_line(summarise(done, took, plan.slo, plan.trim)))
    return [
        PointResult(
            t, shape, load, summarise(results[t.name], seconds[t.name], plan.slo, plan.trim)
        )
        for t in plan.targets
    ]


async def run(plan: Plan, progress: Progress) -> list[PointResult]:
    """Check every target, then run every (shape, load), the targets taking turns."""
    points: list[PointResult] = []
    async with aiohttp.ClientSession(connector=_connector(plan)) as session:
        for target in plan.targets:
            await check_target(session, plan, target)
        for shape in plan.shapes:
            for load in plan.loads:
                points += await _point(session, plan, shape, load, progress)
    return points


def _one_line(summary: dict[str, Any]) -> str:
    ttft, tpot = summary["ttft_ms"]["median"], summary["tpot_ms"]["median"]
    text = f"{summary['completed']}/{summary['requests']} ok"
    if ttft is not None:
        text += f", TTFT p50 {ttft:.1f} ms"
    if tpot is not None:
        text += f", TPOT p50 {tpot:.2f} ms"
    return text
