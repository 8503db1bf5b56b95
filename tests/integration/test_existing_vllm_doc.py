"""docs/existing-vllm.md: its marked blocks run as printed against simulators and Redis.

Two simulators stand in for the reader's vLLM servers (same served model names), a real
redis-server for their Redis; the convention is described in tests/markdown_blocks.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.markdown_blocks import REPO, marked_blocks, run_blocks, scratch_dir
from tests.processes import free_port
from tests.redis_server import RedisServer
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow
DOC = REPO / "docs/existing-vllm.md"


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[SimulatorProcess, SimulatorProcess, RedisServer]]:
    """Simulated `qwen-awq` and `qwen-fp16` servers and a redis-server."""
    fast = SimulatorProcess("--profile", "fast", "--model", "qwen-awq", "--latency-scale", "0")
    precise = SimulatorProcess(
        "--profile", "precise", "--model", "qwen-fp16", "--latency-scale", "0"
    )
    with fast, precise, RedisServer() as redis:
        yield fast, precise, redis


def test_walkthrough_runs_as_printed(
    backends: tuple[SimulatorProcess, SimulatorProcess, RedisServer], tmp_path: Path
) -> None:
    """Config, check, keys in Redis, start with 5 % tracing, calls, admin API: all succeed."""
    fast, precise, redis = backends
    ports = {
        8001: fast.port,
        8002: precise.port,
        6379: redis.port,
        8080: free_port(),
        4318: free_port(),
    }
    blocks = marked_blocks(DOC)
    assert len(blocks) >= 5
    result = run_blocks(blocks, cwd=scratch_dir(tmp_path / "clone"), ports=ports)
    log_path = tmp_path / "clone/tiergate-prod/tiergate.log"
    log = log_path.read_text() if log_path.exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + log[-3000:]
    out = result.stdout
    assert 'auth.store: "redis"' in out
    assert "telemetry.trace_sample_ratio: 0.05" in out
    assert "ok: private backends only" in out
    assert '"status":"ready"' in out
    assert '"id":"qwen-fp16"' in out
    assert "HTTP/1.1 200" in out
    assert "x-tiergate-tier:" in out.lower()
    assert '"replicas"' in out
    assert "Traceback" not in log
