"""P7 and P8: engine control fields, remote media and deep JSON from a restricted key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.access.keystore_file import FileKeyStore
from policies.fields import ENGINE_CONTROL_FIELDS
from policies.keys import issue_key
from policies.principal import SCOPE_ENGINE_FIELDS, KeyPolicy
from tests.integration.gateway_proc import GatewayProcess
from tests.simulator.procs import SimulatorProcess
from tests.stack import FAST_SIM, Backends, running_stack

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "hi"}]
# The issue's list, each with a value a hostile caller would send.
HOSTILE = {
    "priority": -100,
    "chat_template": "{{ ''.__class__.__mro__ }}",
    # (a thinking switch alone is allowed for every key; anything beside it is not)
    "chat_template_kwargs": {"enable_thinking": True, "documents": [{"text": "ignore all"}]},
    "kv_transfer_params": {"remote_host": "10.0.0.9", "remote_port": 7000},
    "logits_processors": ["evil.module:Processor"],
    "vllm_xargs": {"x": 1},
    "request_id": "someone-elses-id",
    "prompt_logprobs": 20,
}
FORBIDDEN_MEDIA = [
    "http://169.254.169.254/latest/meta-data/iam/",
    "http://127.0.0.1:8101/metrics",
    "http://localhost/x.png",
    "http://[::1]/x.png",
    "http://[::ffff:127.0.0.1]/x.png",
    "http://10.1.2.3/x.png",
    "http://192.168.0.10/x.png",
    "http://100.100.100.200/latest/meta-data",
    "http://2130706433/x.png",  # 127.0.0.1 as one decimal number
    "http://0x7f000001/x.png",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
]


class Stack:
    """A gateway with a plain key and an engine_fields key; fast allows remote media."""

    def __init__(self, gateway: GatewayProcess, sim: SimulatorProcess, plain: str, engine: str):
        self.gateway, self.sim, self.plain, self.engine = gateway, sim, plain, engine

    def post(self, body: dict[str, Any], key: str | None = None) -> httpx.Response:
        """POST a chat body with ``key`` (the plain key by default)."""
        headers = {"Authorization": f"Bearer {key or self.plain}"}
        return httpx.post(
            self.gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=10
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Real simulator and gateway processes with two keys in a key file."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    store = FileKeyStore(path)
    plain_record, plain = issue_key(
        "t", KeyPolicy(allowed_tiers=frozenset({"fast"})), now=time.time()
    )
    engine_record, engine = issue_key(
        "t", KeyPolicy(scopes=frozenset({SCOPE_ENGINE_FIELDS})), now=time.time()
    )
    store.put_sync(plain_record)
    store.put_sync(engine_record)

    def two_keys(config: dict[str, Any], _backends: Backends) -> None:
        del config["telemetry"]  # the access log on, the default
        config["auth"] = {"keys_file": str(path)}
        config["tiers"]["fast"]["allow_remote_media"] = True

    with running_stack(sims=[FAST_SIM], configure=two_keys) as running:
        yield Stack(running.gateway, running.fast, plain, engine)


def chat(**fields: Any) -> dict[str, Any]:
    """A small fast-tier chat body with ``fields``."""
    return {"model": "fast", "messages": CHAT, "max_tokens": 4, **fields}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_engine_control_fields_are_refused_for_a_key_without_the_scope(
    stack: Stack, name: str
) -> None:
    """Each engine control field from a plain key: 400 naming the field, nothing forwarded."""
    before = stack.sim.stats()["requests_total"]
    resp = stack.post(chat(**{name: HOSTILE[name]}))
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == name
    assert error["code"] == "field_not_allowed"
    assert stack.sim.stats()["requests_total"] == before


def test_engine_fields_reach_the_backend_with_the_scope(stack: Stack) -> None:
    """A key with the engine_fields scope may send them; they arrive untouched."""
    resp = stack.post(
        chat(priority=5, chat_template_kwargs={"enable_thinking": False}), stack.engine
    )
    assert resp.status_code == 200
    seen = stack.sim.stats()["last_request"]
    assert seen["priority"] == 5
    assert seen["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_issue_list_is_in_the_control_set() -> None:
    """Every field the attack used is classified as an engine control field."""
    assert set(HOSTILE) <= ENGINE_CONTROL_FIELDS


def test_unknown_fields_are_refused_like_openai(stack: Stack) -> None:
    """A field nobody documents (a typo) is a 400 naming it, not silently forwarded."""
    resp = stack.post(chat(max_token=5))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "max_token"


def image(url: str) -> list[dict[str, Any]]:
    """A user message with one image part."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


@pytest.mark.parametrize("url", FORBIDDEN_MEDIA)
def test_media_urls_to_internal_addresses_are_refused(stack: Stack, url: str) -> None:
    """Metadata, loopback, private and odd-scheme media URLs never reach the backend."""
    before = stack.sim.stats()["requests_total"]
    resp = stack.post(chat(messages=image(url)))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "messages[0].content[1]"
    assert stack.sim.stats()["requests_total"] == before


def test_inline_media_and_public_addresses_pass(stack: Stack) -> None:
    """data: URLs always pass; a public address passes where the tier allows remote media."""
    inline = "data:image/png;base64,iVBORw0KGgo="
    assert stack.post(chat(messages=image(inline))).status_code == 200
    assert stack.post(chat(messages=image("http://93.184.215.14/cat.png"))).status_code == 200


def test_remote_media_is_refused_where_the_tier_does_not_allow_it(stack: Stack) -> None:
    """The precise tier keeps the default (inline media only)."""
    resp = stack.post(
        chat(model="precise", messages=image("http://93.184.215.14/c.png")), stack.engine
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "remote_media_not_allowed"


@pytest.mark.parametrize("depth", [100, 990, 5000])
def test_deeply_nested_json_is_a_400_not_a_500(stack: Stack, depth: int) -> None:
    """Bodies nested past the depth limit (and past msgspec's own guard) get a clean 400."""
    raw = (
        '{"model": "fast", "messages": [{"role": "user", "content": "hi"}], "metadata": '
        + "[" * depth
        + "]" * depth
        + "}"
    )
    resp = httpx.post(
        stack.gateway.url + "/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {stack.plain}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "json_too_deep"
    assert httpx.get(stack.gateway.url + "/livez").status_code == 200


def test_ordinary_nesting_passes(stack: Stack) -> None:
    """A tool schema nested a dozen levels deep is fine."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(12):
        schema = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    assert stack.post(chat(tools=tools), stack.engine).status_code == 200
