"""CPU per request of the bookkeeping that follows every answer, before and after 2026-12-03.

Usage: ``.venv/bin/python bench/bookkeeping/run.py [--requests 20000] [--rounds 5]
[--out bench/results/bookkeeping.md]``

Three pieces of per-request work, each measured in this process against the way it was done
before, in alternating rounds (CPU time, ``time.process_time``; median of the rounds; ratios
within the run):

- **access line**: the line for one finished request through structlog's bound logger and
  processor chain (as every line was written before), and through ``AccessLines``, the direct
  JSON writer the observer now uses; both configured by ``configure_logging`` into one sink.
- **metrics**: one finished request's counter and histogram updates through prometheus_client
  children (bound once per label tuple, as before: each ``inc``/``observe`` takes a lock and
  checks observability), and through ``GatewayMetrics.record`` (plain values, no lock).
- **upstream deadline**: ``async with asyncio.timeout(s)`` and ``with deadline(s)`` around an
  await that completes at once, on uvloop.

The request path's socket work, parsing and forwarding are not here: ``bench/overhead``
measures the whole request, where these pieces are a few percent each and a noisy machine
hides them (``bench/overhead/ab.py`` for before/after of whole revisions).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import structlog  # noqa: E402  # after the path fix
import uvloop  # noqa: E402  # same
from prometheus_client import CollectorRegistry, Counter, Histogram  # noqa: E402  # same

from bench.harness.markdown import report_head  # noqa: E402  # same
from gateway.config.settings import TelemetrySettings  # noqa: E402  # same
from gateway.pipeline.context import RequestContext  # noqa: E402  # same
from gateway.pipeline.deadline import deadline  # noqa: E402  # same
from gateway.pipeline.events import Usage  # noqa: E402  # same
from gateway.telemetry import metrics as gm  # noqa: E402  # same
from gateway.telemetry import semconv as sc  # noqa: E402  # same
from gateway.telemetry.logging import access_logger, configure_logging  # noqa: E402  # same
from gateway.telemetry.observer import access_fields  # noqa: E402  # same
from policies.requests import RequestSummary  # noqa: E402  # same
from policies.tiering import RouteDecision  # noqa: E402  # same

Step = Callable[[int], None]  # runs a piece ``n`` times


def _context() -> RequestContext:
    """A finished, answered non-streaming request, as the benchmark's small chat completion."""
    ctx = RequestContext("0123456789abcdef0123456789abcdef", route="/v1/chat/completions")
    ctx.summary = RequestSummary(
        kind="chat", model="fast", stream=False, max_tokens=16, include_usage=False,
        prompt_chars=24, has_tools=False, response_format=None, n=1, best_of=None,
        prompts=1, max_tokens_param="max_tokens",
    )  # fmt: skip
    ctx.decision = RouteDecision("fast", "pinned", None)
    ctx.tier = "fast"
    ctx.replica = "fast-0"
    ctx.attempts = 1
    ctx.status = 200
    ctx.admitted = True
    ctx.upstream_request_id = "fedcba9876543210fedcba9876543210"
    ctx.usage = Usage(12, 7, 0)
    return ctx


class _PrometheusChildren:
    """The metric updates of one finished request as they were made before: prometheus_client
    children with the same names, labels and buckets, bound once per label tuple."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self.requests = Counter("r", "", ("route", "tier", "status_class"), registry=registry)
        self.duration = Histogram(
            "d", "", ("route", "tier"), registry=registry, buckets=gm.LATENCY_BUCKETS
        )
        self.overhead = Histogram("o", "", registry=registry, buckets=gm.OVERHEAD_BUCKETS)
        self.decisions = Counter("c", "", ("tier", "reason"), registry=registry)
        self.ratelimit = Counter("l", "", ("limit", "outcome"), registry=registry)
        self.tokens = Counter("t", "", ("tier", "direction"), registry=registry)
        self.allowed = self.ratelimit.labels(sc.RATELIMIT_ALL_LIMITS, sc.RATELIMIT_ALLOWED)
        self.share = gm.ShareWindow()

    def child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, labels)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*labels)
        return found

    def record(self, ctx: RequestContext, total_s: float, overhead_s: float) -> None:
        decision = ctx.decision
        assert decision is not None  # built above
        assert ctx.usage is not None  # same
        tier = ctx.tier or decision.tier
        self.child(self.requests, ctx.route, tier, gm.status_class(ctx.status)).inc()
        self.child(self.duration, ctx.route, tier).observe(total_s)
        self.overhead.observe(overhead_s)
        self.child(self.decisions, decision.tier, decision.reason).inc()
        self.share.add(tier == "precise")
        self.allowed.inc()
        self.child(self.tokens, tier, sc.TOKENS_INPUT).inc(ctx.usage.prompt_tokens)
        self.child(self.tokens, tier, sc.TOKENS_OUTPUT).inc(ctx.usage.completion_tokens)


def access_steps() -> tuple[Step, Step, Callable[[], None]]:
    """Before (structlog's chain) and after (the direct writer); a cleanup."""
    sink = configure_logging(TelemetrySettings(log_format="json"), stream=io.StringIO())
    chain = structlog.get_logger("tiergate.access").bind()
    direct = access_logger()
    ctx = _context()
    structlog.contextvars.bind_contextvars(request_id=ctx.request_id)

    def before(n: int) -> None:
        for _ in range(n):
            chain.info(sc.EVENT_ACCESS, **access_fields(ctx, "complete", 0.0012, 0.0003))
        sink._lines.clear()  # the writer thread is not what is measured

    def after(n: int) -> None:
        for _ in range(n):
            direct.info(sc.EVENT_ACCESS, **access_fields(ctx, "complete", 0.0012, 0.0003))
        sink._lines.clear()  # same

    return before, after, sink.close


def metric_steps() -> tuple[Step, Step]:
    """Before (prometheus_client children) and after (``GatewayMetrics.record``)."""
    ctx = _context()
    old = _PrometheusChildren()
    new = gm.GatewayMetrics(CollectorRegistry(), {}, precise_tier="precise", target_share=0.3)

    def before(n: int) -> None:
        for _ in range(n):
            old.record(ctx, 0.0012, 0.0003)

    def after(n: int) -> None:
        for _ in range(n):
            new.record(ctx, "complete", 0.0012, 0.0003)

    return before, after


def deadline_steps() -> tuple[Step, Step]:
    """Before (``asyncio.timeout``) and after (``deadline``), each in a uvloop task."""

    async def ready() -> None:
        return None

    async def with_timeout(n: int) -> None:
        for _ in range(n):
            async with asyncio.timeout(30.0):
                await ready()

    async def with_deadline(n: int) -> None:
        for _ in range(n):
            with deadline(30.0):
                await ready()

    def before(n: int) -> None:
        uvloop.run(with_timeout(n))

    def after(n: int) -> None:
        uvloop.run(with_deadline(n))

    return before, after


def measure(before: Step, after: Step, requests: int, rounds: int) -> tuple[float, float]:
    """Median CPU µs per request of each, alternating round by round after a warm-up."""
    before(requests // 10)
    after(requests // 10)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for index, step in enumerate((before, after)):
            started = time.process_time()
            step(requests)
            times[index].append((time.process_time() - started) / requests * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def report(rows: list[tuple[str, float, float]], command: str) -> str:
    """The Markdown table."""
    lines = [
        *report_head("Per-request bookkeeping: before and after", command),
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; Python {sys.version.split()[0]}",
        "- CPU µs per request (median of the rounds, before and after alternating)",
        "",
        "| piece | before µs | after µs | saved µs | after / before |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, old, new in rows:
        lines.append(f"| {name} | {old:.2f} | {new:.2f} | {old - new:.2f} | {new / old:.2f} |")
    total_old = sum(r[1] for r in rows)
    total_new = sum(r[2] for r in rows)
    lines.append(
        f"| **all three** | {total_old:.2f} | {total_new:.2f} | {total_old - total_new:.2f} | "
        f"{total_new / total_old:.2f} |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure, print and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/bookkeeping.md")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    if args.requests < 10 or args.rounds < 1:
        p.error("--requests >= 10 and --rounds >= 1")
    before, after, close = access_steps()
    try:
        rows = [("access line", *measure(before, after, args.requests, args.rounds))]
    finally:
        close()
    rows.append(("metrics", *measure(*metric_steps(), args.requests, args.rounds)))
    rows.append(("upstream deadline", *measure(*deadline_steps(), args.requests, args.rounds)))
    command = " ".join([".venv/bin/python", "bench/bookkeeping/run.py", *given])
    text = report(rows, command)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
