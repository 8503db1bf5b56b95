"""The OpenAI model surface through a real gateway: retrieve, per-key lists, param names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.keys import issue_key
from policies.principal import KeyPolicy
from tests.adversarial.rawhttp import closed_within, connect, status_of
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.stack import FAST_SIM, PRECISE_SIM, Backends, running_stack


@pytest.fixture(scope="module")
def keys_and_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, GatewayProcess]]:
    """A gateway with an all-tiers key and a fast-only key; yields (all, fast_only, gateway)."""
    path: Path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    store = FileKeyStore(path)
    every, every_key = issue_key("every", KeyPolicy(), now=time.time())
    fast, fast_key = issue_key(
        "fast-only", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=time.time()
    )
    store.put_sync(every)
    store.put_sync(fast)

    def keyed(config: dict[str, Any], backends: Backends) -> None:
        config["auth"] = {"keys_file": str(path)}
        config["tiers"] = tiers_config(
            [backends.fast.url], [backends.precise.url], max_tokens_cap=100
        )

    fast_sim = (*FAST_SIM, "--max-model-len", "2048")
    with running_stack(sims=(fast_sim, PRECISE_SIM), configure=keyed) as stack:
        yield every_key, fast_key, stack.gateway


def _client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def test_models_retrieve_with_openai_client(
    keys_and_gateway: tuple[str, str, GatewayProcess],
) -> None:
    """client.models.retrieve works for auto, a tier and a served model name."""
    every, _, gateway = keys_and_gateway
    client = _client(gateway, every)
    for name in ("auto", "fast", "precise", "tiergate-precise"):
        model = client.models.retrieve(name)
        assert model.id == name
        assert model.object == "model"
        assert model.owned_by == "tiergate"


def test_models_retrieve_unknown_is_openai_404(
    keys_and_gateway: tuple[str, str, GatewayProcess],
) -> None:
    """An unknown model id is a 404 model_not_found in OpenAI's error shape."""
    every, _, gateway = keys_and_gateway
    with pytest.raises(openai.NotFoundError) as err:
        _client(gateway, every).models.retrieve("gpt-17")
    body = err.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found"
    assert body["param"] == "model"


def test_models_list_and_retrieve_filtered_by_key(
    keys_and_gateway: tuple[str, str, GatewayProcess],
) -> None:
    """A fast-only key sees only what it may use, and cannot retrieve the precise tier."""
    every, fast_only, gateway = keys_and_gateway
    all_ids = {m.id for m in _client(gateway, every).models.list()}
    assert all_ids == {"auto", "fast", "precise", "tiergate-fast", "tiergate-precise"}
    client = _client(gateway, fast_only)
    assert {m.id for m in client.models.list()} == {"auto", "fast", "tiergate-fast"}
    for name in ("precise", "tiergate-precise"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(name)


def test_models_need_a_key(keys_and_gateway: tuple[str, str, GatewayProcess]) -> None:
    """Listing or retrieving models without a valid key is 401."""
    _, _, gateway = keys_and_gateway
    client = _client(gateway, "tg-not-a-key")
    with pytest.raises(openai.AuthenticationError):
        client.models.retrieve("fast")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


@pytest.mark.parametrize("param", ["max_completion_tokens", "max_tokens"])
def test_over_cap_names_the_param_as_sent(
    keys_and_gateway: tuple[str, str, GatewayProcess], param: str
) -> None:
    """An over-cap completion limit is reported under the name the caller used."""
    every, _, gateway = keys_and_gateway
    with pytest.raises(openai.BadRequestError) as err:
        _client(gateway, every).chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={param: 5000},
        )
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == param
    assert body["code"] == "max_tokens_exceeded"
    assert param in body["message"]


def _raw_chat(gateway: GatewayProcess, auth_lines: bytes) -> int:
    body = b'{"model": "fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    with connect(gateway.port) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
            + auth_lines
            + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        _, data = closed_within(sock, 10)
    return status_of(data)


def test_two_authorization_headers_authenticate_as_neither(
    keys_and_gateway: tuple[str, str, GatewayProcess],
) -> None:
    """Two keys in two Authorization lines, in either order: 401 (the first used to win, so
    a proxy checking the other line and the gateway disagreed on who was calling)."""
    every, fast, gateway = keys_and_gateway
    one = b"Authorization: Bearer %s\r\n" % every.encode()
    other = b"Authorization: Bearer %s\r\n" % fast.encode()
    bogus = b"Authorization: Bearer tg-nothing\r\n"
    assert _raw_chat(gateway, one) == 200
    assert _raw_chat(gateway, one + other) == 401
    assert _raw_chat(gateway, other + one) == 401
    assert _raw_chat(gateway, one + bogus) == 401
    assert _raw_chat(gateway, bogus + one) == 401
