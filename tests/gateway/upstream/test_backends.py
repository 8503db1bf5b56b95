"""Backend kinds against real simulator processes of every flavour: detection, probe route,
metric parsing, re-detection after an outage, and the admin view of what was found."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from gateway.config.settings import HealthSettings
from gateway.config.tier_settings import TierSettings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.upstream import backends
from gateway.upstream.attempt import AttemptFailed
from gateway.upstream.backends import DETECTION_TIMEOUT_S, kind_of, probe_timeout
from gateway.upstream.explain import every_tier_failed, final_error, why_none
from gateway.upstream.health import HealthConfig, HealthMonitor, parse_metrics
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import ReplicaPool
from policies.backends import KINDS, Probe
from tests.processes import free_port
from tests.simulator.procs import SimulatorFactory, SimulatorProcess, start_simulator

__all__ = ["start_simulator"]

# flavour -> (detected kind, probe route)
EXPECTED = {
    "vllm": ("vllm", "/health"),
    "sglang": ("sglang", "/health"),
    "llamacpp": ("llamacpp", "/health"),
    "llamacpp-python": ("llamacpp", "/docs"),
    "ollama": ("ollama", "/api/version"),
    "tgi": ("tgi", "/health"),
}


def _chat(sim: SimulatorProcess) -> None:
    body = {"messages": [{"role": "user", "content": "x " * 200}], "max_tokens": 2}
    request = urllib.request.Request(  # noqa: S310 - local http URL built by us
        sim.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - same
        assert response.status == 200


@pytest.mark.parametrize("flavor", sorted(EXPECTED))
async def test_auto_detects_every_flavour(
    start_simulator: SimulatorFactory, client: UpstreamPool, flavor: str
) -> None:
    """``auto`` names the server, probes a route it has, and keeps it healthy."""
    sim = start_simulator("--flavor", flavor, "--latency-scale", "0", "--health-delay", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    replica = pool.replicas[0]
    assert (replica.kind, replica.health_path) == EXPECTED[flavor]
    assert replica.resolved
    assert replica.detection
    assert replica.healthy
    assert monitor.readiness() == {"fast": True}


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp", "tgi"])
async def test_metrics_of_every_flavour_land_on_the_replica(
    start_simulator: SimulatorFactory, client: UpstreamPool, flavor: str
) -> None:
    """Each kind's own sample names are read into running/waiting/KV/prefix numbers."""
    sim = start_simulator(
        "--flavor",
        flavor,
        "--latency-scale",
        "0",
        "--health-delay",
        "0",
        "--kv-blocks",
        "64",
        "--metrics",
        "on",
    )
    await asyncio.to_thread(_chat, sim)
    await asyncio.to_thread(_chat, sim)  # the second one hits the prefix cache
    text = sim.metrics_text()
    load = parse_metrics(text, KINDS[flavor])
    assert (load.running, load.waiting) == (0.0, 0.0)
    stats = sim.stats()
    if flavor in ("vllm", "llamacpp", "sglang"):
        assert load.kv_usage == pytest.approx(stats["kv_cache_usage"])
    if flavor in ("vllm", "sglang"):
        assert load.prefix_hits == stats["prefix_cache_hits"] > 0
        assert load.prefix_queries == stats["prefix_cache_queries"]
    if flavor == "sglang":
        assert load.prefix_hit_rate == pytest.approx(
            stats["prefix_cache_hits"] / stats["prefix_cache_queries"]
        )
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    assert pool.replicas[0].scraped_at > 0


async def test_no_metrics_are_scraped_where_the_kind_has_none(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """Ollama has no /metrics: the monitor does not ask for it, the replica stays healthy."""
    sim = start_simulator("--flavor", "ollama", "--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1, kind="ollama")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    replica = pool.replicas[0]
    assert replica.healthy
    assert replica.scraped_at == 0.0
    assert kind_of(replica).metrics_path is None


async def test_a_slow_sglang_health_is_not_a_timeout(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """SGLang's ~1 s /health passes with the default 0.5 s timeout: the kind allows more."""
    sim = start_simulator("--flavor", "sglang", "--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1, kind="sglang")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=0.5, unhealthy_after=1))
    monitor.client = client
    await monitor.check_once()
    await monitor.check_once()
    assert pool.replicas[0].healthy
    assert pool.replicas[0].check_failures == 0


async def test_a_server_without_health_is_probed_on_the_model_list(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """A configured kind whose health route the server lacks falls back to /v1/models."""
    sim = start_simulator("--flavor", "ollama", "--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1, kind="vllm")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    replica = pool.replicas[0]
    assert (replica.kind, replica.health_path, replica.healthy) == ("vllm", "/v1/models", True)


async def test_detection_waits_for_the_server_and_reruns_after_an_outage(
    client: UpstreamPool,
) -> None:
    """Unreachable at start-up: unknown and unhealthy; up: detected; down and back: again."""
    port = free_port()
    pool = ReplicaPool("fast", [f"http://127.0.0.1:{port}"], 4, 0.1)
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=1.0))
    monitor.client = client
    replica = pool.replicas[0]
    await monitor.check_once()
    assert (replica.kind, replica.resolved, replica.healthy) == (None, False, False)
    args = ("--port", str(port), "--latency-scale", "0", "--health-delay", "0")
    with SimulatorProcess("--flavor", "tgi", *args):
        await monitor.check_once()
        assert (replica.kind, replica.healthy) == ("tgi", True)
    await monitor.check_once()
    assert not replica.healthy
    assert not replica.resolved
    with SimulatorProcess("--flavor", "llamacpp", *args):
        await monitor.check_once()
        assert (replica.kind, replica.healthy) == ("llamacpp", True)


async def test_an_override_is_probed_as_given(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """The tier's health_path wins over the kind's routes, even when it answers 404."""
    sim = start_simulator("--flavor", "llamacpp-python", "--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1, health_path="/health")
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    replica = pool.replicas[0]
    assert replica.kind == "llamacpp"
    assert not replica.healthy
    assert replica.last_probe_error == "health check: /health answered 404"


def test_settings_take_known_kinds_only() -> None:
    """A tier's kind defaults to auto with no health_path; an unknown kind is refused."""
    tier = TierSettings(model="m", replicas=["http://127.0.0.1:1"])
    assert (tier.kind, tier.health_path) == ("auto", None)
    assert TierSettings(model="m", replicas=["http://h:1"], kind="sglang").kind == "sglang"
    with pytest.raises(ValidationError):
        TierSettings(model="m", replicas=["http://h:1"], kind="vllm-ish")  # type: ignore[arg-type]  # the refusal under test


def test_many_replicas_are_counted_not_listed() -> None:
    """An error about a large tier names a few replicas and counts the rest."""
    pool = ReplicaPool("fast", [f"http://10.0.0.{i}:8000" for i in range(20)], 4, 0.1)
    for replica in pool.replicas:
        replica.healthy = False
        replica.last_probe_error = "health check: could not connect"
    text = why_none(pool, 0.0)
    assert text.count("replica fast#") == 8
    assert "10.0.0." not in text
    assert text.endswith("and 12 more")


def test_the_kind_is_a_prometheus_label() -> None:
    """tiergate_replica_backend_info says each replica's configured and detected kind."""
    pool = ReplicaPool("fast", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"], 8, 1.0)
    pool.replicas[0].kind = "sglang"
    metrics = GatewayMetrics(
        CollectorRegistry(), {"fast": pool}, precise_tier="precise", target_share=0.3
    )
    sample = metrics.registry.get_sample_value
    assert (
        sample(
            "tiergate_replica_backend_info",
            {"tier": "fast", "replica": "10.0.0.1:8000", "configured": "auto", "kind": "sglang"},
        )
        == 1
    )
    assert (
        sample(
            "tiergate_replica_backend_info",
            {"tier": "fast", "replica": "10.0.0.2:8000", "configured": "auto", "kind": "unknown"},
        )
        == 1
    )


def test_summaries_name_each_distinct_answer_once() -> None:
    """Retries that met the same answer are counted; one tier's own words stay first."""
    failures = []
    for _ in range(3):
        failure = AttemptFailed("status_500", "Boom.", status=500)
        failure.replica = "fast#1"
        failures.append(failure)
    error = final_error("fast", failures[-1], failures)
    assert error.detail == "replica fast#1: Boom (x3)"
    one = every_tier_failed([("fast", error)])
    assert one.message == (
        "The 'fast' tier could not serve the request: Boom (replica fast#1: Boom (x3))."
    )
    pool = ReplicaPool("fast", ["http://10.0.0.2:8000"], 4, 0.1)
    pool.replicas[0].healthy = False
    pool.replicas[0].last_probe_error = "health check: could not connect"
    missing = AttemptFailed(
        "no_replica", f"No healthy replica in tier 'fast': {why_none(pool, 0.0)}."
    )
    alone = every_tier_failed([("fast", final_error("fast", missing, [missing]))])
    assert alone.message == (
        "No healthy replica in tier 'fast': replica fast#1 "
        "unhealthy (health check: could not connect)."
    )


def test_probe_timeouts_per_kind_are_the_documented_ones() -> None:
    """docs/backends.md: the probe waits max(health.timeout_s, the kind's minimum): SGLang 3 s,
    llama.cpp 2 s, the others 1 s, vLLM the configured 0.5 s; detection waits up to 3 s; a
    replica not yet detected is treated as ``openai``."""
    expected = {
        "vllm": 0.5,
        "sglang": 3.0,
        "llamacpp": 2.0,
        "ollama": 1.0,
        "tgi": 1.0,
        "trtllm": 1.0,
        "litellm": 1.0,
        "openai": 1.0,
    }
    assert set(expected) == set(KINDS)
    assert HealthSettings().timeout_s == 0.5
    for kind, seconds in expected.items():
        (replica,) = ReplicaPool("fast", ["http://127.0.0.1:1"], 4, 0.1, kind=kind).replicas
        assert probe_timeout(replica, HealthSettings().timeout_s) == seconds, kind
        assert probe_timeout(replica, 5.0) == 5.0, kind  # a longer configured timeout wins
    (unknown,) = ReplicaPool("fast", ["http://127.0.0.1:1"], 4, 0.1).replicas
    assert kind_of(unknown).name == "openai"
    assert DETECTION_TIMEOUT_S == 3.0


def _cold_litellm(warm: list[bool]) -> backends.Getter:
    """A LiteLLM proxy's answers; until ``warm[0]``, its schema takes longer than a probe."""
    schema = b'{"openapi":"3.1.0","info":{"title":"LiteLLM API"}}'
    models = b'{"data":[{"id":"m","object":"model","owned_by":"openai"}],"object":"list"}'

    async def get(url: str, _timeout_s: float) -> Probe:
        path = url.removeprefix("http://peer:4000")
        if path == "/openapi.json":
            return Probe(200, schema) if warm[0] else Probe(None)
        answers = {"/v1/models": Probe(200, models), "/health/readiness": Probe(200, b"{}")}
        return answers.get(path, Probe(404))

    return get


async def test_a_cold_litellm_proxy_is_detected_on_a_later_round() -> None:
    """A LiteLLM proxy answers its first requests in seconds: a generic finding made while a
    detection route did not answer is provisional, and the next round names the proxy."""
    (replica,) = ReplicaPool("fast", ["http://peer:4000"], 4, 0.1).replicas
    warm = [False]
    await backends.resolve(replica, _cold_litellm(warm), 0.5)
    assert (replica.kind, replica.resolved) == ("openai", False)
    warm[0] = True
    await backends.resolve(replica, _cold_litellm(warm), 0.5)
    assert (replica.kind, replica.probe_path, replica.resolved) == (
        "litellm",
        "/health/readiness",
        True,
    )


async def test_a_generic_finding_stands_after_a_few_late_rounds() -> None:
    """A route that never answers in time does not make detection run every round forever."""
    (replica,) = ReplicaPool("fast", ["http://peer:4000"], 4, 0.1).replicas
    for _ in range(backends.DETECTION_TRIES):
        assert not replica.resolved
        await backends.resolve(replica, _cold_litellm([False]), 0.5)
    assert (replica.kind, replica.resolved) == ("openai", True)


def test_replicas_are_labelled_by_tier_and_place_for_callers() -> None:
    """Each replica has a caller-facing label, its tier and 1-based place in the tier's list,
    beside its host:port name (which logs, metrics and the admin view keep)."""
    pool = ReplicaPool("precise", ["http://u:p@10.0.0.1:8000", "http://10.0.0.2:8000"], 4, 0.1)
    assert [r.label for r in pool.replicas] == ["precise#1", "precise#2"]
    assert [r.name for r in pool.replicas] == ["10.0.0.1:8000", "10.0.0.2:8000"]
