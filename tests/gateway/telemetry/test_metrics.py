"""The Prometheus metrics: per-app registries, what one request records, scrape-time gauges."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.limits.limits import KeyLimiter, LimitMetrics
from gateway.pipeline.context import Failure, Usage
from gateway.telemetry.metrics import GatewayMetrics, ShareWindow, status_class
from gateway.upstream.attempt import usage_from
from gateway.upstream.replicas import ReplicaPool
from policies.errors import RateLimited
from policies.principal import KeyPolicy, Principal
from policies.ratelimit import MemoryRateLimiter
from tests.gateway.telemetry.factories import finished_context

ROUTE = "/v1/chat/completions"


def _metrics(pools: dict[str, ReplicaPool] | None = None) -> GatewayMetrics:
    return GatewayMetrics(
        CollectorRegistry(), pools or {}, precise_tier="precise", target_share=0.3
    )


def _value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_share_window_forgets_the_oldest() -> None:
    """The precise share covers only the last ``size`` observations."""
    window = ShareWindow(size=4)
    assert window.share() == 0.0
    for flag in (True, True, False, False):
        window.add(flag)
    assert window.share() == 0.5
    window.add(False)
    window.add(False)
    assert window.share() == 0.0


def test_status_classes() -> None:
    """Statuses group by hundreds; a request without a status counts as a server error."""
    assert [status_class(s) for s in (200, 404, 499, 502, 0)] == ["2xx", "4xx", "4xx", "5xx", "5xx"]


def test_two_apps_in_one_process_do_not_clash() -> None:
    """Each app registers the same metric names on its own registry."""
    first, second = _metrics(), _metrics()
    first.record(finished_context(), "complete", 0.1, 0.0005)
    assert (
        _value(first, "tiergate_requests_total", route=ROUTE, tier="fast", status_class="2xx")
        == 1.0
    )
    assert (
        _value(second, "tiergate_requests_total", route=ROUTE, tier="fast", status_class="2xx")
        is None
    )


def test_a_non_streaming_request_records_counts_latency_tokens_and_routing() -> None:
    """One request updates requests, latency, overhead, tokens, decisions and limits."""
    metrics = _metrics()
    ctx = finished_context(tier="precise", usage=Usage(100, 20, 64))
    metrics.record(ctx, "complete", 0.25, 0.0004)
    assert (
        _value(metrics, "tiergate_request_duration_seconds_count", route=ROUTE, tier="precise")
        == 1.0
    )
    assert _value(metrics, "tiergate_overhead_seconds_bucket", le="0.0005") == 1.0
    assert _value(metrics, "tiergate_overhead_seconds_bucket", le="0.00025") == 0.0
    assert _value(metrics, "tiergate_tokens_total", tier="precise", direction="input") == 100
    assert _value(metrics, "tiergate_tokens_total", tier="precise", direction="output") == 20
    assert _value(metrics, "tiergate_tokens_total", tier="precise", direction="cached_input") == 64
    assert (
        _value(metrics, "tiergate_route_decisions_total", tier="precise", reason="classifier")
        == 1.0
    )
    assert (
        _value(metrics, "tiergate_ratelimit_decisions_total", limit="all", outcome="allowed") == 1.0
    )
    assert _value(metrics, "tiergate_time_to_first_token_seconds_count", tier="precise") is None
    assert _value(metrics, "tiergate_precise_share") == 1.0


def test_a_stream_records_ttft_and_time_per_output_token() -> None:
    """TTFT is the first chunk; TPOT spreads the rest of the stream over the other tokens."""
    metrics = _metrics()
    ctx = finished_context(stream=True, usage=Usage(10, 11, 0), first_chunk_s=0.2)
    metrics.record(ctx, "complete", 1.2, 0.0003)
    assert _value(metrics, "tiergate_time_to_first_token_seconds_sum", tier="fast") == 0.2
    assert _value(metrics, "tiergate_time_per_output_token_seconds_sum", tier="fast") == (
        (1.2 - 0.2) / 10
    )
    assert _value(metrics, "tiergate_precise_share") == 0.0


def test_stream_aborts_are_counted_by_cause() -> None:
    """A stream cut mid-way counts under its cause; a client leaving early counts too."""
    metrics = _metrics()
    metrics.record(finished_context(stream=True, first_chunk_s=0.1), "upstream_stall", 2.0, 0.0)
    gone = finished_context(stream=True, status=499)
    metrics.record(gone, "ClientGone", 0.5, 0.0)
    failed = finished_context(stream=True, status=502)
    metrics.record(failed, "UpstreamUnavailable", 0.5, 0.0)
    assert _value(metrics, "tiergate_stream_aborts_total", cause="upstream_stall") == 1.0
    assert _value(metrics, "tiergate_stream_aborts_total", cause="client_disconnect") == 1.0
    assert "UpstreamUnavailable" not in generate_latest(metrics.registry).decode()


def test_rate_limit_rejections_are_counted() -> None:
    """A 429 from the limiter counts as a rejection, not as an allowed request."""
    metrics = _metrics()
    ctx = finished_context(status=429)
    ctx.admitted = False
    ctx.failure = Failure.of(RateLimited("over the limit"))
    metrics.record(ctx, "RateLimited", 0.001, 0.001)
    assert (
        _value(
            metrics,
            "tiergate_ratelimit_decisions_total",
            limit="rate_limit_exceeded",
            outcome="rejected",
        )
        == 1.0
    )
    assert (
        _value(metrics, "tiergate_ratelimit_decisions_total", limit="all", outcome="allowed") == 0.0
    )


def test_replica_gauges_attempts_and_retries_are_read_at_scrape_time() -> None:
    """Health, in-flight, attempt outcomes and retries come from the live replica pools."""
    pool = ReplicaPool("fast", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"], 8, 1.0)
    up, down = pool.replicas
    metrics = _metrics({"fast": pool})
    pool.lease(up)
    down.healthy = False
    pool.record_success(up)
    pool.record_failure(down, "connect", "refused", counts=True)
    pool.count_retry("connect")
    assert (
        _value(metrics, "tiergate_replica_in_flight", tier="fast", replica="10.0.0.1:8000") == 1.0
    )
    assert _value(metrics, "tiergate_replica_healthy", tier="fast", replica="10.0.0.2:8000") == 0.0
    assert (
        _value(
            metrics,
            "tiergate_upstream_attempts_total",
            tier="fast",
            replica="10.0.0.2:8000",
            outcome="connect",
        )
        == 1.0
    )
    assert _value(metrics, "tiergate_upstream_retries_total", tier="fast", reason="connect") == 1.0
    assert _value(metrics, "tiergate_precise_share_target") == 0.3


def test_families_are_exposed_before_the_first_request_and_buckets_include_their_bound() -> None:
    """The unlabelled overhead histogram and the allowed counter show zeros at start; a value
    equal to a bucket's bound counts in that bucket (Prometheus ``le``)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = GatewayMetrics(registry, {}, precise_tier="precise", target_share=0.3)
    text = generate_latest(registry).decode()
    assert 'tiergate_overhead_seconds_bucket{le="+Inf"} 0.0' in text
    assert 'tiergate_ratelimit_decisions_total{limit="all",outcome="allowed"} 0.0' in text
    ctx = finished_context()
    metrics.record(ctx, "complete", 0.025, 0.0005)
    assert _value(metrics, "tiergate_overhead_seconds_bucket", le="0.0005") == 1.0
    assert _value(metrics, "tiergate_overhead_seconds_bucket", le="0.00025") == 0.0
    assert _value(metrics, "tiergate_overhead_seconds_count") == 1.0
    bucket = "tiergate_request_duration_seconds_bucket"
    assert _value(metrics, bucket, le="0.025", route=ctx.route, tier="fast") == 1.0
    assert _value(metrics, bucket, le="0.01", route=ctx.route, tier="fast") == 0.0


async def test_the_key_limiters_own_refusals_are_counted_by_the_limit_they_hit() -> None:
    """The limiter raises a subclass of RateLimited (naming requests, tokens or concurrency):
    it is counted as rejected under that limit (the check once compared class names)."""
    limiter = KeyLimiter(MemoryRateLimiter(), metrics=LimitMetrics())
    principal = Principal("kid", "tenant", KeyPolicy(rpm=1))
    await limiter.admit(principal, 10)
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(principal, 10)
    metrics = _metrics()
    ctx = finished_context(status=429)
    ctx.admitted = False
    ctx.failure = Failure.of(refused.value)
    metrics.record(ctx, ctx.failure.kind, 0.001, 0.001)
    name = "tiergate_ratelimit_decisions_total"
    assert _value(metrics, name, limit="requests", outcome="rejected") == 1.0


def test_negative_usage_from_a_backend_never_lowers_the_token_counters() -> None:
    """A backend that reports negative token counts: they count as zero (a counter that goes
    down reads as a reset to Prometheus), and the limits are settled with zero, not a refund."""
    usage = usage_from({"usage": {"prompt_tokens": -1000, "completion_tokens": -5}})
    assert usage == Usage(0, 0, 0)
    metrics = _metrics()
    ctx = finished_context(usage=Usage(12, 7, 0))
    metrics.record(ctx, "complete", 0.001, 0.001)
    metrics.tokens.inc(("fast", "input"), -1000)
    assert _value(metrics, "tiergate_tokens_total", tier="fast", direction="input") == 12.0


def test_a_nan_observation_is_not_counted() -> None:
    """NaN would sit in every bucket (every comparison fails) and poison the sum: it is left out."""
    metrics = _metrics()
    metrics.overhead.observe((), float("nan"))
    metrics.overhead.observe((), 0.0003)
    assert _value(metrics, "tiergate_overhead_seconds_count") == 1.0
    assert _value(metrics, "tiergate_overhead_seconds_sum") == 0.0003
    assert _value(metrics, "tiergate_overhead_seconds_bucket", le="0.0001") == 0.0
