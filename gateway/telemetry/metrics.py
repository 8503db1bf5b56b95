"""Prometheus metrics of one gateway app, on the app's own ``CollectorRegistry``.

Every app gets its own registry (never the process-wide default one), so several apps in one
test process cannot clash. The request path's counters and histograms are plain values keyed
by label tuple (no lock: only the event loop writes them), rendered when Prometheus scrapes.
Replica health and in-flight counts and the precise-tier share are read from live objects
when Prometheus scrapes.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway.pipeline.context import RequestContext
from gateway.pipeline.errors import ClientGone
from gateway.telemetry import semconv as sc
from gateway.upstream.replicas import ReplicaPool

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
OVERHEAD_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
_ALLOWED = (sc.RATELIMIT_ALL_LIMITS, sc.RATELIMIT_ALLOWED)


class ShareWindow:
    """The share of ``True`` among the last ``size`` observations, in O(1) per observation."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self._ring = bytearray(size)
        self._next = 0
        self._count = 0
        self._true = 0

    def add(self, flag: bool) -> None:
        """Record one observation, forgetting the oldest once the window is full."""
        index = self._next
        self._true += int(flag) - self._ring[index]
        self._ring[index] = flag
        self._next = (index + 1) % self.size
        self._count = min(self._count + 1, self.size)

    def share(self) -> float:
        """The share of ``True`` (0 before any observation)."""
        return self._true / self._count if self._count else 0.0


class _LiveCollector(Collector):
    """Read at scrape time: replica health, in-flight, attempts, retries; precise share."""

    def __init__(
        self, pools: Mapping[str, ReplicaPool], share: ShareWindow, target_share: float
    ) -> None:
        self.pools = pools
        self.share = share
        self.target_share = target_share

    def collect(self) -> Iterator[Metric]:
        """Yield the live gauges."""
        healthy = GaugeMetricFamily(
            sc.M_REPLICA_HEALTHY,
            "1 when the replica is healthy and not ejected",
            labels=("tier", "replica"),
        )
        in_flight = GaugeMetricFamily(
            sc.M_REPLICA_IN_FLIGHT,
            "Requests this gateway has in flight on the replica",
            labels=("tier", "replica"),
        )
        backend = GaugeMetricFamily(
            sc.M_REPLICA_BACKEND,
            "1 per replica, labelled with its backend kind (configured: "
            "auto or a kind; kind: what it is treated as, 'unknown' until detected)",
            labels=("tier", "replica", "configured", "kind"),
        )
        now = time.monotonic()
        for tier, pool in self.pools.items():
            for replica in pool.replicas:
                labels = (tier, replica.name)
                healthy.add_metric(labels, 1.0 if replica.available(now) else 0.0)
                in_flight.add_metric(labels, float(replica.in_flight))
                backend.add_metric((*labels, replica.kind_setting, replica.kind or "unknown"), 1.0)
        yield healthy
        yield in_flight
        yield backend
        yield from self._upstream()
        yield from self._queues()
        yield GaugeMetricFamily(
            sc.M_PRECISE_SHARE,
            f"Share of the last {self.share.size} routed requests served by the precise tier",
            value=self.share.share(),
        )
        yield GaugeMetricFamily(
            sc.M_PRECISE_SHARE_TARGET,
            "Configured target share of the precise tier",
            value=self.target_share,
        )

    def _upstream(self) -> Iterator[Metric]:
        """Attempt outcomes and retries, as the replica pools count them (one source of truth)."""
        attempts = CounterMetricFamily(
            sc.M_UPSTREAM_ATTEMPTS,
            "Attempts against backend replicas, by outcome",
            labels=("tier", "replica", "outcome"),
        )
        retries = CounterMetricFamily(
            sc.M_UPSTREAM_RETRIES,
            "Retries on another replica, by the failure that caused them",
            labels=("tier", "reason"),
        )
        for tier, pool in self.pools.items():
            for replica in pool.replicas:
                for outcome, count in list(replica.outcomes.items()):
                    attempts.add_metric((tier, replica.name, outcome), float(count))
            for reason, count in list(pool.retries.items()):
                retries.add_metric((tier, reason), float(count))
        yield attempts
        yield retries

    def _queues(self) -> Iterator[Metric]:
        """Queue waits, sheds and waiters per tier and priority class (no tenant label)."""
        waits = HistogramMetricFamily(
            sc.M_QUEUE_WAIT,
            "Time requests waited in a full tier's queue before a slot was handed to them",
            labels=("tier", "priority"),
        )
        shed = CounterMetricFamily(
            sc.M_QUEUE_SHED,
            "Requests refused with 503 by a full tier (reason: full queue or deadline)",
            labels=("tier", "priority", "reason"),
        )
        waiting = GaugeMetricFamily(
            sc.M_QUEUE_WAITING, "Requests waiting for a slot now", labels=("tier",)
        )
        for tier, pool in self.pools.items():
            stats = pool.queue_stats
            for priority, hist in stats.waits.items():
                edges = [_bound(b) for b in hist.bounds] + ["+Inf"]
                buckets = list(zip(edges, accumulate(hist.counts), strict=True))
                waits.add_metric((tier, priority), buckets, hist.total)
            for (priority, reason), count in list(stats.shed.items()):
                shed.add_metric((tier, priority, reason), float(count))
            waiting.add_metric((tier,), float(pool.queue.waiting))
        yield waits
        yield shed
        yield waiting


class _Counter:
    """A labelled counter kept as plain floats, one per label tuple.

    The request path is single-threaded (the event loop), so an increment needs no lock:
    prometheus_client's children take one on every ``inc`` and check observability, which
    cost as much as the rest of the bookkeeping. A scrape (any thread) copies the values in
    one C-level step and renders them as a counter family.
    """

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to the series of ``labels`` (a negative amount counts as zero: a
        counter never goes down)."""
        values = self.values
        values[labels] = values.get(labels, 0.0) + max(0.0, amount)

    def family(self) -> Metric:
        """The counter family as it is now."""
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, value in list(self.values.items()):
            family.add_metric(labels, value)
        return family


class _Series:
    """One histogram series: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one is +Inf
        self.total = 0.0


class _Histogram:
    """A labelled histogram kept as plain counts (lock-free, as ``_Counter``)."""

    __slots__ = ("bounds", "doc", "edges", "labels", "name", "series")

    def __init__(
        self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.bounds = buckets
        self.edges = [_bound(b) for b in buckets] + ["+Inf"]  # the ``le`` values, rendered once
        self.series: dict[tuple[str, ...], _Series] = {}
        if not labels:  # one series, exposed from the start (as prometheus_client does)
            self.series[()] = _Series(len(buckets))

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Count ``value`` in its bucket (upper bounds inclusive, as Prometheus defines them);
        NaN is not counted (it would fall in every bucket and make the sum NaN)."""
        if value != value:  # noqa: PLR0124  # NaN is the one value unequal to itself
            return
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Series(len(self.bounds))
        series.counts[bisect_left(self.bounds, value)] += 1
        series.total += value

    def family(self) -> Metric:
        """The histogram family as it is now (cumulative buckets, count, sum)."""
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, series in list(self.series.items()):
            cumulative = accumulate(list(series.counts))
            family.add_metric(labels, list(zip(self.edges, cumulative, strict=True)), series.total)
        return family


def _bound(value: float) -> str:
    """A bucket bound as prometheus_client writes ``le`` (``0.005``, ``1.0``, ``30.0``)."""
    rendered: str = floatToGoString(value)  # type: ignore[no-untyped-call]  # untyped helper
    return rendered


class _Families(Collector):
    """The request path's counters and histograms, rendered when Prometheus scrapes."""

    def __init__(self, families: list[_Counter | _Histogram]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        """Every family with its current values."""
        for family in self.families:
            yield family.family()


def status_class(status: int) -> str:
    """``2xx``, ``4xx``... (``0``, a request that never got a status, counts as ``5xx``)."""
    return _STATUS_CLASSES.get(status // 100, "5xx")


class GatewayMetrics:
    """The gateway's metrics on one registry, and how one finished request updates them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        pools: Mapping[str, ReplicaPool],
        *,
        precise_tier: str,
        target_share: float,
    ) -> None:
        self.registry = registry
        self.precise_tier = precise_tier
        self.share = ShareWindow()
        registry.register(_LiveCollector(pools, self.share, target_share))
        self._build(registry)
        # Refused credentials (gateway.telemetry.refusals): counted on refusals only.
        self.auth_refusals = _Counter(
            sc.M_AUTH_REFUSALS,
            "Refused credentials, by route class and reason (401s, and 403 for an API key "
            "presented where the admin token is needed)",
            ("route", "reason"),
        )
        registry.register(_Families([self.auth_refusals]))

    def _build(self, registry: CollectorRegistry) -> None:
        self.requests = _Counter(
            sc.M_REQUESTS, "Finished inference requests", ("route", "tier", "status_class")
        )
        self.duration = _Histogram(
            sc.M_REQUEST_DURATION, "End-to-end request latency", ("route", "tier"), LATENCY_BUCKETS
        )
        self.ttft = _Histogram(
            sc.M_TTFT, "Time to the first streamed token", ("tier",), TTFT_BUCKETS
        )
        self.tpot = _Histogram(
            sc.M_TPOT, "Time per output token after the first (streams)", ("tier",), TPOT_BUCKETS
        )
        self.overhead = _Histogram(
            sc.M_OVERHEAD,
            "Gateway time before the first byte, upstream waiting excluded",
            (),
            OVERHEAD_BUCKETS,
        )
        self.tokens = _Counter(
            sc.M_TOKENS, "Tokens reported by the backends", ("tier", "direction")
        )
        self.decisions = _Counter(
            sc.M_ROUTE_DECISIONS, "Tier routing decisions", ("tier", "reason")
        )
        self.ratelimit = _Counter(
            sc.M_RATELIMIT_DECISIONS, "Rate-limit decisions", ("limit", "outcome")
        )
        self.aborts = _Counter(sc.M_STREAM_ABORTS, "Streams that did not complete", ("cause",))
        self.truncated = _Counter(
            sc.M_STREAM_TRUNCATED,
            "Streams a backend answered 200 that ended before the answer was finished",
            ("tier", "cause"),
        )
        self.empty = _Counter(
            sc.M_STREAM_EMPTY, "Complete streams with no completion token", ("tier",)
        )
        self.ratelimit.inc(_ALLOWED, 0.0)  # exposed from the start, as before the first request
        registry.register(
            _Families(
                [
                    self.requests,
                    self.duration,
                    self.ttft,
                    self.tpot,
                    self.overhead,
                    self.tokens,
                    self.decisions,
                    self.ratelimit,
                    self.aborts,
                    self.truncated,
                    self.empty,
                ]
            )
        )

    def record(self, ctx: RequestContext, outcome: str, total_s: float, overhead_s: float) -> None:
        """Account for one finished request."""
        decision = ctx.decision
        tier = ctx.tier or (decision.tier if decision is not None else sc.NO_TIER)
        self.requests.inc((ctx.route, tier, status_class(ctx.status)))
        self.duration.observe((ctx.route, tier), total_s)
        self.overhead.observe((), overhead_s)
        if decision is not None:
            self.decisions.inc((decision.tier, decision.reason))
            self.share.add(tier == self.precise_tier)
        self._record_limits(ctx)
        summary = ctx.summary
        if summary is not None and summary.stream:
            self._record_stream(ctx, outcome, tier, total_s)
        usage = ctx.usage
        if usage is not None:
            self.tokens.inc((tier, sc.TOKENS_INPUT), usage.prompt_tokens)
            self.tokens.inc((tier, sc.TOKENS_OUTPUT), usage.completion_tokens)
            if usage.cached_tokens:
                self.tokens.inc((tier, sc.TOKENS_CACHED_INPUT), usage.cached_tokens)

    def _record_limits(self, ctx: RequestContext) -> None:
        if ctx.admitted:
            self.ratelimit.inc(_ALLOWED)
            return
        failure = ctx.failure
        if failure is not None and failure.rate_limited:
            limit = failure.limit or failure.code or "unknown"
            self.ratelimit.inc((limit, sc.RATELIMIT_REJECTED))

    def _record_stream(self, ctx: RequestContext, outcome: str, tier: str, total_s: float) -> None:
        first = ctx.first_chunk_s
        if first is not None:
            self.ttft.observe((tier,), first)
            usage = ctx.usage
            if usage is not None and usage.completion_tokens > 1 and outcome == sc.OUTCOME_COMPLETE:
                per_token = (total_s - first) / (usage.completion_tokens - 1)
                self.tpot.observe((tier,), per_token)
        if outcome != sc.OUTCOME_COMPLETE:
            cause = outcome if ctx.status == 200 else _abort_cause(outcome)
            if cause is not None:
                self.aborts.inc((cause,))
            if ctx.stream_cut is not None:
                self.truncated.inc((tier, ctx.stream_cut))
        elif ctx.usage is not None and ctx.usage.completion_tokens == 0:
            self.empty.inc((tier,))


def _abort_cause(outcome: str) -> str | None:
    """Errors before the stream started are not aborts, except the client leaving."""
    return sc.OUTCOME_CLIENT_DISCONNECT if outcome == ClientGone.__name__ else None
