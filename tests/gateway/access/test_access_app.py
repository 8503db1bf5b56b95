"""Keys, limits and the admin API through the whole app, against a real simulator upstream."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypedDict, Unpack

import httpx
import pytest
import structlog.testing
from litestar import Litestar
from litestar.testing import AsyncTestClient

from gateway.access.auth import NoKeysConfigured
from gateway.access.keystore_file import FileKeyStore
from gateway.composition import create_app
from gateway.config.settings import AuthSettings, Settings
from gateway.config.tier_settings import TierSettings
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.key_fields import KeyPolicyFields
from tests.simulator.procs import SimulatorProcess

ADMIN = "admin-token-for-tests-0123456789"
ACCESS_DOC = (Path(__file__).resolve().parents[3] / "docs/access.md").read_text(encoding="utf-8")
UNUSED = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    """A zero-latency fast-tier simulator."""
    with SimulatorProcess(
        "--profile", "fast", "--model", "tiergate-fast", "--latency-scale", "0"
    ) as process:
        yield process


class AuthOptions(TypedDict, total=False):
    """The auth settings a test varies."""

    admin_token: str | None
    enabled: bool


def settings_for(sim_url: str, keys_file: Path | None, **auth: Unpack[AuthOptions]) -> Settings:
    """Settings with the fast tier on ``sim_url`` and keys from ``keys_file``."""
    return Settings(
        tiers={
            "fast": TierSettings(model="tiergate-fast", replicas=[sim_url], default_max_tokens=16),
            "precise": TierSettings(
                model="tiergate-precise", replicas=[UNUSED], default_max_tokens=16
            ),
        },
        auth=AuthSettings(keys_file=keys_file, cache_ttl_s=0, keys_reload_interval_s=0, **auth),
    )


class Keys:
    """A key file the test adds keys to."""

    def __init__(self, path: Path) -> None:
        self.store = FileKeyStore(path)
        self.path = path

    def add(self, **policy: Unpack[KeyPolicyFields]) -> str:
        """Store a new key with ``policy`` fields; returns the key."""
        record, token = issue_key("team", KeyPolicy(**policy), now=time.time())
        self.store.put_sync(record)
        return token


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    """An empty key file."""
    return Keys(tmp_path / "keys.yaml")


@pytest.fixture
async def client(sim: SimulatorProcess, keys: Keys) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """The app with file keys and an admin token (one bootstrap key so it may start)."""
    keys.add()
    app = create_app(settings_for(sim.url, keys.path, admin_token=ADMIN))
    async with AsyncTestClient(app=app) as test_client:
        yield test_client


def chat(max_tokens: int = 8, model: str = "fast", **extra: Any) -> dict[str, Any]:
    """A small chat request body."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        **extra,
    }


def bearer(token: str) -> dict[str, str]:
    """An Authorization header."""
    return {"Authorization": f"Bearer {token}"}


async def test_missing_key_is_openai_shaped_401(client: AsyncTestClient[Litestar]) -> None:
    """No Authorization header: 401 with the OpenAI error envelope."""
    response = await client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "missing_api_key"


async def test_forbidden_tier_is_403(client: AsyncTestClient[Litestar], keys: Keys) -> None:
    """A fast-only key asking for the precise tier gets 403."""
    token = keys.add(allowed_tiers=frozenset({"fast"}))
    response = await client.post(
        "/v1/chat/completions", json=chat(model="precise"), headers=bearer(token)
    )
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"


async def test_key_max_tokens_cap_is_enforced(
    client: AsyncTestClient[Litestar], keys: Keys
) -> None:
    """A request above the key's max_tokens cap is refused before any limit is spent."""
    token = keys.add(max_tokens=10)
    response = await client.post(
        "/v1/chat/completions", json=chat(max_tokens=11), headers=bearer(token)
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


async def test_rpm_limit_headers_and_429(client: AsyncTestClient[Litestar], keys: Keys) -> None:
    """Two per minute: headers count down, the third is a 429 with Retry-After."""
    token = keys.add(rpm=2)
    first = await client.post("/v1/chat/completions", json=chat(), headers=bearer(token))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    second = await client.post("/v1/chat/completions", json=chat(), headers=bearer(token))
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    third = await client.post("/v1/chat/completions", json=chat(), headers=bearer(token))
    assert third.status_code == 429
    assert int(third.headers["retry-after"]) >= 29
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    assert third.json()["error"]["code"] == "rate_limit_exceeded"


async def test_streaming_response_carries_limit_headers(
    client: AsyncTestClient[Litestar], keys: Keys
) -> None:
    """A streamed answer has the x-ratelimit headers too."""
    token = keys.add(rpm=10, tpm=10_000)
    async with client.stream(
        "POST", "/v1/chat/completions", json=chat(stream=True), headers=bearer(token)
    ) as response:
        body = b"".join([chunk async for chunk in response.aiter_bytes()])
    assert response.status_code == 200
    assert b"[DONE]" in body
    assert response.headers["x-ratelimit-remaining-requests"] == "9"
    assert response.headers["x-ratelimit-limit-tokens"] == "10000"


@pytest.mark.parametrize("stream", [False, True])
async def test_tokens_reconciled_with_real_usage(
    client: AsyncTestClient[Litestar], keys: Keys, stream: bool
) -> None:
    """After an answer, the token budget reflects its real usage, not the reservation."""
    token = keys.add(tpm=600)  # refills 10 tokens/s: slow enough to compare exactly
    body = chat(
        max_tokens=200,
        stream=stream,
        ignore_eos=True,
        stream_options={"include_usage": True} if stream else None,
    )
    if not stream:
        body.pop("stream_options")
    response = await client.post("/v1/chat/completions", json=body, headers=bearer(token))
    assert response.status_code == 200
    reserved_left = int(response.headers["x-ratelimit-remaining-tokens"])
    used = _usage(response, stream)
    await asyncio.sleep(0.2)  # the stream's settle runs after its last byte
    probe = await client.post(
        "/v1/chat/completions", json=chat(max_tokens=1), headers=bearer(token)
    )
    after = int(probe.headers["x-ratelimit-remaining-tokens"])
    probe_cost = 600 - reserved_left - 200 + 1  # prompt estimate + max_tokens=1
    assert reserved_left < 400
    assert 600 - used - probe_cost <= after <= 600 - used - probe_cost + 10


def _usage(response: httpx.Response, stream: bool) -> int:
    if not stream:
        return int(response.json()["usage"]["total_tokens"])
    import json  # only the streaming variant parses events

    for line in response.text.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["total_tokens"])
    raise AssertionError("no usage in the stream")


async def test_admin_api_lifecycle(client: AsyncTestClient[Litestar]) -> None:
    """Create, use, list, rotate and revoke a key over /admin/keys."""
    admin = bearer(ADMIN)
    created = await client.post(
        "/admin/keys",
        json={"tenant": "ops", "tiers": ["fast"], "rpm": 100, "scopes": ["downgrade"]},
        headers=admin,
    )
    assert created.status_code == 201
    key, key_id = created.json()["key"], created.json()["id"]
    assert (await client.get("/v1/models", headers=bearer(key))).status_code == 200
    listing = (await client.get("/admin/keys", headers=admin)).json()["data"]
    assert any(item["id"] == key_id for item in listing)
    assert key not in str(listing)
    assert "digest" not in str(listing)
    rotated = await client.post(f"/admin/keys/{key_id}/rotate", headers=admin)
    new_key = rotated.json()["key"]
    assert (await client.get("/v1/models", headers=bearer(key))).status_code == 401
    assert (await client.get("/v1/models", headers=bearer(new_key))).status_code == 200
    revoked = await client.delete(f"/admin/keys/{key_id}", headers=admin)
    assert revoked.json()["status"] == "revoked"
    assert (await client.get("/v1/models", headers=bearer(new_key))).status_code == 401
    missing = await client.delete("/admin/keys/nosuchkey", headers=admin)
    assert missing.status_code == 404


async def test_key_changes_through_the_api_are_audit_events(
    client: AsyncTestClient[Litestar],
) -> None:
    """Create, rotate and revoke each log one ``keys.changed`` audit event with the key's id
    and tenant, and never its secret (as a dial change logs ``router.dial_changed``)."""
    admin = bearer(ADMIN)
    with structlog.testing.capture_logs() as logs:
        created = await client.post("/admin/keys", json={"tenant": "ops"}, headers=admin)
        key_id = created.json()["id"]
        rotated = await client.post(f"/admin/keys/{key_id}/rotate", headers=admin)
        await client.delete(f"/admin/keys/{key_id}", headers=admin)
        await client.delete("/admin/keys/nosuchkey", headers=admin)  # a 404 changes nothing
    events = [e for e in logs if e["event"] == "keys.changed"]
    assert [(e["action"], e["key_id"], e["tenant"], e["audit"]) for e in events] == [
        ("create", key_id, "ops", True),
        ("rotate", key_id, "ops", True),
        ("revoke", key_id, "ops", True),
    ]
    for secret in (created.json()["key"], rotated.json()["key"]):
        assert secret not in str(logs)


async def test_admin_key_routes_answer_as_the_docs_table_says(
    client: AsyncTestClient[Litestar],
) -> None:
    """docs/access.md's key admin table: every route listed exists, with the documented codes."""
    for route in (
        "GET /admin/keys",
        "POST /admin/keys",
        "DELETE /admin/keys/{id}",
        "POST /admin/keys/{id}/rotate",
    ):
        assert f"| `{route}` |" in ACCESS_DOC
    admin = bearer(ADMIN)
    created = await client.post("/admin/keys", json={"tenant": "ops"}, headers=admin)
    assert created.status_code == 201
    key_id = created.json()["id"]
    assert (await client.delete(f"/admin/keys/{key_id}", headers=admin)).status_code == 200
    again = await client.post(f"/admin/keys/{key_id}/rotate", headers=admin)
    assert (again.status_code, again.json()["error"]["code"]) == (400, "key_revoked")
    for missing in (
        await client.delete("/admin/keys/nosuchkey", headers=admin),
        await client.post("/admin/keys/nosuchkey/rotate", headers=admin),
    ):
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "key_not_found")


async def test_admin_api_refuses_other_credentials(
    client: AsyncTestClient[Litestar], keys: Keys
) -> None:
    """An API key gets 403 on the admin API, a wrong or missing token 401, a bad body 400."""
    token = keys.add()
    assert (await client.get("/admin/keys", headers=bearer(token))).status_code == 403
    assert (await client.get("/admin/keys", headers=bearer("x" * 32))).status_code == 401
    missing = await client.get("/admin/keys")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_admin_token"
    assert "admin token" in missing.json()["error"]["message"]
    assert "API key" not in missing.json()["error"]["message"]
    bad = await client.post(
        "/admin/keys", json={"tenant": "t", "tiers": ["gpu"]}, headers=bearer(ADMIN)
    )
    assert bad.status_code == 400


@pytest.mark.parametrize("days", [1e308, 3651, 0, -5, "1e400"])
async def test_admin_api_bounds_expiry(client: AsyncTestClient[Litestar], days: object) -> None:
    """expires_in_days above ten years, non-positive or out of range: OpenAI-shaped 400."""
    raw = b'{"tenant": "t", "expires_in_days": ' + str(days).encode() + b"}"
    response = await client.post(
        "/admin/keys", content=raw, headers={**bearer(ADMIN), "content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert "expires_in_days" in error["message"]
    listing = (await client.get("/admin/keys", headers=bearer(ADMIN))).json()["data"]
    assert all(item["tenant"] != "t" or item["status"] != "active" for item in listing)


async def test_admin_api_absent_without_token(sim: SimulatorProcess, keys: Keys) -> None:
    """With no admin token configured, /admin/keys does not exist."""
    keys.add()
    async with AsyncTestClient(app=create_app(settings_for(sim.url, keys.path))) as test_client:
        response = await test_client.get("/admin/keys", headers=bearer(ADMIN))
    assert response.status_code == 404


def test_app_refuses_to_start_without_keys(tmp_path: Path) -> None:
    """Auth on and an empty (or missing) key file: create_app refuses."""
    with pytest.raises(NoKeysConfigured, match=r"auth\.enabled: false"):
        create_app(settings_for(UNUSED, tmp_path / "none.yaml"))
    with pytest.raises(NoKeysConfigured):
        create_app(settings_for(UNUSED, None))


async def test_auth_disabled_is_the_explicit_development_switch(sim: SimulatorProcess) -> None:
    """auth.enabled: false starts without keys and serves without a header."""
    settings = settings_for(sim.url, None, enabled=False)
    async with AsyncTestClient(app=create_app(settings)) as test_client:
        response = await test_client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200


def test_serve_exits_non_zero_without_keys(tmp_path: Path) -> None:
    """`tiergate serve` with auth on and no keys exits 2 with a clear message."""
    config = tmp_path / "tiergate.yaml"
    config.write_text(f"auth:\n  keys_file: {tmp_path / 'keys.yaml'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "refusing to start" in result.stderr
    assert "tiergate keys create" in result.stderr


async def test_two_authorization_headers_authenticate_as_neither(
    client: AsyncTestClient[Litestar], keys: Keys
) -> None:
    """The framework path joins a repeated Authorization as the native path does: 401."""
    good = keys.add()
    ok = await client.post("/v1/chat/completions", json=chat(), headers=bearer(good))
    assert ok.status_code == 200
    for lines in (
        [("Authorization", f"Bearer {good}"), ("Authorization", "Bearer tg-nothing")],
        [("Authorization", "Bearer tg-nothing"), ("Authorization", f"Bearer {good}")],
    ):
        response = await client.post("/v1/chat/completions", json=chat(), headers=lines)
        assert response.status_code == 401, lines
