"""A known key never appears in a real gateway's logs, error bodies, headers or metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.integration.gateway_proc import GatewayProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
ADMIN = "secrets-test-admin-token-0123456789"
CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def key_and_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, GatewayProcess]]:
    """A gateway at debug log level with one fast-only, rpm-3 key; yields (key, id, gateway)."""
    path: Path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    record, key = issue_key(
        "secrets", KeyPolicy(allowed_tiers=frozenset({"fast"}), rpm=3), now=time.time()
    )
    FileKeyStore(path).put_sync(record)

    def keyed_and_verbose(config: dict[str, Any], _: Backends) -> None:
        config["auth"] = {"keys_file": str(path), "admin_token": ADMIN}
        config["telemetry"] = {"log_level": "debug", "access_log": True}

    with running_stack(sims=(FAST_SIM,), configure=keyed_and_verbose) as stack:
        yield key, record.key_id, stack.gateway


def exchanges(url: str, key: str, key_id: str) -> list[httpx.Response]:
    """Every path a key can take: success, stream, 401s, 403s, 429, admin, unknown route."""
    wrong = f"tg-{key_id}-" + "Z" * 43
    chat = url + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:

        def post(headers: dict[str, str], body: object = CHAT) -> httpx.Response:
            return client.post(chat, json=body, headers=headers)

        good = {"Authorization": f"Bearer {key}", "x-api-key": key, "Cookie": f"k={key}"}
        responses = [post(good), post(good, {**CHAT, "stream": True})]
        responses += [
            post({"Authorization": header})
            for header in (
                f"Bearer {wrong}",
                f"Basic {key}",
                key,
                f"Bearer {key} trailing",
                f"Bearer {key}x",
            )
        ]
        responses.append(post(good, {**CHAT, "model": "precise"}))
        responses += [post(good) for _ in range(3)]  # past rpm=3: 429s
        responses.append(client.get(url + "/admin/keys", headers=good))
        responses.append(client.get(url + f"/v1/nothing?api_key={key}", headers=good))
        responses.append(client.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}))
    return responses


def test_key_never_leaks(key_and_gateway: tuple[str, str, GatewayProcess]) -> None:
    """Neither the key, its secret, nor a wrong secret shows up anywhere the gateway writes."""
    key, key_id, gateway = key_and_gateway
    responses = exchanges(gateway.url, key, key_id)
    statuses = [r.status_code for r in responses]
    assert statuses[:2] == [200, 200]
    assert statuses[2:7] == [401] * 5
    assert statuses[7] == 403
    assert 429 in statuses[8:11]
    assert statuses[11] == 403
    assert statuses[-1] in (200, 404)  # /metrics (its body is checked below when present)
    time.sleep(0.3)  # the log writer flushes in batches
    secret = key.rsplit("-", 1)[1]
    written = [gateway.log_text()]
    for response in responses:
        written.append(response.text)
        written.append(str(dict(response.headers)))
    everything = "\n".join(written)
    assert key_id in everything  # the id is how operators find a key: it may appear
    for forbidden in (key, secret, "Z" * 43):
        assert forbidden not in everything
