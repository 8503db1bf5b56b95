"""The operator-facing surface under a careless operator or a hostile client, on real processes.

- Admin routes: every one refuses a missing, malformed, Basic, API-key and revoked-key
  credential with an OpenAI-shaped 401/403 (never a 500, never the route's answer).
- Telemetry: client-chosen values (models, headers, paths, fields) add no ``/metrics`` series.
- O1: a backend that quotes the gateway's upstream API key in its error (``Incorrect API key
  provided: …``) had that key relayed to the caller's error body and ``/admin/backends``.
- O2: a replica URL's password was printed by ``tiergate config check`` (the list of replicas
  was not masked) and echoed twice in the error for a replica URL with a bad scheme.
- O3: an admin token under 16 characters passed ``tiergate config check``; ``serve`` then
  failed in every worker with ``ValueError … (rerun with --debug)``, exit 1, several lines.
- O4: ``redis.url`` with a scheme Redis does not speak or a bad port passed ``config check``;
  ``serve`` failed the same way in every worker.
- O5: ``POST /admin/keys`` took a 1 MB tenant (or one with control characters), which every
  access-log line of that key then carries; the dial refuses tenants over 200 characters.
- O6: the admin routes, ``/metrics`` and ``/v1/models`` took the first of two Authorization
  lines, where the edge's rule (inference) joins them so that no credential matches.
- O7: ``/metrics`` told a caller without the admin token ``invalid_api_key``, and an API key
  401, where every other admin route says ``missing_admin_token`` and 403 ``admin_required``.
- O8: an upstream api_key (inline or in api_key_file) that cannot be a header value passed
  ``config check``; ``serve`` failed in every worker with ``ValueError``, exit 1, no tier named.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.adversarial.keys_stack import bearer, redis_key
from tests.adversarial.rawhttp import connect, read_response
from tests.integration.forked_gateway import ForkedGateway
from tests.integration.gateway_proc import REPO_ROOT, GatewayProcess
from tests.processes import free_port, http_answers, run_tiergate, terminate, wait_ready
from tests.redis_server import RedisServer
from tests.stack import Backends, Stack, gateway_in_front, running_backends

pytestmark = pytest.mark.slow

ADMIN = "attack-ops-admin-token-0123456789"
UPSTREAM_KEY = "upstream-SECRET-key-4242abcdef"
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ADMIN_ROUTES = (
    ("GET", "/admin/keys"),
    ("POST", "/admin/keys"),
    ("DELETE", "/admin/keys/abcdefghij"),
    ("POST", "/admin/keys/abcdefghij/rotate"),
    ("GET", "/admin/backends"),
    ("GET", "/admin/queue"),
    ("GET", "/admin/routing"),
    ("POST", "/admin/router/reload"),
    ("PUT", "/admin/router/share"),
    ("GET", "/admin/usage"),
    ("GET", "/metrics"),
)


def _openai_error(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, response.text
    return dict(error)


@pytest.fixture(scope="module")
def sims() -> Iterator[Backends]:
    """The default zero-latency fast and precise simulators, shared by the module's gateways
    (each gateway, and Redis where one has it, is its own; no test sets a fault or reads the
    simulators' counters). The gateways are forked (tests/integration/forked_gateway.py):
    no test here is about a gateway's start; the start-up failures run ``python -m gateway``."""
    with running_backends() as running:
        yield running


@pytest.fixture(scope="module")
def admin_stack(sims: Backends) -> Iterator[tuple[Stack, str, str]]:
    """A Redis-backed gateway with the admin token; yields (stack, a live key, a revoked key)."""

    def configure(config: dict[str, Any], backends: Backends) -> None:
        asyncio.run(redis_key(backends.redis_url))
        config["auth"] = {"store": "redis", "admin_token": ADMIN}
        config["redis"] = {"url": backends.redis_url}
        config["ratelimit"] = {"backend": "redis"}

    with (
        RedisServer() as redis,
        gateway_in_front(
            Backends(sims.sims, redis), configure=configure, gateway_type=ForkedGateway
        ) as stack,
    ):
        url = stack.gateway.url
        live = httpx.post(url + "/admin/keys", json={"tenant": "ops"}, headers=bearer(ADMIN))
        gone = httpx.post(url + "/admin/keys", json={"tenant": "ops"}, headers=bearer(ADMIN))
        revoked = httpx.delete(f"{url}/admin/keys/{gone.json()['id']}", headers=bearer(ADMIN))
        assert revoked.status_code == 200, revoked.text
        yield stack, live.json()["key"], gone.json()["key"]


def test_every_admin_route_refuses_every_non_admin_credential(
    admin_stack: tuple[Stack, str, str],
) -> None:
    """No credential but the admin token opens an admin route: 401/403, OpenAI-shaped."""
    stack, live, revoked = admin_stack
    credentials = {
        "none": {},
        "api key": bearer(live),
        "revoked key": bearer(revoked),
        "basic": {"Authorization": "Basic YWRtaW46YWRtaW4="},
        "bearer only": {"Authorization": "Bearer"},
        "token, other scheme": {"Authorization": f"Token {ADMIN}"},
        "token prefix": {"Authorization": f"Bearer {ADMIN[:-1]}"},
        "token + suffix": {"Authorization": f"Bearer {ADMIN}x"},
        "huge": {"Authorization": "Bearer " + "a" * 8000},
    }
    with httpx.Client(base_url=stack.gateway.url, timeout=10) as client:
        for method, path in ADMIN_ROUTES:
            for name, headers in credentials.items():
                response = client.request(method, path, headers=headers, content=b"{}")
                assert response.status_code in (401, 403), (method, path, name, response.text)
                _openai_error(response)
                assert ADMIN not in response.text


def test_admin_routes_refuse_non_ascii_and_empty_bearer_on_the_wire(
    admin_stack: tuple[Stack, str, str],
) -> None:
    """Raw header bytes no client library sends (Latin-1, an empty token): 401, never 500."""
    stack, _, _ = admin_stack
    for method, path in ADMIN_ROUTES:
        for value in (b"Bearer ", b"Bearer \xe9\xe9", b"Bearer \xff" + ADMIN.encode()):
            sock = connect(stack.gateway.port)
            sock.sendall(
                method.encode() + b" " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\n"
                b"Connection: close\r\nContent-Length: 0\r\nAuthorization: " + value + b"\r\n\r\n"
            )
            answer = read_response(sock)
            sock.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"401", (method, path, value, answer[:300])
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def _raw_status(port: int, method: str, path: str, *auth: bytes) -> int:
    """The status of one request whose head carries an Authorization line per ``auth``."""
    lines = b"".join(b"Authorization: " + value + b"\r\n" for value in auth)
    sock = connect(port)
    sock.sendall(
        method.encode() + b" " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\n"
        b"Connection: close\r\nContent-Length: 0\r\n" + lines + b"\r\n"
    )
    answer = read_response(sock)
    sock.close()
    return int(answer.split(b" ")[1])


def test_a_repeated_authorization_opens_no_admin_route(
    admin_stack: tuple[Stack, str, str],
) -> None:
    """The admin token beside another Authorization line, in either order: 401, as the edge's
    rule for inference (repeated lines are joined, which no credential matches)."""
    stack, live, _ = admin_stack
    port, token, other = stack.gateway.port, b"Bearer " + ADMIN.encode(), b"Bearer junk"
    for method, path in (("GET", "/admin/keys"), ("GET", "/admin/backends"), ("GET", "/metrics")):
        assert _raw_status(port, method, path, token) == 200
        assert _raw_status(port, method, path, token, other) == 401, (method, path)
        assert _raw_status(port, method, path, other, token) == 401, (method, path)
    key = b"Bearer " + live.encode()
    assert _raw_status(port, "GET", "/v1/models", key) == 200
    assert _raw_status(port, "GET", "/v1/models", key, b"Bearer tg-nothing") == 401


def test_metrics_refuses_like_every_admin_route(admin_stack: tuple[Stack, str, str]) -> None:
    """/metrics answers a missing token, a wrong one and an API key with the admin API's codes."""
    stack, live, _ = admin_stack
    with httpx.Client(base_url=stack.gateway.url, timeout=10) as client:
        for headers, status, code in (
            ({}, 401, "missing_admin_token"),
            (bearer("not-the-admin-token-at-all"), 401, "invalid_admin_token"),
            (bearer(live), 403, "admin_required"),
        ):
            keys, metrics = (
                client.get("/admin/keys", headers=headers),
                client.get("/metrics", headers=headers),
            )
            assert (keys.status_code, _openai_error(keys)["code"]) == (status, code)
            assert (metrics.status_code, _openai_error(metrics)["code"]) == (status, code)


def test_admin_routes_answer_503_while_redis_is_down_and_never_show_its_password(
    sims: Backends,
) -> None:
    """Redis (with a password) killed: every admin route that needs it is a 503 OpenAI error,
    the others still answer, and the password is in no body and no log line."""
    password = "REDIS-PW-" + uuid.uuid4().hex[:12]

    def configure(config: dict[str, Any], backends: Backends) -> None:
        assert backends.redis is not None
        with socket.create_connection(("127.0.0.1", backends.redis.port), timeout=5) as sock:
            sock.sendall(f"CONFIG SET requirepass {password}\r\n".encode())
            assert sock.recv(16) == b"+OK\r\n"
        url = f"redis://:{password}@127.0.0.1:{backends.redis.port}/0"
        asyncio.run(redis_key(url))
        config["auth"] = {"store": "redis", "admin_token": ADMIN}
        config["redis"] = {"url": url}
        config["ratelimit"] = {"backend": "redis"}
        config["telemetry"] = {"log_level": "debug"}

    with (
        RedisServer() as redis,
        gateway_in_front(
            Backends(sims.sims, redis), configure=configure, gateway_type=ForkedGateway
        ) as stack,
    ):
        assert stack.redis is not None
        stack.redis.kill()
        calls = (
            ("GET", "/admin/keys", None, 503),
            ("POST", "/admin/keys", {"tenant": "ops"}, 503),
            ("DELETE", "/admin/keys/abcdefghij", None, 503),
            ("POST", "/admin/keys/abcdefghij/rotate", None, 503),
            ("GET", "/admin/usage", None, 503),
            ("PUT", "/admin/router/share", {"share": 0.4}, 503),
            ("GET", "/admin/routing", None, 200),
            ("GET", "/admin/backends", None, 200),
            ("GET", "/metrics", None, 200),
        )
        with httpx.Client(base_url=stack.gateway.url, timeout=15) as client:
            for method, path, body, status in calls:
                answer = client.request(method, path, json=body, headers=bearer(ADMIN))
                assert answer.status_code == status, (method, path, answer.text)
                if status == 503:
                    _openai_error(answer)
                assert password not in answer.text
        assert password not in stack.gateway.log_text()


@pytest.fixture(scope="module")
def metrics_stack(sims: Backends) -> Iterator[tuple[Stack, int]]:
    """A gateway without an admin token whose /metrics is on telemetry.metrics_port; yields
    (the stack, that port)."""
    port = free_port()

    def configure(config: dict[str, Any], _: Backends) -> None:
        config["telemetry"] = {"access_log": False, "metrics_port": port}

    with gateway_in_front(sims, configure=configure, gateway_type=ForkedGateway) as stack:
        yield stack, port


def test_a_metrics_port_takes_metrics_off_the_main_port_and_stays_on_loopback(
    metrics_stack: tuple[Stack, int],
) -> None:
    """telemetry.metrics_port: /metrics answers there, on server.host (127.0.0.1) by default,
    and is a 404 on the main port; without an admin token every /admin route is a 404; `serve`
    without --host listens on 127.0.0.1 only."""
    stack, port = metrics_stack
    url = stack.gateway.url
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
    for path in ("/metrics", *(path for _, path in ADMIN_ROUTES)):
        answer = httpx.get(url + path, timeout=10)
        assert answer.status_code in (404, 405), (path, answer.text)
        _openai_error(answer)
    assert _listening_addresses(port) == ["0100007F"]  # 127.0.0.1 only, no IPv6
    assert _listening_addresses(stack.gateway.port) == ["0100007F"]  # serve's default host


def _listening_addresses(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text(encoding="ascii").splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


# O5 -------------------------------------------------------------------------------------------


def test_a_key_tenant_is_bounded_and_printable(admin_stack: tuple[Stack, str, str]) -> None:
    """A 1 MB tenant, a 100 kB name or a tenant with control characters: 400 naming it."""
    stack, _, _ = admin_stack
    bodies = (
        {"tenant": "t" * 1_000_000},
        {"tenant": "ops", "name": "n" * 100_000},
        {"tenant": "a\nb\x1b[31m"},
    )
    for body in bodies:
        response = httpx.post(
            stack.gateway.url + "/admin/keys", json=body, headers=bearer(ADMIN), timeout=30
        )
        assert response.status_code == 400, response.text[:200]
        assert _openai_error(response)["param"] in ("tenant", "name")


# Telemetry ------------------------------------------------------------------------------------


def _series(metrics_url: str) -> set[str]:
    text = httpx.get(metrics_url, timeout=10).text
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line[:1] not in ("#", "")}


def test_client_chosen_values_add_no_metric_series(metrics_stack: tuple[Stack, int]) -> None:
    """200 rounds of unique models, tier and priority headers, paths and fields: no new series
    once each route has been seen once (labels come from configuration, never the client)."""
    stack, port = metrics_stack
    url, metrics_url = stack.gateway.url, f"http://127.0.0.1:{port}/metrics"
    with httpx.Client(timeout=10) as client:

        def hostile_round(x: str) -> None:
            chat, completions = url + "/v1/chat/completions", url + "/v1/completions"
            client.post(chat, json={**CHAT, "model": x})
            headers = {"x-tiergate-tier": x, "x-request-id": x, "x-tiergate-priority": x}
            client.post(chat, json={**CHAT, "model": "auto"}, headers=headers)
            client.post(url + "/v1/" + x, json={})
            client.get(url + "/v1/models/" + x)
            client.post(completions, json={"model": "fast", "prompt": "hi", x: 1})
            client.post(chat, content=b"{" + x.encode())
            client.request("PROPFIND", url + "/" + x)

        for _ in range(3):
            hostile_round(uuid.uuid4().hex)
        before = _series(metrics_url)
        assert any(name.startswith("tiergate_requests_total{") for name in before)  # counted
        for _ in range(200):
            hostile_round(uuid.uuid4().hex)
        assert _series(metrics_url) - before == set()


# O1 -------------------------------------------------------------------------------------------


# The tier in front of a key-echoing backend that answers this status (200: a stream whose
# in-band error event quotes the key). One gateway serves all three: each test asks its tier.
ECHO_TIERS = {400: "fast", 500: "precise", 200: "inband"}


@pytest.fixture(scope="module")
def key_echo() -> Iterator[GatewayProcess]:
    """A gateway whose every tier's replica quotes the upstream key back in its errors."""
    with contextlib.ExitStack() as stack:
        started = {}
        for status in ECHO_TIERS:
            port = free_port()
            command = [sys.executable, "-m", "tests.adversarial.key_echo_upstream",
                       "--port", str(port), "--status", str(status)]  # fmt: skip
            upstream = subprocess.Popen(command, cwd=REPO_ROOT)
            stack.callback(terminate, upstream)
            started[status] = (upstream, f"http://127.0.0.1:{port}")
        for status, (upstream, url) in started.items():  # all started, then each waited for
            wait_ready(upstream, functools.partial(http_answers, url + "/health"), timeout=10,
                       poll_s=0.05, what=f"key echo ({status})", log=lambda: "")  # fmt: skip
        urls = {status: url for status, (_, url) in started.items()}
        tiers = {
            tier: {"model": f"m-{tier}", "replicas": [urls[status]], "api_key": UPSTREAM_KEY}
            for status, tier in ECHO_TIERS.items()
        }
        config = {"auth": {"enabled": False, "admin_token": ADMIN}, "tiers": tiers}
        yield stack.enter_context(ForkedGateway(config))


@pytest.mark.parametrize("status", [400, 500])
def test_a_backend_quoting_the_upstream_key_never_shows_it(
    key_echo: GatewayProcess, status: int
) -> None:
    """The upstream key a backend writes into its error reaches neither the caller's error body
    nor /admin/backends nor the log."""
    tier = ECHO_TIERS[status]
    answer = httpx.post(
        key_echo.url + "/v1/chat/completions", json={**CHAT, "model": tier}, timeout=10
    )
    assert answer.status_code >= 400
    _openai_error(answer)
    assert UPSTREAM_KEY not in answer.text
    backends = httpx.get(key_echo.url + "/admin/backends", headers=bearer(ADMIN), timeout=10)
    assert backends.status_code == 200
    # the message itself is kept, in this tier's own record
    assert "Incorrect API key provided" in json.dumps(backends.json()["tiers"][tier])
    assert UPSTREAM_KEY not in backends.text
    assert UPSTREAM_KEY not in key_echo.log_text()


def test_an_in_band_error_event_quoting_the_upstream_key_never_shows_it(
    key_echo: GatewayProcess,
) -> None:
    """A 200 stream whose error event quotes the upstream key: the caller's stream ends with
    the backend's error, its message kept and the key blanked."""
    answer = httpx.post(
        key_echo.url + "/v1/chat/completions",
        json={**CHAT, "model": ECHO_TIERS[200], "stream": True},
        timeout=10,
    )
    assert answer.status_code == 200
    assert "Incorrect API key provided: [REDACTED]" in answer.text
    assert UPSTREAM_KEY not in answer.text
    assert "data: [DONE]" not in answer.text
    assert UPSTREAM_KEY not in key_echo.log_text()


# Config: O2, O3, O4 ---------------------------------------------------------------------------


def _config(tmp_path: Path, data: dict[str, Any]) -> str:
    """``data`` as a config file, on a free port unless it names one."""
    path = tmp_path / "tiergate.yaml"
    data = {**data, "server": {"port": _closed_port(), **data.get("server", {})}}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _refused_in_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("tiergate: ")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_config_check_masks_a_replica_password(tmp_path: Path) -> None:
    """`tiergate config check` masks a password in a replica URL, as it does in redis.url."""
    tiers = {
        "fast": {"model": "m", "replicas": ["http://ops:REPLICA-PW-77@10.0.0.5:8000"]},
        "precise": {"model": "p", "replicas": ["http://10.0.0.6:8000"]},
    }
    result = run_tiergate("config", "check", _config(tmp_path, {"tiers": tiers}))
    assert result.returncode == 0, result.stderr
    assert "tiers.fast.replicas" in result.stdout
    assert "REPLICA-PW-77" not in result.stdout + result.stderr


def test_a_bad_replica_url_error_masks_its_password(tmp_path: Path) -> None:
    """A replica URL with a wrong scheme is refused without quoting its password."""
    tiers = {
        "fast": {"model": "m", "replicas": ["htp://ops:REPLICA-PW-77@10.0.0.5:8000"]},
        "precise": {"model": "p", "replicas": ["http://10.0.0.6:8000"]},
    }
    path = _config(tmp_path, {"tiers": tiers, "auth": {"enabled": False}})
    for command in (("config", "check", path), ("serve", "--config", path)):
        line = _refused_in_one_line(run_tiergate(*command), "tiers.fast.replicas")
        assert "REPLICA-PW-77" not in line


def test_a_short_admin_token_is_a_configuration_error(tmp_path: Path) -> None:
    """An admin token under 16 characters: `config check` and `serve` refuse it in one line
    naming auth.admin_token, exit 2, without echoing it."""
    path = _config(tmp_path, {"auth": {"enabled": False, "admin_token": "tiny-tok"}})
    for command in (("config", "check", path), ("serve", "--config", path, "--workers", "2")):
        line = _refused_in_one_line(run_tiergate(*command), "auth.admin_token", "16")
        assert "tiny-tok" not in line


def test_a_short_admin_token_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """The same for a token read from auth.admin_token_file (read once, at start)."""
    token = tmp_path / "admin"
    token.write_text("tiny-tok\n", encoding="utf-8")
    path = _config(tmp_path, {"auth": {"enabled": False, "admin_token_file": str(token)}})
    line = _refused_in_one_line(run_tiergate("serve", "--config", path, "--workers", "2"), "16")
    assert "tiny-tok" not in line


@pytest.mark.parametrize(
    "url", ["http://:REDIS-PW-55@127.0.0.1:6379/0", "redis://:REDIS-PW-55@127.0.0.1:port/0"]
)
def test_a_redis_url_redis_cannot_use_is_a_configuration_error(tmp_path: Path, url: str) -> None:
    """A scheme Redis does not speak or a port that is not a number: one line naming redis.url,
    exit 2, from `config check` and `serve`, without the password."""
    data = {
        "auth": {"enabled": False},
        "redis": {"url": url},
        "ratelimit": {"backend": "redis"},
    }
    path = _config(tmp_path, data)
    for command in (("config", "check", path), ("serve", "--config", path, "--workers", "2")):
        line = _refused_in_one_line(run_tiergate(*command), "redis.url")
        assert "REDIS-PW-55" not in line


def test_keys_cli_refuses_a_bad_redis_url_without_quoting_it() -> None:
    """`tiergate keys list --redis-url` with a scheme Redis does not speak: one line, exit 2,
    the password not repeated."""
    result = run_tiergate("keys", "list", "--redis-url", "http://:REDIS-PW-55@127.0.0.1:6379/0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("tiergate keys: --redis-url: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "REDIS-PW-55" not in result.stderr + result.stdout


def test_keys_cli_refuses_an_unprintable_tenant(tmp_path: Path) -> None:
    """`tiergate keys create --tenant` with a newline and an escape: exit 2, nothing written."""
    keys = tmp_path / "keys.yaml"
    result = run_tiergate("keys", "create", "--keys-file", str(keys), "--tenant", "a\nb\x1b[31m")
    assert result.returncode == 2, result.stderr
    assert "tenant" in result.stderr
    assert not keys.exists() or "a\\nb" not in keys.read_text(encoding="utf-8")


def test_an_upstream_key_that_cannot_be_sent_is_a_configuration_error(tmp_path: Path) -> None:
    """An upstream key with a space, inline or in api_key_file: one line naming the tier's
    setting, exit 2, the key not echoed (`config check` for the inline one, `serve` for both)."""
    tiers = {
        "fast": {"model": "m", "replicas": ["http://127.0.0.1:9"], "api_key": "UP KEY-1"},
        "precise": {"model": "p", "replicas": ["http://127.0.0.1:9"]},
    }
    path = _config(tmp_path, {"auth": {"enabled": False}, "tiers": tiers})
    for command in (("config", "check", path), ("serve", "--config", path, "--workers", "2")):
        line = _refused_in_one_line(run_tiergate(*command), "tiers.fast.api_key")
        assert "UP KEY-1" not in line
    key_file = tmp_path / "upstream-keys"
    key_file.write_text("good-key\nUP KEY-2\n", encoding="utf-8")
    del tiers["fast"]["api_key"]
    tiers["fast"]["api_key_file"] = str(key_file)
    path = _config(tmp_path, {"auth": {"enabled": False}, "tiers": tiers})
    line = _refused_in_one_line(
        run_tiergate("serve", "--config", path, "--workers", "2"), "tiers.fast.api_key_file"
    )
    assert "UP KEY-2" not in line
    assert "good-key" not in line
