"""What the health monitor reads beyond liveness (issue 36): each replica's context length
from its model card, vLLM's sleep gauge, and rotated keys on the credential re-check."""

from __future__ import annotations

from pathlib import Path

from gateway.upstream.health import MODELS_REFRESH_S, HealthConfig, HealthMonitor
from gateway.upstream.keys import UpstreamKeys
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.replicas import Replica, ReplicaPool
from gateway.upstream.worker_share import HealthShare, WorkerRole
from tests.simulator.procs import SimulatorFactory, start_simulator

__all__ = ["start_simulator"]


async def test_context_length_is_read_from_the_model_card(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """max_model_len of the tier's model card lands on the replica and the tier's minimum."""
    small = start_simulator("--latency-scale", "0", "--max-model-len", "1024")
    large = start_simulator("--latency-scale", "0", "--max-model-len", "8192")
    pool = ReplicaPool("fast", [small.url, large.url], 4, 0.1)
    monitor = HealthMonitor(
        {"fast": pool}, HealthConfig(timeout_s=2.0), served_models={"fast": "tiergate-fast"}
    )
    monitor.client = client
    await monitor.check_once()
    assert [r.max_model_len for r in pool.replicas] == [1024, 8192]
    assert pool.context_len == 1024
    assert all(r.sleep_state == "awake" for r in pool.replicas)


def _context_of(replica: Replica) -> int | None:
    """The replica's context length as read now (a call, so no narrowing carries over)."""
    return replica.max_model_len


async def test_the_model_card_is_read_again_every_60_s_not_every_round(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """docs/backends.md: ``max_model_len`` is read from ``/v1/models`` every 60 s: a health
    round within the minute leaves it alone, one after it reads it again."""
    assert MODELS_REFRESH_S == 60.0
    sim = start_simulator("--latency-scale", "0", "--max-model-len", "2048")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    (replica,) = pool.replicas
    monitor = HealthMonitor(
        {"fast": pool}, HealthConfig(timeout_s=2.0), served_models={"fast": "tiergate-fast"}
    )
    monitor.client = client
    await monitor.check_once()
    assert replica.max_model_len == 2048
    read_at = replica.models_read_at
    replica.max_model_len = None  # forgotten: only a new read brings it back
    replica.models_read_at = read_at - (MODELS_REFRESH_S - 5.0)
    await monitor.check_once()
    assert _context_of(replica) is None
    replica.models_read_at = read_at - (MODELS_REFRESH_S + 1.0)
    await monitor.check_once()
    assert _context_of(replica) == 2048
    assert replica.models_read_at > read_at


async def test_a_one_at_a_time_server_is_never_asked_its_model_list(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """llama-cpp-python's model list waits behind a generation and a waiting request makes it
    cut a running stream (another gateway's too): never read there, busy or idle."""
    sim = start_simulator("--latency-scale", "0", "--flavor", "llamacpp-python")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1, kind="llamacpp")
    replica = pool.replicas[0]
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    for in_flight in (1, 0):
        replica.in_flight = in_flight
        await monitor.check_once()
        assert replica.models_read_at == 0.0
        assert replica.max_model_len is None
    assert replica.healthy  # probed on /docs, which answers at once


async def _sleep(client: UpstreamPool, url: str, level: int) -> int:
    """Put the simulator's engine to sleep (level > 0) or wake it (0); the answer's status."""
    body = b'{"level": %d}' % level
    answer = await client.post(url + "/sim/sleep", body, {"Content-Type": "application/json"})
    await answer.read()
    answer.release()
    return answer.status


async def test_a_sleeping_engine_is_unhealthy_and_wakes_healthy(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """Gauge not awake: unhealthy at once, though /health says 200; awake: healthy again."""
    sim = start_simulator("--latency-scale", "0")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    replica = pool.replicas[0]
    monitor = HealthMonitor({"fast": pool}, HealthConfig(timeout_s=2.0))
    monitor.client = client
    await monitor.check_once()
    assert pool.ready()
    assert await _sleep(client, sim.url, 2) == 200
    await monitor.check_once()
    assert not pool.ready()
    assert replica.sleep_state == "discard_all"
    assert "engine asleep" in replica.last_probe_error
    assert monitor.readiness() == {"fast": False}
    assert await _sleep(client, sim.url, 0) == 200
    await monitor.check_once()
    assert replica.state(0.0) == "healthy"
    assert monitor.readiness() == {"fast": True}


async def test_the_credential_recheck_tries_every_key(
    start_simulator: SimulatorFactory, client: UpstreamPool
) -> None:
    """A misconfigured replica is re-checked with each key; the accepted one is kept."""
    sim = start_simulator("--latency-scale", "0", "--api-key", "second")
    pool = ReplicaPool("fast", [sim.url], 4, 0.1)
    replica = pool.replicas[0]
    pool.mark_misconfigured(replica, 401)
    keys = UpstreamKeys(["first", "second"])
    monitor = HealthMonitor({"fast": pool}, HealthConfig(scrape_metrics=False), keys={"fast": keys})
    monitor.client = client
    await monitor.check_once()
    assert not replica.misconfigured
    assert keys.for_replica(sim.url) == {"Authorization": "Bearer second"}
    assert replica.max_model_len == 8192  # the model list was read with the key it takes


def test_workers_share_context_and_sleep_state(tmp_path: Path) -> None:
    """The leader's max_model_len and sleep state reach a follower's replicas and tier."""
    leader = ReplicaPool("fast", ["http://127.0.0.1:1"], 4, 0.1)
    follower = ReplicaPool("fast", ["http://127.0.0.1:1"], 4, 0.1)
    leader.replicas[0].max_model_len = 2048
    leader.replicas[0].sleep_state = "weights_offloaded"
    share = HealthShare(WorkerRole(0, 2, tmp_path), {"fast": leader})
    HealthShare(WorkerRole(1, 2, tmp_path), {"fast": follower}).apply(share.snapshot())
    assert follower.replicas[0].max_model_len == 2048
    assert follower.replicas[0].sleep_state == "weights_offloaded"
    follower.refresh_context()
    assert follower.context_len == 2048
