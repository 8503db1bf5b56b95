"""Peer proxies beside TierGate: nginx (the floor), vllm-router (Rust) and the Portkey gateway.

Each peer is installed by the benchmark itself into its own place (nginx from Debian with
``apt-get``, vllm-router into its own virtualenv under ``bench/.peers/``, Portkey with ``npm``
under ``bench/.peers/``), reused on later runs, and pinned to the proxy core like TierGate.
A peer that cannot be installed or started raises ``LegUnavailableError`` with the reason, so
the run goes on without it and the report says why it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness.legs import (
    REPO_ROOT,
    Leg,
    LegUnavailableError,
    Placement,
    install_into,
    probe_or_stop,
    start_service,
)
from bench.harness.processes import Service, free_port

PEERS_DIR = REPO_ROOT / "bench" / ".peers"
VLLM_ROUTER_VERSION = "0.1.17"
PORTKEY_VERSION = "1.15.2"
# Portkey's streaming path appends headers to a Response whose headers @hono/node-server made
# immutable ("TypeError: immutable", Portkey-AI/gateway issue 1389), so every streamed request
# fails with HTTP 500. The issue names versions after 1.14.2; on Node 20 here 1.14.2 failed too
# and 1.13.8 streams, so npm's overrides pin 1.13.8 (non-streamed requests work with either).
PORTKEY_HONO_NODE_SERVER = "1.13.8"
NGINX_PACKAGE = "nginx-light"
VLLM_ROUTER_VENV = PEERS_DIR / "vllm-router"
PORTKEY_DIR = PEERS_DIR / "portkey"
PORTKEY_SERVER = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build"
UPSTREAM_KEY = "sk-upstream-unused"  # the fixed upstream and the simulator ignore keys


@dataclass(frozen=True)
class Installed:
    """A peer's command and the version that is installed."""

    command: Path
    version: str


def _apt_install(package: str) -> str:
    """Install a Debian package as root; return an error message ('' on success)."""
    if os.geteuid() != 0:
        return f"not root: install it with `sudo apt-get install -y {package}`"
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", package],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    return "" if proc.returncode == 0 else f"apt-get install {package} failed: {proc.stderr[-800:]}"


def ensure_nginx() -> Installed:
    """The nginx binary (Debian ``nginx-light`` installed with apt-get when absent)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if not found:
        print(f"installing {NGINX_PACKAGE} with apt-get ...", flush=True)
        error = _apt_install(NGINX_PACKAGE)
        found = shutil.which("nginx") or "/usr/sbin/nginx"
        if error or not Path(found).exists():
            raise LegUnavailableError(f"nginx is not installed and could not be: {error}")
    proc = subprocess.run([found, "-v"], capture_output=True, text=True, check=False)
    version = (proc.stderr or proc.stdout).strip().rsplit("/", 1)[-1] or "unknown"
    return Installed(Path(found), version)


def ensure_vllm_router() -> Installed:
    """``vllm-router`` from PyPI in its own virtualenv, created on first use."""
    command = VLLM_ROUTER_VENV / "bin" / "vllm-router"
    python = VLLM_ROUTER_VENV / "bin" / "python"
    if command.exists() and _pip_version(python, "vllm-router") == VLLM_ROUTER_VERSION:
        return Installed(command, VLLM_ROUTER_VERSION)
    print(f"installing vllm-router=={VLLM_ROUTER_VERSION} into {VLLM_ROUTER_VENV} ...", flush=True)
    proc = subprocess.run(
        ["python3", "-m", "venv", str(VLLM_ROUTER_VENV)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        proc = install_into(python, f"vllm-router=={VLLM_ROUTER_VERSION}")
    if proc.returncode != 0 or not command.exists():
        raise LegUnavailableError(f"pip install vllm-router failed:\n{proc.stderr[-1500:]}")
    return Installed(command, VLLM_ROUTER_VERSION)


def _pip_version(python: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def ensure_portkey() -> Installed:
    """The Portkey gateway's ``start-server.js`` installed with npm, on first use."""
    script = PORTKEY_SERVER / "start-server.js"
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise LegUnavailableError(
            "node and npm are needed for the Portkey gateway "
            "(Debian: `apt-get install -y nodejs npm`)"
        )
    hono = PORTKEY_DIR / "node_modules" / "@hono" / "node-server" / "package.json"
    if (
        script.exists()
        and _npm_version() == PORTKEY_VERSION
        and _package_version(hono) == PORTKEY_HONO_NODE_SERVER
    ):
        return Installed(script, PORTKEY_VERSION)
    print(f"installing @portkey-ai/gateway@{PORTKEY_VERSION} into {PORTKEY_DIR} ...", flush=True)
    PORTKEY_DIR.mkdir(parents=True, exist_ok=True)
    manifest = {"private": True, "overrides": {"@hono/node-server": PORTKEY_HONO_NODE_SERVER}}
    (PORTKEY_DIR / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(PORTKEY_DIR)]
    proc = subprocess.run(
        [*cmd, f"@portkey-ai/gateway@{PORTKEY_VERSION}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PORTKEY_DIR,
    )
    if proc.returncode != 0 or not script.exists():
        raise LegUnavailableError(f"npm install @portkey-ai/gateway failed:\n{proc.stderr[-1500:]}")
    return Installed(script, _npm_version() or PORTKEY_VERSION)


def _npm_version() -> str:
    return _package_version(PORTKEY_SERVER.parent / "package.json")


def _package_version(path: Path) -> str:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    version = manifest.get("version", "")
    return version if isinstance(version, str) else ""


def nginx_config(workdir: Path, port: int, upstream: Leg, streaming: bool = False) -> str:
    """One worker, ``proxy_pass`` to the upstream over kept-alive HTTP/1.1, no access log.

    ``streaming`` turns response buffering off (each event is passed on as it arrives) and
    allows enough connections for thousands of open streams.
    """
    host = upstream.base_url.removeprefix("http://")
    tmp = workdir / "nginx-tmp"
    connections = 32768 if streaming else 4096
    rlimit = f"worker_rlimit_nofile {2 * connections};\n" if streaming else ""
    indent = "\n            "
    stream_lines = (
        f"{indent}proxy_buffering off;{indent}proxy_read_timeout 600s;" if streaming else ""
    )
    return f"""\
worker_processes 1;
{rlimit}daemon off;
pid {workdir / "nginx.pid"};
error_log stderr warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream backend {{
        server {host};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";{stream_lines}
        }}
    }}
}}
"""


def start_nginx(upstream: Leg, workdir: Path, pin: Placement, streaming: bool = False) -> Leg:
    """nginx ``proxy_pass`` with upstream keep-alive, one worker, on the proxy core."""
    nginx = ensure_nginx()
    port = free_port()
    (workdir / "nginx-tmp").mkdir(exist_ok=True)
    config = workdir / "nginx.conf"
    config.write_text(nginx_config(workdir, port, upstream, streaming))
    cmd = [*pin.proxy, str(nginx.command), "-c", str(config), "-p", str(workdir)]
    service = Service("nginx", cmd, port, workdir / "nginx.log", boost=pin.boosted)
    start_service(service, "/health", timeout_s=30)
    leg = Leg(f"nginx {nginx.version}", f"http://127.0.0.1:{port}", upstream.model, None, service)
    return probe_or_stop(leg)


def vllm_router_command(
    router: Path, port: int, workers: list[str], policy: str, pin: Placement
) -> list[str]:
    """The vllm-router command line for ``workers`` under ``policy`` (logs at warning)."""
    return [
        *pin.proxy,
        str(router),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--log-level",
        "warning",
        "--worker-urls",
        *workers,
    ]


def start_vllm_router(upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """vllm-router with the upstream as its one worker, ``round_robin``, on the proxy core."""
    router = ensure_vllm_router()
    port = free_port()
    cmd = vllm_router_command(router.command, port, [upstream.base_url], "round_robin", pin)
    service = Service("vllm-router", cmd, port, workdir / "vllm-router.log", boost=pin.boosted)
    start_service(service, "/health", timeout_s=90)
    leg = Leg(
        f"vllm-router {router.version} (round_robin)",
        f"http://127.0.0.1:{port}",
        upstream.model,
        None,
        service,
    )
    return probe_or_stop(leg)


def start_portkey(upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """The Portkey gateway (headless), routed to the upstream with its custom-host header."""
    portkey = ensure_portkey()
    port = free_port()
    cmd = [*pin.proxy, "node", str(portkey.command), f"--port={port}", "--headless"]
    env = {"NODE_ENV": "production"}
    service = Service("portkey", cmd, port, workdir / "portkey.log", env, pin.boosted)
    start_service(service, "/", timeout_s=60)
    leg = Leg(
        f"Portkey gateway {portkey.version}",
        f"http://127.0.0.1:{port}",
        upstream.model,
        UPSTREAM_KEY,
        service,
        headers={
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": upstream.base_url + "/v1",
        },
    )
    return probe_or_stop(leg)


def start_python_floor(upstream: Leg, workdir: Path, pin: Placement) -> Leg:
    """The minimal Python proxy (``bench/harness/python_floor.py``) on the proxy core."""
    port = free_port()
    script = Path(__file__).resolve().parents[1] / "harness" / "python_floor.py"
    upstream_addr = upstream.base_url.removeprefix("http://")
    cmd = [*pin.proxy, sys.executable, str(script), "--port", str(port)]
    cmd += ["--upstream", upstream_addr, "--model", upstream.model]
    service = Service("python-floor", cmd, port, workdir / "python-floor.log", boost=pin.boosted)
    start_service(service, "/health", timeout_s=30)
    leg = Leg("Python floor (uvloop + httptools)", f"http://127.0.0.1:{port}", upstream.model,
              None, service)  # fmt: skip
    return probe_or_stop(leg)
