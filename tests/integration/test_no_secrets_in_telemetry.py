"""A known API key and the prompt text never reach spans, logs or metrics (capture off).

One real ``tiergate serve`` process with API keys from a file, tracing at 100 % exported to
its stdout (``OTEL_TRACES_EXPORTER=console``), the access log in a file, and ``/metrics``
scraped with the admin token. Every request carries the key and a unique prompt marker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gateway_proc import REPO_ROOT
from tests.stack import Backends, running_stack

pytestmark = pytest.mark.slow

ADMIN = "admin-token-for-the-secrets-test"
MARKER = "ZEBRA-CANARY-7731 my secret prompt"
WRONG_KEY = "tg-doesnotexist-QmFkS2V5VGhhdE11c3ROb3RMZWFrMTIz"
# Shaped like a generated admin token (secrets.token_urlsafe(32)), sent as model / request id.
TOKEN_SHAPED = "Zq3vN8kTt2LwX9bRcY4mHd7pQs1uJf6aEg5oKi0nWlV"


def _create_key(keys_file: Path) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "keys",
            "create",
            "--keys-file",
            str(keys_file),
            "--tenant",
            "acme",
            "--name",
            "secrets-test",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip().splitlines()[-1]


def _traffic(url: str, key: str) -> list[str]:
    """Send streaming, non-streaming, completions and a bad-key request; return answers."""
    auth = {"Authorization": f"Bearer {key}"}
    chat = {"model": "fast", "messages": [{"role": "user", "content": MARKER}], "max_tokens": 8}
    answers: list[str] = []
    with httpx.Client(base_url=url, timeout=10) as client:
        done = client.post("/v1/chat/completions", json=chat, headers=auth)
        assert done.status_code == 200
        answers.append(done.json()["choices"][0]["message"]["content"])
        with client.stream(
            "POST", "/v1/chat/completions", json={**chat, "stream": True}, headers=auth
        ) as resp:
            assert resp.status_code == 200
            resp.read()
        text = {"model": "precise", "prompt": MARKER, "max_tokens": 8}
        assert client.post("/v1/completions", json=text, headers=auth).status_code == 200
        bad = client.post(
            "/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {WRONG_KEY}"}
        )
        assert bad.status_code == 401
        for model in (ADMIN, TOKEN_SHAPED):  # a credential pasted as the model is not logged
            wrong = client.post("/v1/chat/completions", json={**chat, "model": model}, headers=auth)
            assert wrong.status_code == 404
        echoed = client.post(
            "/v1/chat/completions", json=chat, headers={**auth, "x-request-id": TOKEN_SHAPED}
        )
        assert echoed.status_code == 200
        assert echoed.headers["x-request-id"] != TOKEN_SHAPED
    return answers


def test_key_and_prompt_never_appear_in_spans_logs_or_metrics(tmp_path: Path) -> None:
    """Telemetry is produced (spans, access lines, metrics) but none holds a secret."""
    keys_file = tmp_path / "keys.yaml"
    key = _create_key(keys_file)
    log_file = tmp_path / "access.log"

    def telemetry_on(config: dict[str, Any], _: Backends) -> None:
        config["auth"] = {
            "enabled": True,
            "store": "file",
            "keys_file": str(keys_file),
            "admin_token": ADMIN,
        }
        config["telemetry"] = {
            "tracing": True,
            "trace_sample_ratio": 1.0,
            "log_format": "json",
            "log_file": str(log_file),
            "capture_content": False,
        }

    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with running_stack(configure=telemetry_on, env=env) as stack:
        gateway = stack.gateway
        answers = _traffic(gateway.url, key)
        metrics = httpx.get(
            gateway.url + "/metrics", timeout=10, headers={"Authorization": f"Bearer {ADMIN}"}
        ).text
        gateway.stop()  # flushes the span queue and the log file
        spans = gateway.log_text()
    logs = log_file.read_text(encoding="utf-8")
    key_id = key.split("-")[1]
    assert '"chat tiergate-fast"' in spans  # the exporter really wrote the client spans
    assert '"gen_ai.usage.output_tokens"' in spans
    assert logs.count('"request.finished"') == 7
    assert f'"key_id":"{key_id}"' in logs  # the key id is logged; the key never is
    assert "tiergate_requests_total" in metrics
    secrets = [
        key,
        key.rsplit("-", 1)[1],
        WRONG_KEY,
        WRONG_KEY.rsplit("-", 1)[1],
        ADMIN,
        TOKEN_SHAPED,
        "ZEBRA-CANARY",
        "Bearer",
        *[a for a in answers if len(a) > 12],
    ]
    for where, text in (("spans", spans), ("logs", logs), ("metrics", metrics)):
        for secret in secrets:
            assert secret not in text, f"{secret!r} leaked into {where}"
    assert key_id not in metrics  # no key ids as metric labels
