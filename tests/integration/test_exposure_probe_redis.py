"""``tiergate check-exposure --probe`` audits Redis's bind too, not only the model servers.

The gateway reaches Redis on ``127.0.0.1``; a ``redis-server`` bound to every interface
(the official image's default, or ``bind 0.0.0.0`` in redis.conf) answers anyone on the
host's networks, where the keys store and the rate limits live. The probe connects (TCP
only, nothing sent) to the Redis port on this host's own non-loopback addresses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config.exposure_probe import host_addresses
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

REPO = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "tiergate.yaml"
    tiers = {
        "fast": {"model": "tiergate-fast", "replicas": ["http://127.0.0.1:9"]},
        "precise": {"model": "tiergate-precise", "replicas": ["http://127.0.0.1:9"]},
    }
    settings = {"tiers": tiers, "ratelimit": {"backend": "redis"}, "redis": {"url": redis_url}}
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return subprocess.run(  # our own CLI, arguments we built
        [sys.executable, "-m", "gateway", "check-exposure", "--probe", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_redis_on_every_interface_is_reported(tmp_path: Path) -> None:
    """redis-server bound to 0.0.0.0 behind a 127.0.0.1 URL: exit 1, redis_all_interfaces."""
    ipv4 = [a for a in host_addresses() if ":" not in a]
    if not ipv4:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    with RedisServer(bind="0.0.0.0") as redis:  # the exposure under test
        url = f"redis://:s3cret-pass@127.0.0.1:{redis.port}/0"
        result = _probe(tmp_path, url)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "[redis_all_interfaces]" in line]
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("error: redis.url: ")
    assert any(address in lines[0] for address in ipv4)
    assert "s3cret-pass" not in result.stdout + result.stderr


def test_a_loopback_only_redis_passes_the_probe(tmp_path: Path) -> None:
    """redis-server bound to 127.0.0.1: no Redis finding."""
    with RedisServer() as redis:
        result = _probe(tmp_path, redis.url)
    assert "redis_all_interfaces" not in result.stdout, result.stdout
    assert "redis.url" not in result.stdout, result.stdout
