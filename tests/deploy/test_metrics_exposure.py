"""The unauthenticated metrics port is part of the exposure check, like the gateway's own port.

``telemetry.metrics_port`` serves ``/metrics`` with no credential on ``telemetry.metrics_host``
(unset: ``server.host``). A TLS proxy in front of the gateway's port does not cover it, so a
metrics port on every interface or a public address is an error whatever
``server.tls_terminated_upstream`` says, and strict mode refuses to start with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart_render import of_kind
from tests.processes import free_port, patience, run_tiergate, terminate

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, server: dict[str, Any], telemetry: dict[str, Any]) -> Path:
    tiers = {
        "fast": {"model": "tiergate-fast", "replicas": ["http://127.0.0.1:9"]},
        "precise": {"model": "tiergate-precise", "replicas": ["http://127.0.0.1:9"]},
    }
    config = {
        "server": server,
        "tiers": tiers,
        "auth": {"enabled": False},
        "telemetry": telemetry,
        "exposure": {"mode": "strict"},
    }
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _codes(output: str) -> list[str]:
    return [line.rsplit("[", 1)[1].rstrip("]") for line in output.splitlines() if "[" in line]


def test_a_metrics_port_on_every_interface_is_an_error(tmp_path: Path) -> None:
    """Gateway on loopback, metrics on 0.0.0.0: check-exposure exits 1 naming the metrics host."""
    config = _config(
        tmp_path,
        {"host": "127.0.0.1", "port": free_port()},
        {"metrics_port": free_port(), "metrics_host": "0.0.0.0"},  # the attack
    )
    result = run_tiergate("check-exposure", "--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert _codes(result.stdout) == ["metrics_bind_all_interfaces"]
    assert "error: telemetry.metrics_host: " in result.stdout


def test_tls_in_front_of_the_gateway_does_not_cover_the_metrics_port(tmp_path: Path) -> None:
    """0.0.0.0 behind a TLS proxy suits the gateway's port, not the metrics port inheriting it."""
    config = _config(
        tmp_path,
        {"host": "0.0.0.0", "port": free_port(), "tls_terminated_upstream": True},
        {"metrics_port": free_port()},
    )
    result = run_tiergate("check-exposure", "--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert _codes(result.stdout) == ["metrics_bind_all_interfaces"]


def test_a_metrics_port_on_a_public_address_is_an_error(tmp_path: Path) -> None:
    """A public metrics_host (in any inet_aton spelling) is metrics_bind_public."""
    for host in ("8.8.8.8", "0x08080808", "[2001:4860:4860::8888]"):
        config = _config(
            tmp_path,
            {"host": "127.0.0.1", "port": free_port()},
            {"metrics_port": free_port(), "metrics_host": host},
        )
        result = run_tiergate("check-exposure", "--config", str(config))
        assert result.returncode == 1, host + result.stdout + result.stderr
        assert _codes(result.stdout) == ["metrics_bind_public"], host


def test_a_metrics_port_on_a_private_address_passes(tmp_path: Path) -> None:
    """Metrics on loopback or one private address: no finding (compose's telemetry address)."""
    for host in ("127.0.0.1", "172.30.94.10", None):
        telemetry: dict[str, Any] = {"metrics_port": free_port()}
        if host is not None:
            telemetry["metrics_host"] = host
        config = _config(tmp_path, {"host": "127.0.0.1", "port": free_port()}, telemetry)
        result = run_tiergate("check-exposure", "--config", str(config))
        assert result.returncode == 0, f"{host}: {result.stdout}{result.stderr}"
        assert result.stdout.startswith("ok:")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_strict_mode_never_opens_a_metrics_port_on_every_interface(tmp_path: Path) -> None:
    """A real `tiergate serve` in strict mode exits before anything listens on the metrics port."""
    metrics_port = free_port()
    config = _config(
        tmp_path,
        {"host": "127.0.0.1", "port": free_port()},
        {"metrics_port": metrics_port, "metrics_host": "0.0.0.0"},  # the attack
    )
    proc = subprocess.Popen(  # our own CLI, arguments we built
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.upper().startswith("TIERGATE_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + patience(60)
        opened = False
        while proc.poll() is None and time.monotonic() < deadline:
            opened = opened or _accepts(metrics_port)
            if opened:
                break
            time.sleep(0.1)
        assert not opened, "the metrics port listened on every interface in strict mode"
        assert proc.wait(timeout=patience(60)) != 0
        assert proc.stdout is not None
        assert "metrics_bind_all_interfaces" in proc.stdout.read()
    finally:
        terminate(proc)


def test_chart_binds_the_metrics_port_to_the_pod_address(
    everything_objects: list[dict[str, Any]], default_objects: list[dict[str, Any]]
) -> None:
    """The chart listens for metrics on the pod IP (status.podIP), not on every interface."""
    for objects in (everything_objects, default_objects):
        (gateway,) = [
            d
            for d in of_kind(objects, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
        ]
        (container,) = gateway["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item for item in container["env"]}
        assert env["TIERGATE_TELEMETRY__METRICS_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}
        }
