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

pytestmark = pytest.mark.slow  # an attack suite of real processes: make test-all and CI

# Each lookup waits 3 s twice (A and AAAA go out together) before it gives up: 6 s a name.
RESOLV_CONF = "nameserver {address}\noptions timeout:3 attempts:2\n"
NAMES = ["vllm-a", "vllm-b", "vllm-c.internal", "vllm-d", "vllm-e.svc", "vllm-f.lan"]
LATER_BY_AT_MOST_S = 15.0  # than with a DNS that answers: the timeouts in a row are 36 s


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
    return [
        unshare,
        "-m",
        "sh",
        "-c",
        f'mount --bind {resolv_conf} /etc/resolv.conf && exec "$@"',
        "tiergate",
    ]


def _time_to_live(prefix: list[str], config_path: Path, log_path: Path) -> float:
    """Seconds from spawning ``tiergate serve`` (one worker) until ``/livez`` answers."""
    port = free_port()
    command = [
        *prefix,
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config_path),
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TIERGATE_CONFIG"}
    with log_path.open("wb") as log:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=log, env=env)
        try:
            while time.monotonic() - started < 90:
                if proc.poll() is not None:
                    break
                if http_answers(f"http://127.0.0.1:{port}/livez"):
                    return time.monotonic() - started
                time.sleep(0.1)
        finally:
            terminate(proc)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    raise AssertionError(f"the gateway never came up:\n{text[-3000:]}")


def test_gateway_starts_promptly_when_dns_never_answers(silent_dns: str, tmp_path: Path) -> None:
    """Six private-looking backend names, a DNS server that never answers: up about as soon
    as with a DNS server that answers at once (not the 36 s the lookups take one after
    another later), the names still private (strict mode starts: nothing refuses it)."""
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
    prefix = _namespaced(resolv_conf)
    usual = _time_to_live([], config_path, tmp_path / "usual.log")
    silent = _time_to_live(prefix, config_path, tmp_path / "silent.log")
    assert silent < usual + LATER_BY_AT_MOST_S, (usual, silent)
