"""The OpenAI-compatible endpoint end to end: official client, real gateway, real simulators."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.stack import FAST_SIM, PRECISE_SIM, Backends, Stack, running_stack

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello in one word."}]


def _small_limits(config: dict[str, Any], backends: Backends) -> None:
    config["server"] = {"max_body_bytes": 65536}
    config["tiers"] = tiers_config([backends.fast.url], [backends.precise.url], max_tokens_cap=1000)
    del config["telemetry"]  # the default access log, on


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """A gateway before a fast (2,048-token context) and a precise simulator, auth off, a
    small body limit and token cap."""
    fast = (*FAST_SIM, "--max-model-len", "2048")
    with running_stack(sims=(fast, PRECISE_SIM), configure=_small_limits) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> GatewayProcess:
    """The gateway of the module's stack."""
    return stack.gateway


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    """The official client pointed at the gateway."""
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def post(gateway: GatewayProcess, body: Any, **kwargs: Any) -> httpx.Response:
    """POST raw content or JSON to the chat endpoint."""
    url = gateway.url + "/v1/chat/completions"
    if isinstance(body, bytes | str):
        return httpx.post(url, content=body, timeout=10, **kwargs)
    return httpx.post(url, json=body, timeout=10, **kwargs)


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    """A non-streaming chat answer has content, usage and the gateway's headers."""
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=CHAT,
        max_tokens=8,
    )
    completion = raw.parse()
    assert raw.http_response.status_code == 200
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    headers = raw.http_response.headers
    assert headers["x-tiergate-tier"] in ("fast", "precise")
    assert headers["x-tiergate-route-reason"] == "classifier"
    assert 0.0 <= float(headers["x-tiergate-route-score"]) <= 1.0  # the classifier ran
    assert float(headers["x-tiergate-overhead-ms"]) >= 0
    assert headers["x-request-id"]


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    """A stream with include_usage ends with a usage chunk, and content arrives in chunks."""
    stream = client.chat.completions.create(
        model="fast",
        messages=CHAT,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_streaming_without_usage_hides_the_usage_chunk(gateway: GatewayProcess) -> None:
    """The gateway asks for usage itself but does not show it to a caller who did not."""
    body = {"model": "fast", "messages": CHAT, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert all('"usage":{' not in e.replace(" ", "") for e in events[:-1])


def test_completions_both_modes(client: openai.OpenAI) -> None:
    """Legacy completions work streaming and not."""
    done = client.completions.create(model="precise", prompt="Once upon a time", max_tokens=6)
    assert done.choices[0].text
    parts = list(
        client.completions.create(model="precise", prompt="Hello", max_tokens=6, stream=True)
    )
    assert "".join(p.choices[0].text for p in parts if p.choices)


def test_models_lists_auto_tiers_and_served_models(client: openai.OpenAI) -> None:
    """/v1/models lists auto, the tiers and their served models."""
    ids = {m.id for m in client.models.list()}
    assert {"auto", "fast", "precise", "tiergate-fast", "tiergate-precise"} <= ids


@pytest.mark.parametrize(
    ("model", "tier"),
    [
        ("fast", "fast"),
        ("precise", "precise"),
        ("tiergate-fast", "fast"),
        ("tiergate-precise", "precise"),
    ],
)
def test_explicit_model_forces_tier(gateway: GatewayProcess, model: str, tier: str) -> None:
    """A tier name or served model name in `model` forces that tier."""
    resp = post(gateway, {"model": model, "messages": CHAT, "max_tokens": 4})
    assert resp.status_code == 200
    assert resp.headers["x-tiergate-tier"] == tier
    assert resp.headers["x-tiergate-route-reason"] == "explicit"
    assert "x-tiergate-route-score" not in resp.headers  # no classifier ran
    assert resp.json()["model"] == f"tiergate-{tier}"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    """An unknown model is a 404 model_not_found error."""
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=CHAT)
    assert err.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "auto"}, "messages"),
        ({"model": "auto", "messages": "hi"}, "messages"),
        ({"model": "auto", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "auto", "messages": CHAT, "max_tokens": "ten"}, "max_tokens"),
        ({"model": "auto", "messages": CHAT, "stream": "yes"}, "stream"),
        ({"model": "auto", "messages": CHAT, "temperature": "hot"}, "temperature"),
        ({"model": 3, "messages": CHAT}, "model"),
        ({"messages": CHAT}, "model"),
        ({"model": "auto", "messages": CHAT, "max_tokens": 5000}, "max_tokens"),
    ],
)
def test_bad_fields_are_400_with_param(
    gateway: GatewayProcess, body: dict[str, Any], param: str
) -> None:
    """Wrong types, missing fields and max_tokens over the cap are 400 naming the param."""
    resp = post(gateway, body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null", b'"text"', b"\xff\xfe"])
def test_malformed_bodies_are_400(gateway: GatewayProcess, raw: bytes) -> None:
    """Malformed or non-object JSON gets a 400 OpenAI-shaped error, never a 500."""
    resp = post(gateway, raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_a_compressed_body_is_415_and_identity_is_served(gateway: GatewayProcess) -> None:
    """A gzipped body is refused for its encoding (415, OpenAI-shaped), not as invalid JSON; the
    connection keeps serving, and ``Content-Encoding: identity`` is an ordinary request."""
    body = json.dumps({"model": "fast", "messages": CHAT, "max_tokens": 4}).encode()
    with httpx.Client(timeout=10) as http:
        url = gateway.url + "/v1/chat/completions"
        json_type = {"content-type": "application/json"}
        resp = http.post(
            url, content=gzip.compress(body), headers={**json_type, "content-encoding": "gzip"}
        )
        assert resp.status_code == 415
        error = resp.json()["error"]
        assert error["code"] == "unsupported_content_encoding"
        assert "gzip" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        again = http.post(url, content=body, headers={**json_type, "content-encoding": "identity"})
        assert again.status_code == 200


def test_oversized_body_is_413(gateway: GatewayProcess) -> None:
    """A body over the configured limit is refused with 413 before it is forwarded."""
    big = {"model": "auto", "messages": [{"role": "user", "content": "x" * 70000}]}
    resp = post(gateway, json.dumps(big))
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


def test_upstream_4xx_is_passed_through(gateway: GatewayProcess) -> None:
    """vLLM's context-length 400 reaches the caller with its status and message."""
    long_prompt = "word " * 3000
    resp = post(gateway, {"model": "fast", "messages": [{"role": "user", "content": long_prompt}]})
    assert resp.status_code == 400
    assert "maximum context length" in resp.json()["error"]["message"]


def test_sampling_extras_are_forwarded_and_steering_fields_dropped(
    gateway: GatewayProcess, stack: Stack
) -> None:
    """Documented sampling extras reach the backend untouched; api_base and friends never do."""
    body = {
        "model": "fast",
        "messages": CHAT,
        "max_tokens": 3,
        "top_k": 7,
        "min_p": 0.1,
        "api_base": "http://evil.example",
        "api_key": "k",
    }
    assert post(gateway, body).status_code == 200
    seen = stack.fast.stats()["last_request"]
    assert seen["top_k"] == 7
    assert seen["min_p"] == 0.1
    assert "api_base" not in seen
    assert "api_key" not in seen
    assert seen["model"] == "tiergate-fast"


def test_request_id_is_echoed(gateway: GatewayProcess) -> None:
    """The caller's x-request-id comes back on success and on errors."""
    ok = post(gateway, {"model": "fast", "messages": CHAT}, headers={"x-request-id": "abc-123"})
    bad = post(gateway, {"model": "nope", "messages": CHAT}, headers={"x-request-id": "abc-124"})
    assert ok.headers["x-request-id"] == "abc-123"
    assert bad.headers["x-request-id"] == "abc-124"
    assert bad.status_code == 404
    # Every refusal of the endpoint, before or after routing, carries both headers.
    refusals = [
        post(gateway, b"{not json", headers={"x-request-id": "r1"}),
        post(gateway, {"model": "fast", "messages": "x"}, headers={"x-request-id": "r2"}),
        post(gateway, b"{}", headers={"x-request-id": "r3", "content-encoding": "br"}),
        post(
            gateway,
            {"model": "fast", "messages": CHAT, "max_tokens": 10**6},
            headers={"x-request-id": "r4"},
        ),
    ]
    assert [r.status_code for r in refusals] == [400, 400, 415, 400]
    for number, resp in enumerate(refusals, start=1):
        assert resp.headers["x-request-id"] == f"r{number}"
        assert float(resp.headers["x-tiergate-overhead-ms"]) >= 0


def test_only_allowlisted_paths_exist(gateway: GatewayProcess) -> None:
    """vLLM's admin endpoints are not reachable through the gateway."""
    for path in ("/pause", "/abort_requests", "/update_weights", "/invocations", "/tokenize"):
        resp = httpx.post(gateway.url + path, json={}, timeout=5)
        assert resp.status_code in (404, 405)
        assert "error" in resp.json()


def test_health_endpoints(gateway: GatewayProcess) -> None:
    """/livez is always up; /readyz is ready when every tier has a healthy replica."""
    assert httpx.get(gateway.url + "/livez").status_code == 200
    ready = httpx.get(gateway.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["tiers"] == {"fast": True, "precise": True}
    for path in ("/livez", "/readyz"):  # load balancers that probe with HEAD get the head only
        head = httpx.head(gateway.url + path)
        assert head.status_code == 200
        assert head.content == b""


def test_upstream_unreachable_is_clear_5xx(stack: Stack) -> None:
    """A tier whose only replica is down answers 502/503 with a clear message, not a 500."""
    # A bound but non-listening socket: connections are refused and nobody else gets the port.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{holder.getsockname()[1]}"
        config = {
            "auth": {"enabled": False},
            "tiers": tiers_config([stack.fast.url], [dead]),
        }
        with GatewayProcess(config) as gw:
            resp = post(gw, {"model": "precise", "messages": CHAT})
            assert resp.status_code in (502, 503)
            assert "precise" in resp.json()["error"]["message"]
            assert httpx.get(gw.url + "/readyz").status_code == 503


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/responses", "/v1/audio/speech"])
def test_other_v1_paths_are_an_openai_shaped_404(gateway: GatewayProcess, path: str) -> None:
    """README: a `/v1/` path the gateway does not serve is refused with OpenAI's 404 shape
    (nothing is proxied: the body names the gateway's refusal, not a backend's)."""
    resp = httpx.post(gateway.url + path, json={"model": "fast", "input": "x"}, timeout=5)
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "not_found"
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/chat/completions"), ("GET", "/v1/completions"), ("DELETE", "/v1/models/fast")],
)
def test_a_wrong_method_on_a_served_path_is_405(
    gateway: GatewayProcess, method: str, path: str
) -> None:
    """README: another method on a served path is 405, in OpenAI's error shape."""
    resp = httpx.request(method, gateway.url + path, timeout=5)
    assert resp.status_code == 405
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


def test_only_the_inference_endpoints_carry_the_gateways_headers(gateway: GatewayProcess) -> None:
    """docs/api.md: /v1/models, health, metrics, admin and unknown paths carry no x-request-id,
    x-tiergate-* or x-ratelimit-* header; an inference answer carries its own."""
    answered = post(gateway, {"model": "fast", "messages": CHAT, "max_tokens": 4})
    assert answered.status_code == 200
    assert {"x-request-id", "x-tiergate-overhead-ms", "x-tiergate-tier"} <= set(answered.headers)
    assert {"x-tiergate-route-reason", "x-tiergate-attempts"} <= set(answered.headers)
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/fast"),
        ("GET", "/livez"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/admin/backends"),
        ("POST", "/v1/embeddings"),
    ]:
        resp = httpx.request(method, gateway.url + path, timeout=5)
        ours = [
            name
            for name in resp.headers
            if name == "x-request-id" or name.startswith(("x-tiergate-", "x-ratelimit-"))
        ]
        assert ours == [], (path, resp.status_code, ours)
