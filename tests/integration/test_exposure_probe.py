"""``tiergate check-exposure --probe`` against simulator processes (issue 36 item 4).

(a) a loopback backend that listens on every interface, found by connecting to this host's own
non-loopback addresses; (b) vLLM's open routes answering without credentials, found with
keyless GETs that never change the backend.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config.exposure_probe import host_addresses
from tests.simulator.procs import SimulatorFactory

REPO = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, port: int) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "tiergate.yaml"
    url = f"http://127.0.0.1:{port}"
    tiers = {
        "fast": {"model": "tiergate-fast", "replicas": [url]},
        "precise": {"model": "tiergate-precise", "replicas": [url]},
    }
    config.write_text(yaml.safe_dump({"tiers": tiers}), encoding="utf-8")
    command = [sys.executable, "-m", "gateway", "check-exposure", "--probe"]
    return subprocess.run(  # our own CLI, arguments we built
        [*command, "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_host_addresses_are_this_machines_own_and_not_loopback() -> None:
    """Every address found binds here (the kernel's proof it is ours) and none is loopback."""
    for address in host_addresses():
        assert not address.startswith(("127.", "::1", "fe80"))
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as sock:
            sock.bind((address, 0))


def test_a_backend_on_every_interface_is_reported(
    tmp_path: Path, start_simulator: SimulatorFactory
) -> None:
    """A simulator bound to 0.0.0.0 behind a 127.0.0.1 URL: exit 1, backend_all_interfaces."""
    ipv4 = [a for a in host_addresses() if ":" not in a]
    if not ipv4:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    sim = start_simulator("--host", "0.0.0.0", "--vllm-version", "0.11", "--api-key", "k")
    result = _probe(tmp_path, sim.port)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "[backend_all_interfaces]" in line]
    assert len(lines) == 2  # both tiers name the same replica
    assert any(address in lines[0] for address in ipv4)


def test_a_loopback_backend_with_nothing_open_passes(
    tmp_path: Path, start_simulator: SimulatorFactory
) -> None:
    """127.0.0.1 only, a key on /v1, none of vLLM's open routes (0.11 flavour): exit 0."""
    sim = start_simulator("--host", "127.0.0.1", "--vllm-version", "0.11", "--api-key", "k")
    result = _probe(tmp_path, sim.port)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok:")


def test_open_admin_routes_are_reported_without_acting_on_them(
    tmp_path: Path, start_simulator: SimulatorFactory
) -> None:
    """vLLM 0.33's open routes (dev mode, flag-gated ones on): named, exit 1; nothing slept."""
    sim = start_simulator(
        "--host", "127.0.0.1", "--dev-mode", "--enable-gated-routes", "--api-key", "k"
    )
    result = _probe(tmp_path, sim.port)
    assert result.returncode == 1
    admin = next(
        line for line in result.stdout.splitlines() if "[backend_open_admin_routes]" in line
    )
    for path in ("/scale_elastic_ep", "/sleep", "/wake_up", "/start_profile", "/stop_profile"):
        assert f"POST {path} (405)" in admin
    assert "/fault_tolerance/apply" in admin
    reads = next(line for line in result.stdout.splitlines() if "[backend_open_routes]" in line)
    for path in ("/kv_event_sources", "/tokenizer_info", "/fault_tolerance/status", "/is_sleeping"):
        assert f"GET {path} (200)" in reads
    assert "POST /is_scaling_elastic_ep (405)" in reads
    assert "[backend_without_key]" not in result.stdout  # /v1 takes the key
    assert "[backend_all_interfaces]" not in result.stdout
    stats = sim.stats()
    assert stats["sleep_level"] == 0
    assert stats["requests_total"] == 0
