"""Refused credentials on every route leave a trace: a counter by route class and reason, and a
rate-limited ``auth.refused`` warning, never the credential (real ``tiergate serve``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.processes import free_port, patience

ADMIN = "refusals-admin-token-0123456789abcdef"
WRONG_ADMIN = "wrong-admin-guess-XYZW0123456789abcdef"
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str]]:
    """A gateway with a key file (one key) and an admin token; backends need not answer."""
    path: Path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    record, key = issue_key("refusals", KeyPolicy(), now=time.time())
    FileKeyStore(path).put_sync(record)
    dead = [f"http://127.0.0.1:{free_port()}"]
    config = {
        "auth": {"keys_file": str(path), "admin_token": ADMIN},
        "tiers": tiers_config(dead, dead),
        "telemetry": {"log_format": "json"},
    }
    with GatewayProcess(config) as gw:
        yield gw, key


def _lines(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    parsed = (json.loads(line) for line in gw.log_text().splitlines() if line[:1] == "{")
    return [line for line in parsed if line.get("event") == event]


def _refusals(metrics: str) -> dict[tuple[str, str], float]:
    found = re.findall(
        r'^tiergate_auth_refusals_total\{reason="(\w+)",route="(\w+)"\} ([0-9.e+]+)$',
        metrics,
        flags=re.MULTILINE,
    )
    return {(route, reason): float(value) for reason, route, value in found}


def test_refusals_are_counted_by_route_class_and_reason(
    gateway: tuple[GatewayProcess, str],
) -> None:
    """401/403 on /admin, /metrics, /v1/models and inference each count once, by reason."""
    gw, key = gateway
    wrong_key = key[:-6] + "AAAAAA"
    bad = {"Authorization": f"Bearer {WRONG_ADMIN}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        before = _refusals(client.get("/metrics", headers=admin).text)
        for _ in range(3):
            assert client.get("/admin/keys", headers=bad).status_code == 401
        api_key = {"Authorization": f"Bearer {key}"}
        assert client.get("/admin/backends", headers=api_key).status_code == 403
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bad).status_code == 401
        wrong = {"Authorization": f"Bearer {wrong_key}"}
        assert client.get("/v1/models", headers=wrong).status_code == 401
        assert client.post("/v1/chat/completions", json=CHAT, headers=wrong).status_code == 401
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 401
        assert client.get("/v1/models", headers=api_key).status_code == 200  # not a refusal
        after = _refusals(client.get("/metrics", headers=admin).text)
    grown = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    assert grown == {
        ("admin", "invalid"): 3,
        ("admin", "api_key_on_admin"): 1,
        ("metrics", "missing"): 1,
        ("metrics", "invalid"): 1,
        ("models", "invalid"): 1,
        ("inference", "invalid"): 1,
        ("inference", "missing"): 1,
    }


def test_a_burst_of_bad_admin_tokens_logs_few_lines_and_never_the_token(
    gateway: tuple[GatewayProcess, str],
) -> None:
    """50 wrong admin tokens: at most one auth.refused line per 10 s for the admin class, with
    the client address and a count; neither the guessed token nor the real one is written."""
    gw, _ = gateway
    bad = {"Authorization": f"Bearer {WRONG_ADMIN}"}
    started = time.monotonic()
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(50):
            assert client.delete("/admin/keys/abc", headers=bad).status_code == 401
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + patience(5)
    while not (admin := [x for x in _lines(gw, "auth.refused") if x["route"] == "admin"]):
        assert time.monotonic() < deadline, gw.log_text()[-3000:]
        time.sleep(0.05)
    time.sleep(0.2)  # the log writer flushes in batches
    admin = [x for x in _lines(gw, "auth.refused") if x["route"] == "admin"]
    assert 1 <= len(admin) <= 1 + int(elapsed // 10) + 1  # this test's and the one before's
    line = admin[0]
    assert line["level"] == "warning"
    assert line["client"] == "127.0.0.1"
    assert line["reason"] in {"invalid", "api_key_on_admin"}
    assert line["count"] >= 1
    assert line["interval_s"] == 10.0
    text = gw.log_text()
    for secret in (WRONG_ADMIN, WRONG_ADMIN[:12], ADMIN, ADMIN[:12]):
        assert secret not in text
