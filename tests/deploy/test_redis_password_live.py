"""A real redis-server started with the commands compose and the chart give Redis refuses a
client without the password and serves the gateway, whose settings loader reads the password
from the same secret file the deployment mounts.

What is replaced to run here, and nothing else: the secret's mount point (a temporary
directory), the address (127.0.0.1 and a free port, added after the deployment's arguments, so
they win) and the Redis host name in the gateway's URL (compose's `redis`, the chart's Service
name: neither resolves outside the deployment).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
import yaml
from redis.asyncio import Redis

from gateway.config.redis_client import open_redis
from gateway.config.settings import load_settings
from gateway.config.strict import ConfigError
from tests.deploy.chart_render import pod_templates
from tests.deploy.compose_file import REPO, environment_of, interpolate
from tests.deploy.test_redis_password import (
    chart_password,
    gateway_config,
    gateway_password_path,
)
from tests.processes import free_port, terminate, wait_ready

PASSWORD = "compose-generated-redis-password-0123456789"
CONFIGS = {
    "gateway-sim": REPO / "config" / "tiergate.sim.yaml",
    "gateway": REPO / "deploy" / "compose" / "tiergate.gpu.yaml",
}


def _answers(port: int) -> bool:
    """Redis answers a PING with anything (PONG or NOAUTH): it is up."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


@contextmanager
def _redis(argv: list[str], env: dict[str, str], workdir: Path) -> Iterator[int]:
    """The deployment's Redis command, on 127.0.0.1:<free port>, until the block ends."""
    port = free_port()
    local = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", ""]
    log = workdir / "redis.out"
    with log.open("wb") as out:
        proc = subprocess.Popen([*argv, *local], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(
                proc,
                lambda: _answers(port),
                timeout=10.0,
                poll_s=0.02,
                what="redis-server",
                log=lambda: log.read_text(errors="replace"),
            )
            yield port
        finally:
            terminate(proc, timeout=5)


def _shell_append(argv: list[str]) -> list[str]:
    """``sh -c "exec redis-server ..."``: the shell string takes the extra arguments too."""
    assert argv[:2] == ["sh", "-c"], argv
    return ["sh", "-c", argv[2] + ' "$@"', "redis"]


def _stranger_pings(url: str) -> bool:
    """A client with the right address and no password."""

    async def ping() -> bool:
        client: Redis = Redis.from_url(url)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()

    return asyncio.run(ping())


def _gateway_pings(config: Path) -> bool:
    async def ping() -> bool:
        client = open_redis(load_settings(config).redis)
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()

    return asyncio.run(ping())


def _health(command: str, port: int, env: dict[str, str]) -> int:
    local = command.replace("redis-cli", f"redis-cli -p {port}")
    return subprocess.run(["sh", "-c", local], env=env, check=False, timeout=10).returncode


@pytest.mark.parametrize("service", sorted(CONFIGS))
def test_compose_redis_refuses_strangers_and_serves_the_gateway(
    compose: dict[str, Any],
    service: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compose's redis command and health check, the gateway's environment and config file."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "redis_password").write_text(PASSWORD + "\n", encoding="utf-8")

    def here(text: str) -> str:
        return text.replace("/run/secrets/", f"{secrets}/")

    redis_service = compose["services"]["redis"]
    argv = _shell_append([here(part) for part in interpolate(redis_service["command"])])
    check = interpolate(redis_service["healthcheck"]["test"])
    assert check[:3] == ["CMD", "sh", "-c"]
    health = here(check[3])
    with _redis(argv, dict(os.environ), tmp_path) as port:
        local = f"redis://127.0.0.1:{port}/0"
        with pytest.raises(redis.exceptions.AuthenticationError):
            _stranger_pings(local)
        assert _health(health, port, dict(os.environ)) == 0
        (secrets / "redis_password").write_text("a-wrong-password", encoding="utf-8")
        assert _health(health, port, dict(os.environ)) != 0
        (secrets / "redis_password").write_text(PASSWORD + "\n", encoding="utf-8")

        for key, value in environment_of(compose["services"][service]).items():
            if value is not None:
                monkeypatch.setenv(key, here(interpolate(value)))
        config = tmp_path / "tiergate.yaml"
        text = CONFIGS[service].read_text(encoding="utf-8")
        config.write_text(text.replace("redis://redis:6379/0", local), encoding="utf-8")
        if "TIERGATE_REDIS_URL" in environment_of(compose["services"][service]):
            monkeypatch.setenv("TIERGATE_REDIS_URL", local)  # the sim file's ${TIERGATE_REDIS_URL}
        assert _gateway_pings(config)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container's args (``$$`` is a ``$``; a reference
    to a variable not set is left as it is)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def test_chart_redis_refuses_strangers_and_serves_the_gateway(
    default_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The chart's Redis args (with the Secret's value), its probe, and the gateway's config
    with the password file the chart mounts."""
    password = chart_password(default_objects)
    (template,) = [
        t
        for _, t in pod_templates(default_objects)
        if t["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"
    ]
    container = template["spec"]["containers"][0]
    env = dict(os.environ)
    for item in container["env"]:
        assert "valueFrom" in item  # the password never sits in the pod spec as a value
        env[item["name"]] = password
    argv = _shell_append([_expand(arg, env) for arg in container["args"]])
    with _redis(argv, env, tmp_path) as port:
        local = f"redis://127.0.0.1:{port}/0"
        with pytest.raises(redis.exceptions.AuthenticationError):
            _stranger_pings(local)
        probe = container["readinessProbe"]["exec"]["command"]
        assert _health(probe[-1], port, env) == 0
        assert _health(probe[-1], port, {**env, "REDISCLI_AUTH": "wrong"}) != 0

        path, _ = gateway_password_path(default_objects)
        secret_file = tmp_path / "password"
        secret_file.write_text(password, encoding="utf-8")
        config = gateway_config(default_objects)
        assert config["redis"]["password_file"] == path  # the file the Secret is mounted as
        config["redis"] = {**config["redis"], "url": local, "password_file": str(secret_file)}
        config_path = tmp_path / "tiergate.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        assert _gateway_pings(config_path)


def test_a_password_in_both_the_url_and_a_file_is_refused_without_quoting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two passwords would leave one silently unused (redis-py lets the URL's win)."""
    secret = tmp_path / "password"
    secret.write_text(PASSWORD, encoding="utf-8")
    monkeypatch.setenv("TIERGATE_REDIS__URL", "redis://:url-password-sentinel@127.0.0.1:1/0")
    monkeypatch.setenv("TIERGATE_REDIS__PASSWORD_FILE", str(secret))
    with pytest.raises(ConfigError) as refused:
        load_settings(None)
    assert "password_file" in str(refused.value)
    assert "url-password-sentinel" not in str(refused.value)
    assert PASSWORD not in str(refused.value)
