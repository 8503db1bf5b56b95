"""Knowing the replicas: /metrics parsing (current and deprecated vLLM names) and probing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from structlog.testing import capture_logs

from gateway.upstream.health import HealthConfig, HealthMonitor, parse_metrics
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import ReplicaPool
from tests.gateway.raw_upstream import RawUpstream, answer
from tests.processes import free_port
from tests.simulator.procs import SimulatorFactory, start_simulator

__all__ = ["start_simulator"]

CURRENT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
"""

LEGACY = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:gpu_prefix_cache_queries_total{model_name="m"} 50.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 10.0
"""


def test_parses_current_names() -> None:
    """The V1 engine's gauges and prefix-cache counters are read."""
    load = parse_metrics(CURRENT)
    assert (load.running, load.waiting, load.kv_usage) == (3.0, 7.0, 0.42)
    assert (load.prefix_queries, load.prefix_hits) == (1000.0, 600.0)


def test_parses_deprecated_names() -> None:
    """Older servers' gpu_cache_usage_perc and gpu_prefix_cache_* are understood."""
    load = parse_metrics(LEGACY)
    assert load.kv_usage == 0.9
    assert (load.prefix_queries, load.prefix_hits) == (50.0, 10.0)


def test_current_name_wins_over_deprecated() -> None:
    """A page with both names (vLLM's transition releases) uses the current one."""
    load = parse_metrics(LEGACY + CURRENT)
    assert load.kv_usage == 0.42
    assert load.prefix_hits == 600.0


def test_label_sets_are_summed_and_kv_is_the_max() -> None:
    """Several engines on one server: counts add up, KV usage is the fullest engine's."""
    text = CURRENT + CURRENT.replace('engine="0"', 'engine="1"').replace("0.42", "0.8")
    load = parse_metrics(text)
    assert load.waiting == 14.0
    assert load.kv_usage == 0.8


def test_junk_and_missing_samples() -> None:
    """Unparseable lines are skipped; absent samples stay None."""
    load = parse_metrics('vllm:num_requests_running{a="b"} NaNx\nvllm:num_requests_waiting 2\n')
    assert load.running is None
    assert load.waiting == 2.0
    assert load.kv_usage is None


async def test_probes_a_real_replica(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """A live simulator is healthy and its /metrics numbers land on the replica."""
    sim = start_simulator("--latency-scale", "0", "--kv-blocks", "64")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    assert monitor.readiness() is None  # nothing probed yet
    await monitor.check_once()
    replica = pool.replicas[0]
    assert replica.healthy
    assert replica.scraped_at > 0
    assert replica.kv_usage == 0.0
    assert monitor.readiness() == {"fast": True}


async def test_a_dead_engine_is_unhealthy_at_once_and_recovers(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """/health 503 (vLLM's dead engine) marks the replica unhealthy; 200 brings it back."""
    sim = start_simulator("--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0, unhealthy_after=3))
    monitor.client = client
    await sim.aset_faults(healthy=False)
    await monitor.check_once()
    replica = pool.replicas[0]
    assert not replica.healthy
    assert replica.recent_errors[-1].kind == "health_check"
    assert monitor.readiness() == {"fast": False}
    await sim.aset_faults(healthy=True)
    await monitor.check_once()
    assert replica.healthy


async def test_refused_connections_mark_unhealthy(client: UpstreamPool) -> None:
    """Nothing listening is definitive: one probe is enough."""
    pool = ReplicaPool("fast", [f"http://127.0.0.1:{free_port()}"], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=1.0, unhealthy_after=3))
    monitor.client = client
    await monitor.check_once()
    assert not pool.replicas[0].healthy


async def test_start_and_stop_the_background_task(client: UpstreamPool) -> None:
    """The monitor runs rounds in the background until stopped."""
    pool = ReplicaPool("fast", [f"http://127.0.0.1:{free_port()}"], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(interval_s=0.05, timeout_s=0.2))
    monitor.start(client)
    for _ in range(100):
        if monitor.rounds >= 2:
            break
        await asyncio.sleep(0.02)
    await monitor.stop()
    assert monitor.rounds >= 2


async def test_a_tier_may_probe_another_path(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """A server without /health (llama.cpp) is probed on the tier's health_path instead."""
    sim = start_simulator("--latency-scale", "0")
    missing = ReplicaPool("fast", [sim.url], 4, 0.1, health_path="/no-such-route")
    models = ReplicaPool("precise", [sim.url], 4, 0.1, health_path="/v1/models")
    monitor = HealthMonitor({"fast": missing, "precise": models}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    assert not missing.replicas[0].healthy
    assert models.replicas[0].healthy


async def test_the_background_task_does_not_inherit_a_requests_context(
    client: UpstreamPool,
) -> None:
    """Started while a request's log context is bound, the probes still log without it."""
    pool = ReplicaPool("fast", [f"http://127.0.0.1:{free_port()}"], 4, 0.1)
    seen: list[dict[str, object]] = []

    class Recording(HealthMonitor):
        async def check_once(self) -> None:
            seen.append(structlog.contextvars.get_contextvars())

    monitor = Recording({"fast": pool}, HealthConfig(interval_s=0.05, timeout_s=0.2))
    structlog.contextvars.bind_contextvars(request_id="req-1", trace_id="ab" * 16)
    try:
        monitor.start(client)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        await monitor.stop()
    finally:
        structlog.contextvars.clear_contextvars()
    assert seen
    assert all("request_id" not in ctx and "trace_id" not in ctx for ctx in seen)


async def test_misconfigured_replica_is_cleared_once_its_key_is_accepted(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """The monitor re-checks a misconfigured replica on /v1/models with the tier's key."""
    sim = start_simulator("--latency-scale", "0", "--api-key", "right")
    wrong = ReplicaPool("fast", [sim.url], 4, 0.1)
    right = ReplicaPool("precise", [sim.url], 4, 0.1)
    for pool in (wrong, right):
        pool.mark_misconfigured(pool.replicas[0], 401)
    monitor = HealthMonitor(
        {"fast": wrong, "precise": right},
        HealthConfig(scrape_metrics=False),
        credentials={
            "fast": {"Authorization": "Bearer wrong"},
            "precise": {"Authorization": "Bearer right"},
        },
    )
    monitor.client = client
    with capture_logs() as logs:
        await monitor.check_once()
    assert wrong.replicas[0].misconfigured
    assert not right.replicas[0].misconfigured
    assert monitor.readiness() == {"fast": False, "precise": True}
    accepted = [line for line in logs if line["event"] == "replica.credentials_accepted"]
    assert [line["tier"] for line in accepted] == ["precise"]


async def test_a_misconfigured_replica_is_rechecked_at_most_every_5_s(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """docs/vllm-compat.md: re-checked every 5 s on /v1/models with the tier's key, not on
    every health round."""
    sim = start_simulator("--latency-scale", "0", "--api-key", "right")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    pool.mark_misconfigured(pool.replicas[0], 401)
    monitor = HealthMonitor(
        {"fast": pool},
        HealthConfig(scrape_metrics=False),
        credentials={"fast": {"Authorization": "Bearer wrong"}},
    )
    monitor.client = client
    rechecks: list[str] = []
    probe = monitor._get

    async def counting(url: str, headers: Any = None, timeout_s: float | None = None) -> Any:
        if headers and url.endswith("/v1/models") and timeout_s is None:
            rechecks.append(url)
        return await probe(url, headers, timeout_s)

    monitor._get = counting  # type: ignore[method-assign]
    started = time.monotonic()
    for _ in range(3):
        await monitor.check_once()
    assert time.monotonic() - started < 5.0
    assert len(rechecks) == 1
    assert pool.replicas[0].misconfigured


async def test_a_model_list_nested_too_deep_is_survived(client: UpstreamPool) -> None:
    """One replica answering JSON nested 3000 deep everywhere: every replica is still probed."""
    deep = b'{"data":' + b"[" * 3000 + b"]" * 3000 + b"}"

    async def respond(_n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(deep))
        await writer.drain()
        return True

    server = await RawUpstream(respond).start()
    down = f"http://127.0.0.1:{free_port()}"
    pool = ReplicaPool("fast", [server.url, down], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(interval_s=0.02, timeout_s=0.5))
    try:
        monitor.start(client)
        for _ in range(200):
            if monitor.rounds >= 3:
                break
            await asyncio.sleep(0.02)
        await monitor.stop()
    finally:
        await server.stop()
    assert monitor.rounds >= 3
    assert pool.replicas[0].healthy
    assert pool.replicas[1].checked
    assert not pool.replicas[1].healthy


async def test_a_failing_round_is_logged_and_the_checks_go_on(
    client: UpstreamPool,
) -> None:
    """An unexpected error in one round is logged; the background task keeps probing."""
    pool = ReplicaPool("fast", [f"http://127.0.0.1:{free_port()}"], 4, 0.1)
    calls: list[int] = []

    class Failing(HealthMonitor):
        async def check_once(self) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RecursionError("maximum recursion depth exceeded")
            self.rounds += 1

    monitor = Failing({"fast": pool}, HealthConfig(interval_s=0.02, timeout_s=0.2))
    with capture_logs() as logs:
        monitor.start(client)
        for _ in range(200):
            if monitor.rounds >= 2:
                break
            await asyncio.sleep(0.02)
        await monitor.stop()
    assert monitor.rounds >= 2
    assert [e for e in logs if e["event"] == "health.round_failed"]
