"""Prometheus metrics of one gateway app, on the app's own ``CollectorRegistry``.

Every app gets its own registry (never the process-wide default one), so several apps in one
test process cannot clash. Label children are bound once and cached per label tuple, so the
request path does a dict lookup and an ``inc``/``observe``. Replica health and in-flight
counts and the precise-tier share are read from live objects when Prometheus scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.context import RequestContext
from gateway.errors import ClientGone
from gateway.replicas import ReplicaPool
from gateway.telemetry import semconv as sc
from policies.errors import RateLimited

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
)
_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


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


class _Family:
    """A labelled metric with its children bound once per label tuple."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def child(self, *labels: str) -> Any:
        """The bound child for ``labels`` (created on first use)."""
        found = self.children.get(labels)
        if found is None:
            found = self.children[labels] = self.metric.labels(*labels)
        return found


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

    def _build(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...]) -> _Family:
            return _Family(Counter(name, doc, labels, registry=registry))

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: Any) -> _Family:
            return _Family(Histogram(name, doc, labels, registry=registry, buckets=buckets))

        self.requests = counter(
            sc.M_REQUESTS, "Finished inference requests", ("route", "tier", "status_class")
        )
        self.duration = histogram(
            sc.M_REQUEST_DURATION, "End-to-end request latency", ("route", "tier"), LATENCY_BUCKETS
        )
        self.ttft = histogram(
            sc.M_TTFT, "Time to the first streamed token", ("tier",), TTFT_BUCKETS
        )
        self.tpot = histogram(
            sc.M_TPOT, "Time per output token after the first (streams)", ("tier",), TPOT_BUCKETS
        )
        self.overhead = Histogram(
            sc.M_OVERHEAD,
            "Gateway time before the first byte, upstream waiting excluded",
            registry=registry,
            buckets=OVERHEAD_BUCKETS,
        )
        self.tokens = counter(sc.M_TOKENS, "Tokens reported by the backends", ("tier", "direction"))
        self.decisions = counter(sc.M_ROUTE_DECISIONS, "Tier routing decisions", ("tier", "reason"))
        self.ratelimit = counter(
            sc.M_RATELIMIT_DECISIONS, "Rate-limit decisions", ("limit", "outcome")
        )
        self.aborts = counter(sc.M_STREAM_ABORTS, "Streams that did not complete", ("cause",))
        self._allowed = self.ratelimit.child(sc.RATELIMIT_ALL_LIMITS, sc.RATELIMIT_ALLOWED)

    def record(self, ctx: RequestContext, outcome: str, total_s: float, overhead_s: float) -> None:
        """Account for one finished request."""
        decision = ctx.decision
        tier = ctx.tier or (decision.tier if decision is not None else sc.NO_TIER)
        self.requests.child(ctx.route, tier, status_class(ctx.status)).inc()
        self.duration.child(ctx.route, tier).observe(total_s)
        self.overhead.observe(overhead_s)
        if decision is not None:
            self.decisions.child(decision.tier, decision.reason).inc()
            self.share.add(tier == self.precise_tier)
        self._record_limits(ctx)
        summary = ctx.summary
        if summary is not None and summary.stream:
            self._record_stream(ctx, outcome, tier, total_s)
        usage = ctx.usage
        if usage is not None:
            self.tokens.child(tier, sc.TOKENS_INPUT).inc(usage.prompt_tokens)
            self.tokens.child(tier, sc.TOKENS_OUTPUT).inc(usage.completion_tokens)
            if usage.cached_tokens:
                self.tokens.child(tier, sc.TOKENS_CACHED_INPUT).inc(usage.cached_tokens)

    def _record_limits(self, ctx: RequestContext) -> None:
        if ctx.admitted:
            self._allowed.inc()
            return
        failure = ctx.failure
        if failure is not None and failure.kind == RateLimited.__name__:
            limit = failure.limit or failure.code or "unknown"
            self.ratelimit.child(limit, sc.RATELIMIT_REJECTED).inc()

    def _record_stream(self, ctx: RequestContext, outcome: str, tier: str, total_s: float) -> None:
        first = ctx.first_chunk_s
        if first is not None:
            self.ttft.child(tier).observe(first)
            usage = ctx.usage
            if usage is not None and usage.completion_tokens > 1 and outcome == sc.OUTCOME_COMPLETE:
                self.tpot.child(tier).observe((total_s - first) / (usage.completion_tokens - 1))
        if outcome != sc.OUTCOME_COMPLETE:
            cause = outcome if ctx.status == 200 else _abort_cause(outcome)
            if cause is not None:
                self.aborts.child(cause).inc()


def _abort_cause(outcome: str) -> str | None:
    """Errors before the stream started are not aborts, except the client leaving."""
    return sc.OUTCOME_CLIENT_DISCONNECT if outcome == ClientGone.__name__ else None
