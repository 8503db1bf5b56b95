"""Start-up with a DNS server that never answers: the exposure check does not hold it up.

The start-up exposure check resolves private-looking backend names (``vllm-fast``,
``redis.internal``) to catch one pointed at a public address. A real ``tiergate serve`` runs in
a mount namespace of its own whose ``/etc/resolv.conf`` names a local UDP socket that reads
queries and never answers (a DNS server down, as when CoreDNS restarts with the gateway). The
resolver then waits its full timeout for each name; the gateway must be up in about the same
time however many names it has, not in their sum.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.gateway_proc import REPO_ROOT
from tests.processes import free_port, http_answers, terminate

# Each lookup waits 3 s twice (A and AAAA go out together) before it gives up: 6 s a name.
RESOLV_CONF = "nameserver {address}\noptions timeout:3 attempts:2\n"
NAMES = ["vllm-a", "vllm-b", "vllm-c.internal", "vllm-d", "vllm-e.svc", "vllm-f.lan"]
UP_WITHIN_S = 20.0  # the names' timeouts in a row: 36 s


@pytest.fixture
def silent_dns() -> Iterator[str]:
    """A UDP socket on port 53 of a loopback address that swallows every query."""
    address = "127.77.0.53"
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((address, 53))
    except OSError as error:  # not root, or taken
        sock.close()
        pytest.skip(f"cannot listen on {address}:53: {error}")
    stop = threading.Event()

    def swallow() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    yield address
    stop.set()
    thread.join(timeout=5)
    sock.close()


def _namespaced(resolv_conf: Path) -> list[str]:
    """The command prefix that runs a process with ``resolv_conf`` as its /etc/resolv.conf."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare")
    probe = subprocess.run(
        [unshare, "-m", "sh", "-c", f"mount --bind {resolv_conf} /etc/resolv.conf"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode(errors='replace')}")
    return [unshare, "-m", "sh", "-c", f'mount --bind {resolv_conf} /etc/resolv.conf && exec "$@"']


def test_gateway_starts_promptly_when_dns_never_answers(silent_dns: str, tmp_path: Path) -> None:
    """Six private-looking backend names, a DNS server that never answers: up in well under
    the 36 s their lookups take one after another, and the names still count as private (no
    finding refuses the start; they could not be resolved)."""
    resolv_conf = tmp_path / "resolv.conf"
    resolv_conf.write_text(RESOLV_CONF.format(address=silent_dns), encoding="utf-8")
    replicas = [f"http://{name}:8000" for name in NAMES]
    config = {
        "tiers": {
            "fast": {"model": "m1", "replicas": replicas[:3]},
            "precise": {"model": "m2", "replicas": replicas[3:]},
        },
        "exposure": {"mode": "strict"},
        "auth": {"enabled": False},
    }
    config_path = tmp_path / "tiergate.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log_path = tmp_path / "gateway.log"
    command = [
        *_namespaced(resolv_conf),
        "tiergate",
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config_path),
        "--port",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"}
    with log_path.open("wb") as log:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=log, env=env)
        try:
            up = False
            while time.monotonic() - started < 60:
                if proc.poll() is not None:
                    break
                if http_answers(f"http://127.0.0.1:{port}/livez"):
                    up = True
                    break
                time.sleep(0.1)
            took = time.monotonic() - started
        finally:
            terminate(proc)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    assert up, f"the gateway never came up ({took:.0f} s):\n{text[-3000:]}"
    assert took < UP_WITHIN_S, f"up after {took:.1f} s:\n{text[-3000:]}"
